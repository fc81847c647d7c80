"""Runs the vendored upstream Python models in-process, the way Triton's Python backend stub does.

The pure-Python half of ``triton_python_backend_utils`` is the vendored r25.10 file itself
(``vendor/python_backend-r25.10``). Its C++ half — the classes the stub injects into that
module (python_backend r25.10 ``src/pb_stub.cc`` lines 452-469: ``TritonError``,
``TritonModelException``, ``Tensor``, ``InferenceRequest``, ``InferenceResponse``,
``Logger``) — is written here, with the signatures of their pybind11 bindings (same file,
lines 1651-1816): ``InferenceRequest(request_id="", ..., inputs, requested_output_names,
model_name, ...)``, ``.exec(decoupled=False)`` returning one response or, decoupled, an
iterator of responses; ``InferenceResponse(output_tensors=[], error=None)``;
``InferenceResponseSender.send(response=None, flags=0)``.

``exec`` routes to the models registered on a :class:`ModelHost` (the real preprocessing and
postprocessing, or a stand-in for the C++ ``tensorrt_llm`` backend). A decoupled iterator
stops after the response sent with ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from google.protobuf import json_format

VENDOR = Path(__file__).resolve().parent / "vendor"
RELEASES = {
    "v0.19.0": VENDOR / "tensorrtllm_backend-v0.19.0" / "all_models" / "inflight_batcher_llm",
    "v0.18.2": VENDOR / "tensorrtllm_backend-v0.18.2" / "all_models" / "inflight_batcher_llm",
}
COMPLETE_FINAL = 1
_ALWAYS_PRINT = (
    {"always_print_fields_with_no_presence": True}
    if "always_print_fields_with_no_presence" in json_format.MessageToDict.__code__.co_varnames
    else {"including_default_value_fields": True}
)


class TritonError:
    def __init__(self, message: str, code: int = 0) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class TritonModelException(Exception):
    def message(self) -> str:
        return str(self)


class Tensor:
    def __init__(self, name: str, array: Any) -> None:
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def is_cpu(self) -> bool:
        return True

    def shape(self) -> list[int]:
        return list(self._array.shape)

    @classmethod
    def from_dlpack(cls, name: str, capsule: Any) -> Tensor:
        import torch.utils.dlpack

        return cls(name, torch.utils.dlpack.from_dlpack(capsule).numpy())


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None, parameters=None) -> None:
        self._tensors = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


class Logger:
    lines: ClassVar[list[tuple[str, str]]] = []

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.lines.append(("error", message))

    log_warn = log_info = log_verbose = log_error


@dataclass
class ResponseSender:
    """What a decoupled model sent: ``(response or None, flags)`` in order."""

    sent: list[tuple[InferenceResponse | None, int]] = field(default_factory=list)

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self.sent and self.sent[-1][1] & COMPLETE_FINAL:
            raise TritonModelException("response sender already closed")
        self.sent.append((response, flags))

    def is_cancelled(self) -> bool:
        return False


class InferenceRequest:
    host: ModelHost | None = None

    def __init__(self, request_id: str = "", correlation_id: Any = 0, inputs: list[Tensor] | None = None,
                 requested_output_names: list[str] | None = None, model_name: str = "", model_version: int = -1,
                 flags: int = 0, timeout: int = 0, preferred_memory: Any = None, trace: Any = None,
                 parameters: Any = None) -> None:
        self._id = request_id
        self._inputs = list(inputs or [])
        self.requested_output_names = list(requested_output_names or [])
        self.model_name = model_name
        self.sender = ResponseSender()

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def get_response_sender(self) -> ResponseSender:
        return self.sender

    def is_cancelled(self) -> bool:
        return False

    def exec(self, decoupled: bool = False):
        assert InferenceRequest.host is not None, "no ModelHost installed"
        return InferenceRequest.host.run(self, decoupled=decoupled)


def install_pb_utils() -> types.ModuleType:
    """Import the vendored ``triton_python_backend_utils`` and inject the classes above, as pb_stub.cc does."""
    module = sys.modules.get("triton_python_backend_utils")
    if module is None:
        spec = importlib.util.spec_from_file_location(
            "triton_python_backend_utils", VENDOR / "python_backend-r25.10" / "triton_python_backend_utils.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["triton_python_backend_utils"] = module
    for name, value in {"TritonError": TritonError, "TritonModelException": TritonModelException, "Tensor": Tensor,
                        "InferenceRequest": InferenceRequest, "InferenceResponse": InferenceResponse,
                        "Logger": Logger}.items():
        setattr(module, name, value)
    # Image inputs only: the release imports them at module level; text requests never touch them.
    for optional in ("PIL", "requests"):
        if optional not in sys.modules and importlib.util.find_spec(optional) is None:
            sys.modules[optional] = types.ModuleType(optional)
            if optional == "PIL":
                sys.modules[optional].Image = sys.modules["PIL.Image"] = types.ModuleType("PIL.Image")
    return module


def model_args(config_pbtxt: Path) -> dict[str, str]:
    """``initialize()``'s args: the model config as Triton core writes it for the Python backend.

    core r25.10 ``src/model_config_utils.cc`` ``ModelConfigToJson`` (lines 2138-2200): proto
    field names, primitive fields always printed (an empty ``string_value`` is ``""``, not
    absent), int64 ``dims`` as numbers.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse(config_pbtxt.read_text(), mc.ModelConfig())
    as_dict = json_format.MessageToDict(config, preserving_proto_field_name=True, **_ALWAYS_PRINT)
    for section in ("input", "output"):
        for tensor in as_dict.get(section, []):
            tensor["dims"] = [int(d) for d in tensor.get("dims", [])]
    return {"model_config": json.dumps(as_dict), "model_name": config.name, "model_version": "1",
            "model_repository": str(config_pbtxt.parent), "model_instance_kind": "CPU"}


def load_model(model_dir: Path) -> Any:
    """A fresh ``TritonPythonModel`` from ``<model_dir>/1/model.py`` (its own ``lib`` package on the path)."""
    install_pb_utils()
    version_dir = model_dir / "1"
    for name in [m for m in sys.modules if m == "lib" or m.startswith("lib.")]:
        del sys.modules[name]  # the BLS imports its helpers as top-level "lib"
    sys.path.insert(0, str(version_dir))
    try:
        spec = importlib.util.spec_from_file_location(f"upstream_{model_dir.name}_{id(model_dir)}", version_dir / "model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(version_dir))
    return module.TritonPythonModel()


Backend = Callable[[InferenceRequest], Iterator[InferenceResponse]]


class ModelHost:
    """Routes BLS ``exec`` calls: Python models run their ``execute``; others are generator functions."""

    def __init__(self) -> None:
        self.python_models: dict[str, Any] = {}
        self.backends: dict[str, Backend] = {}
        self.calls: list[InferenceRequest] = []

    def install(self) -> None:
        install_pb_utils()
        InferenceRequest.host = self

    def run(self, request: InferenceRequest, *, decoupled: bool):
        self.calls.append(request)
        if request.model_name in self.python_models:
            (response,) = self.python_models[request.model_name].execute([request])
            return iter([response]) if decoupled else response
        responses = self.backends[request.model_name](request)
        return responses if decoupled else next(iter(responses))
