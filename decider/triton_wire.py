"""The wire contract between the decider's Triton client and the served model: tensors, parameters, checks.

The client (``decider/triton.py``) speaks it; the repository generator (``engine_build``)
imports it from here to check what it writes — never the other way round.

Names follow the served release. The BLS model of tensorrtllm_backend v0.19.0 declares
``random_seed`` and ``min_length`` (``all_models/inflight_batcher_llm/tensorrt_llm_bls/
config.pbtxt`` lines 137 and 155 of that tag); later releases renamed them ``seed`` and
``min_tokens``. A :class:`TensorSpec` lists every name a logical input has had, and
:func:`resolve_profile` picks, from the served config, the one this server takes.

Stream semantics this contract relies on (Triton server v2.62.0 = 25.10,
``src/grpc/stream_infer_handler.cc``):

- lines 763-767: a decoupled model's *empty* final response (flags only, as the BLS sends it
  after its data responses, ``tensorrt_llm_bls/1/model.py`` lines 224-225 of v0.19.0) is
  forwarded to the client only when the request sets ``triton_enable_empty_final_response``
  (a bool parameter, ``src/grpc/infer_handler.cc`` lines 361-372). Without it the client never
  sees the end of a BLS stream. :data:`ENABLE_EMPTY_FINAL` is sent on every request.
- line 791: every forwarded response carries ``triton_final_response`` = whether it is the last.
- lines 397-402: a request that fails before reaching the model gets one error response with
  only the request id (no parameters): it is terminal for that request.
- lines 728-734 and 783-791: a model's error response is forwarded with the request id and
  ``triton_final_response=false`` when the model sends it without the final flag (the BLS
  does: its empty final follows, ``tensorrt_llm_bls/1/model.py`` lines 228-237 of v0.19.0).

TensorRT-LLM decodes *without* the schema, silently, when the guide inputs are not wired
through, the guide type is unknown, or ``guided_decoding_backend`` / the tokenizer info is
unset (``inflight_batcher_llm/src/model_instance_state.cc`` lines 420-425 of v0.19.0):
:func:`guided_decoding_problems` names each of those.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

__all__ = [
    "CLIENT_INPUTS",
    "CLIENT_OUTPUTS",
    "ENABLE_EMPTY_FINAL",
    "FINAL_RESPONSE",
    "GUIDED_DECODING_BACKEND",
    "GUIDE_TYPES",
    "GUIDE_TYPE_EBNF",
    "GUIDE_TYPE_JSON_SCHEMA",
    "PLACEHOLDER",
    "WIRE_DTYPES",
    "TensorSpec",
    "WireProfile",
    "blames_request",
    "decoder_model_name",
    "entry_problems",
    "error_summary",
    "guided_decoding_problems",
    "parameter",
    "resolve_profile",
    "wire_dtype",
]

GUIDE_TYPE_JSON_SCHEMA = "json_schema"
#: What a native tool format's structural tag travels as (no release's Triton backend takes a structural tag).
GUIDE_TYPE_EBNF = "ebnf_grammar"
#: Guide types the TensorRT-LLM backend accepts; anything else is dropped (unconstrained output).
GUIDE_TYPES = frozenset({"json", "json_schema", "regex", "ebnf_grammar"})
#: The only guided-decoding backend the C++ runtime accepts.
GUIDED_DECODING_BACKEND = "xgrammar"
PLACEHOLDER = re.compile(r"\$\{[^}]*\}")
#: Request parameter: forward the decoupled model's empty final response (see the module docstring).
ENABLE_EMPTY_FINAL = "triton_enable_empty_final_response"
#: Response parameter: this is the request's last response.
FINAL_RESPONSE = "triton_final_response"

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
    #: The names other releases give this input (``random_seed`` for ``seed`` up to v0.19.0).
    aliases: tuple[str, ...] = ()
    #: Sent only when the served model declares it (a capability, not a requirement).
    if_declared: bool = False

    @property
    def wire(self) -> str:
        return wire_dtype(self.data_type)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


#: What ``decider/triton.py`` sends, per request, as a batch of one (logical names).
CLIENT_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", mc.TYPE_STRING, (1,)),
    TensorSpec("max_tokens", mc.TYPE_INT32, (1,)),
    TensorSpec("stream", mc.TYPE_BOOL, (1,)),
    TensorSpec("exclude_input_in_output", mc.TYPE_BOOL, (1,)),
    TensorSpec("temperature", mc.TYPE_FP32, (1,)),
    TensorSpec("top_p", mc.TYPE_FP32, (1,)),
    TensorSpec("seed", mc.TYPE_UINT64, (1,), always=False, aliases=("random_seed",)),
    TensorSpec("stop_words", mc.TYPE_STRING, (-1,), always=False),
    TensorSpec("guided_decoding_guide_type", mc.TYPE_STRING, (1,), always=False),
    TensorSpec("guided_decoding_guide", mc.TYPE_STRING, (1,), always=False),
    # The BLS forwards the executor's per-step log probs (shape [1, beams, new tokens]:
    # model_instance_state.cc lines 1176-1196 of v0.19.0); their count is how the client tells
    # a generation cut at max_tokens ("length") from one that ended ("stop").
    TensorSpec("return_log_probs", mc.TYPE_BOOL, (1,), always=False, if_declared=True),
)
#: What it reads back: always ``text_output``; the others when the served model declares them.
CLIENT_OUTPUTS: tuple[TensorSpec, ...] = (TensorSpec("text_output", mc.TYPE_STRING, (-1,)),)
FINISH_REASON_OUTPUT = "finish_reason"
LOG_PROBS_OUTPUT = "output_log_probs"

_GUIDE_INPUTS = ("guided_decoding_guide_type", "guided_decoding_guide")
_TRUE = frozenset({"true", "yes", "1", "t"})


def parameter(config: mc.ModelConfig, key: str) -> str | None:
    """A string parameter of a model config, or None."""
    return config.parameters[key].string_value if key in config.parameters else None


@dataclass(frozen=True)
class WireProfile:
    """How to talk to one served entry model, read from its config."""

    #: logical input name → the name the served model declares.
    input_names: Mapping[str, str] = field(default_factory=dict)
    #: ``text_output`` is the whole text so far (BLS ``accumulate_tokens``), not a delta.
    cumulative_text: bool = False
    #: The model says why it stopped (toolrail's LLM-API model).
    finish_output: str | None = None
    #: The model returns per-step log probs: count generated tokens from them.
    count_tokens: bool = False


def resolve_profile(config: mc.ModelConfig) -> WireProfile:
    """The served model's names and features, for the client's encoder and decoder."""
    declared = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    names: dict[str, str] = {}
    for spec in CLIENT_INPUTS:
        served = next((name for name in spec.names if name in declared), None)
        if served is not None:
            names[spec.name] = served
    accumulate = (parameter(config, "accumulate_tokens") or "").lower() in _TRUE
    finish = FINISH_REASON_OUTPUT if FINISH_REASON_OUTPUT in outputs else None
    count = finish is None and LOG_PROBS_OUTPUT in outputs and "return_log_probs" in names
    if not count:
        names.pop("return_log_probs", None)
    return WireProfile(input_names=names, cumulative_text=accumulate, finish_output=finish, count_tokens=count)


def entry_problems(config: mc.ModelConfig) -> list[str]:
    """How the entry model's config disagrees with what the client sends and reads."""
    problems: list[str] = []
    declared = {tensor.name: tensor for tensor in config.input}
    sent: set[str] = set()
    for spec in CLIENT_INPUTS:
        name = next((n for n in spec.names if n in declared), None)
        if name is None:
            if not spec.if_declared:
                problems.append(f"input {' / '.join(repr(n) for n in spec.names)} is not declared")
            continue
        sent.add(name)
        tensor = declared[name]
        if tensor.data_type != spec.data_type:
            problems.append(
                f"input {name!r} is {mc.DataType.Name(tensor.data_type)}, the client sends "
                f"{mc.DataType.Name(spec.data_type)}"
            )
        if tuple(tensor.dims) != spec.dims:
            problems.append(f"input {name!r} has dims {list(tensor.dims)}, the client sends {list(spec.dims)}")
        if not spec.always and not tensor.optional:
            problems.append(f"input {name!r} must be optional: the client sends it only when used")
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
    if named and not PLACEHOLDER.search(named):
        return named
    if named == "" and parameter(config, "accumulate_tokens") is not None:
        # The BLS defaults an empty name to "tensorrt_llm" (tensorrt_llm_bls/1/model.py, get_valid_param_value).
        return "tensorrt_llm"
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


# --------------------------------------------------------------------------- server errors

#: Exception types, as the BLS prints them on the last line of its traceback
#: (``tensorrt_llm_bls/1/model.py`` line 232 of v0.19.0 sends ``traceback.format_exc()``),
#: that blame the request: ``lib/decode.py``'s ``RequestValidationError`` and argument errors.
_REQUEST_FAULT_TYPES = ("RequestValidationError", "ValueError", "TypeError", "KeyError", "AttributeError")
#: Triton core's own request checks (``src/grpc`` and core ``infer_request.cc``) and the
#: TensorRT-LLM executor's request checks, on the summary line only.
_REQUEST_FAULT_PATTERNS = re.compile(
    r"unexpected (shape|datatype|inference input)|expected \d+ inputs|must be <=|batch-size must be"
    r"|exceeds|too long|invalid (argument|value|guide)|unknown guide|not supported|unsupported",
    re.IGNORECASE,
)


def error_summary(message: str) -> str:
    """The line of a server error that says what went wrong (a traceback's last line)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def blames_request(message: str) -> bool:
    """Whether a server error is the request's fault (permanent) rather than the server's (retryable).

    Only the summary line counts: a traceback names files and functions whose words
    ("invalid", "expected", "unknown") say nothing about the error.
    """
    summary = error_summary(message)
    exception_type = summary.split(":", 1)[0].rsplit(".", 1)[-1] if ":" in summary else ""
    if exception_type in _REQUEST_FAULT_TYPES:
        return True
    return bool(_REQUEST_FAULT_PATTERNS.search(summary))

