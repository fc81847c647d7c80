"""What the decider's Triton client sends, and checks of Triton model configs against it.

One table (:data:`CLIENT_INPUTS`, :data:`CLIENT_OUTPUTS`) is shared by the config
generator, the decider's Triton backend (``decider/triton.py``) and the tests, so the
three cannot drift. TensorRT-LLM silently decodes *without* the constraint when the guide
inputs are not wired through, the guide type is unknown, or ``guided_decoding_backend`` /
the tokenizer info is unset: :func:`guided_decoding_problems` names each of those.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from engine_build.errors import ConfigCheckError

__all__ = [
    "CLIENT_INPUTS",
    "CLIENT_OUTPUTS",
    "GUIDED_DECODING_BACKEND",
    "GUIDE_TYPES",
    "GUIDE_TYPE_JSON_SCHEMA",
    "PLACEHOLDER",
    "TensorSpec",
    "WIRE_DTYPES",
    "decoder_model_name",
    "entry_problems",
    "guided_decoding_problems",
    "load_repository",
    "parameter",
    "parse_config",
    "request_problems",
    "require_servable",
    "wire_dtype",
]

GUIDE_TYPE_JSON_SCHEMA = "json_schema"
#: Guide types the TensorRT-LLM backend accepts; anything else is dropped (unconstrained output).
GUIDE_TYPES = frozenset({"json", "json_schema", "regex", "ebnf_grammar"})
#: The only guided-decoding backend the C++ runtime accepts.
GUIDED_DECODING_BACKEND = "xgrammar"
PLACEHOLDER = re.compile(r"\$\{[^}]*\}")

#: model_config data type → KServe wire datatype.
WIRE_DTYPES: dict[int, str] = {
    mc.TYPE_BOOL: "BOOL",
    mc.TYPE_UINT8: "UINT8",
    mc.TYPE_UINT64: "UINT64",
    mc.TYPE_INT32: "INT32",
    mc.TYPE_INT64: "INT64",
    mc.TYPE_FP16: "FP16",
    mc.TYPE_FP32: "FP32",
    mc.TYPE_STRING: "BYTES",
}


def wire_dtype(data_type: int) -> str:
    """The wire datatype (``BYTES``, ``INT32`` …) of a ``model_config_pb2.DataType``."""
    return WIRE_DTYPES.get(data_type) or mc.DataType.Name(data_type).removeprefix("TYPE_")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the client's interface (dims exclude the batch dimension)."""

    name: str
    data_type: int
    dims: tuple[int, ...]
    #: Sent on every request; the others only when the request uses them.
    always: bool = True

    @property
    def wire(self) -> str:
        return wire_dtype(self.data_type)


#: What ``decider/triton.py`` sends, per request, as a batch of one.
CLIENT_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", mc.TYPE_STRING, (1,)),
    TensorSpec("max_tokens", mc.TYPE_INT32, (1,)),
    TensorSpec("stream", mc.TYPE_BOOL, (1,)),
    TensorSpec("exclude_input_in_output", mc.TYPE_BOOL, (1,)),
    TensorSpec("temperature", mc.TYPE_FP32, (1,)),
    TensorSpec("top_p", mc.TYPE_FP32, (1,)),
    TensorSpec("seed", mc.TYPE_UINT64, (1,), always=False),
    TensorSpec("stop_words", mc.TYPE_STRING, (-1,), always=False),
    TensorSpec("guided_decoding_guide_type", mc.TYPE_STRING, (1,), always=False),
    TensorSpec("guided_decoding_guide", mc.TYPE_STRING, (1,), always=False),
)
#: What it reads back.
CLIENT_OUTPUTS: tuple[TensorSpec, ...] = (TensorSpec("text_output", mc.TYPE_STRING, (-1,)),)

_GUIDE_INPUTS = ("guided_decoding_guide_type", "guided_decoding_guide")


def parse_config(text: str) -> mc.ModelConfig:
    """Parse ``config.pbtxt`` text into Triton's ``ModelConfig``; refuses unfilled ``${...}``."""
    leftover = PLACEHOLDER.findall(text)
    if leftover:
        raise ConfigCheckError("?", [f"unfilled template parameters: {sorted(set(leftover))}"])
    return text_format.Parse(text, mc.ModelConfig())


def load_repository(root: Path) -> dict[str, mc.ModelConfig]:
    """Every ``<model>/config.pbtxt`` of a model repository, parsed."""
    configs = {}
    for path in sorted(root.glob("*/config.pbtxt")):
        configs[path.parent.name] = parse_config(path.read_text())
    return configs


def parameter(config: mc.ModelConfig, key: str) -> str | None:
    """A string parameter of a model config, or None."""
    return config.parameters[key].string_value if key in config.parameters else None


def _dims_match(declared: Sequence[int], sent: Sequence[int]) -> bool:
    return len(declared) == len(sent) and all(d == -1 or d == s for d, s in zip(declared, sent))


def entry_problems(config: mc.ModelConfig) -> list[str]:
    """How the entry model's config disagrees with what the client sends and reads."""
    problems: list[str] = []
    declared = {tensor.name: tensor for tensor in config.input}
    sent = {spec.name for spec in CLIENT_INPUTS}
    for spec in CLIENT_INPUTS:
        tensor = declared.get(spec.name)
        if tensor is None:
            problems.append(f"input {spec.name!r} is not declared")
            continue
        if tensor.data_type != spec.data_type:
            problems.append(
                f"input {spec.name!r} is {mc.DataType.Name(tensor.data_type)}, the client sends "
                f"{mc.DataType.Name(spec.data_type)}"
            )
        if tuple(tensor.dims) != spec.dims:
            problems.append(f"input {spec.name!r} has dims {list(tensor.dims)}, the client sends {list(spec.dims)}")
        if not spec.always and not tensor.optional:
            problems.append(f"input {spec.name!r} must be optional: the client sends it only when used")
    for name, tensor in declared.items():
        if name not in sent and not tensor.optional:
            problems.append(f"input {name!r} is required but the client never sends it")
    outputs = {tensor.name: tensor for tensor in config.output}
    for spec in CLIENT_OUTPUTS:
        tensor = outputs.get(spec.name)
        if tensor is None:
            problems.append(f"output {spec.name!r} is not declared")
        elif tensor.data_type != spec.data_type:
            problems.append(f"output {spec.name!r} is {mc.DataType.Name(tensor.data_type)}")
    if config.max_batch_size < 1:
        problems.append("max_batch_size must be >= 1: the client sends a batch dimension")
    if not config.model_transaction_policy.decoupled and config.platform != "ensemble":
        problems.append("decoupled mode is off: streaming needs model_transaction_policy { decoupled: true }")
    return problems


def decoder_model_name(configs: Mapping[str, mc.ModelConfig], entry: str) -> str:
    """The model that runs the decoder (and so owns the guided-decoding settings) behind ``entry``."""
    config = configs[entry]
    if parameter(config, "guided_decoding_backend") is not None:
        return entry
    named = parameter(config, "tensorrt_llm_model_name")
    if named:
        return named
    if not config.ensemble_scheduling.step:
        # A model that names no other model decodes itself (the LLM-API model).
        return entry
    for step in config.ensemble_scheduling.step:
        if step.model_name in configs and "guided_decoding_backend" in configs[step.model_name].parameters:
            return step.model_name
    return "tensorrt_llm"


def guided_decoding_problems(configs: Mapping[str, mc.ModelConfig], entry: str) -> list[str]:
    """Every way the repository would decode without the schema constraint."""
    problems: list[str] = []
    if entry not in configs:
        return [f"model {entry!r} is not served"]
    config = configs[entry]
    declared = {tensor.name for tensor in config.input}
    for name in _GUIDE_INPUTS:
        if name not in declared:
            problems.append(f"{entry}: input {name!r} is not declared")
    if config.ensemble_scheduling.step:
        routed = {value for step in config.ensemble_scheduling.step for value in step.input_map.values()}
        for name in _GUIDE_INPUTS:
            if name not in routed:
                problems.append(f"{entry}: ensemble does not route {name!r} to any step")
    decoder = decoder_model_name(configs, entry)
    if decoder not in configs:
        problems.append(f"decoder model {decoder!r} is not served")
        return problems
    dconfig = configs[decoder]
    backend = parameter(dconfig, "guided_decoding_backend")
    if backend != GUIDED_DECODING_BACKEND:
        problems.append(f"{decoder}: guided_decoding_backend is {backend!r}, needs {GUIDED_DECODING_BACKEND!r}")
    if dconfig.backend == "tensorrtllm":
        path = parameter(dconfig, "xgrammar_tokenizer_info_path")
        if not path or PLACEHOLDER.search(path):
            problems.append(f"{decoder}: xgrammar_tokenizer_info_path is unset (the C++ backend skips guided decoding)")
        decoupled = parameter(dconfig, "decoupled_mode")
        if not dconfig.model_transaction_policy.decoupled:
            problems.append(f"{decoder}: decoupled mode is off")
        if decoupled is not None and decoupled.lower() != "true":
            problems.append(f"{decoder}: decoupled_mode parameter is {decoupled!r}")
    elif dconfig.backend == "python" and decoder != entry:
        tokenizer_dir = parameter(dconfig, "tokenizer_dir")
        if not tokenizer_dir or PLACEHOLDER.search(tokenizer_dir):
            problems.append(f"{decoder}: tokenizer_dir is unset (the python backend needs it for guided decoding)")
    if decoder != entry:
        ddeclared = {tensor.name for tensor in dconfig.input}
        for name in _GUIDE_INPUTS:
            if name not in ddeclared:
                problems.append(f"{decoder}: input {name!r} is not declared")
    return problems


def require_servable(configs: Mapping[str, mc.ModelConfig], entry: str) -> None:
    """Raise :class:`ConfigCheckError` unless ``entry`` takes the client's tensors with guided decoding on."""
    if entry not in configs:
        raise ConfigCheckError(entry, [f"model {entry!r} is not in the repository"])
    problems = entry_problems(configs[entry]) + guided_decoding_problems(configs, entry)
    if problems:
        raise ConfigCheckError(entry, problems)


def request_problems(config: mc.ModelConfig, tensors: Mapping[str, tuple[str, Sequence[int]]]) -> list[str]:
    """How one request's tensors ``{name: (wire datatype, shape)}`` disagree with ``config`` (exactly)."""
    problems: list[str] = []
    declared = {tensor.name: tensor for tensor in config.input}
    batched = config.max_batch_size > 0
    for name, (datatype, shape) in tensors.items():
        tensor = declared.get(name)
        if tensor is None:
            problems.append(f"unexpected input {name!r}")
            continue
        if datatype != wire_dtype(tensor.data_type):
            problems.append(f"input {name!r}: datatype {datatype}, expected {wire_dtype(tensor.data_type)}")
        dims = list(shape)
        if batched:
            if not dims or not 1 <= dims[0] <= config.max_batch_size:
                problems.append(f"input {name!r}: batch dimension of shape {list(shape)} outside 1..{config.max_batch_size}")
                continue
            dims = dims[1:]
        if not _dims_match(tensor.dims, dims):
            problems.append(f"input {name!r}: shape {list(shape)} does not match dims {list(tensor.dims)}")
    for name, tensor in declared.items():
        if not tensor.optional and name not in tensors:
            problems.append(f"missing required input {name!r}")
    return problems
