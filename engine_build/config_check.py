"""Checks of a Triton model repository on disk against the decider's wire contract.

The contract itself (tensor table, parameters, guided-decoding checks) lives beside the
client that speaks it, in ``decider/triton_wire.py``; the build side imports it from there
and re-exports it here for its own callers. This module adds what only the build side
needs: parsing ``config.pbtxt`` files and checking one request's tensors against a config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from decider.triton_wire import (
    CLIENT_INPUTS,
    CLIENT_OUTPUTS,
    GUIDE_TYPE_JSON_SCHEMA,
    GUIDE_TYPES,
    GUIDED_DECODING_BACKEND,
    PLACEHOLDER,
    WIRE_DTYPES,
    TensorSpec,
    decoder_model_name,
    entry_problems,
    guided_decoding_problems,
    parameter,
    wire_dtype,
)
from engine_build.errors import ConfigCheckError

__all__ = [
    "CLIENT_INPUTS",
    "CLIENT_OUTPUTS",
    "GUIDED_DECODING_BACKEND",
    "GUIDE_TYPES",
    "GUIDE_TYPE_JSON_SCHEMA",
    "PLACEHOLDER",
    "WIRE_DTYPES",
    "TensorSpec",
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


def _dims_match(declared: Sequence[int], sent: Sequence[int]) -> bool:
    return len(declared) == len(sent) and all(d == -1 or d == s for d, s in zip(declared, sent))


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
