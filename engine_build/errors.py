"""Engine-build errors.

    EngineBuildError
    ├── MissingRequirementError      something the build needs is absent (CLI exit code 2)
    │   ├── TensorRTLLMNotInstalledError
    │   └── NoGPUError
    ├── PlanError                    the requested build cannot be planned as given
    │   ├── UnknownGPUError          (carries ``name`` and ``known``)
    │   ├── UnsupportedVersionError  (carries ``version`` and ``reason``)
    │   ├── UnknownModelFamilyError  (carries ``model_type``)
    │   └── DoesNotFitError          the build cannot fit its GPU or its task (carries ``numbers``)
    ├── BuildStepError               a build step failed (carries ``step``, ``returncode``, ``log_path``)
    ├── TokenizerInfoError           the tokenizer cannot be described for xgrammar
    └── ConfigCheckError             a Triton model config does not match what the client sends
                                     (carries ``model`` and ``problems``)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from toolrail.errors import ToolrailError

__all__ = [
    "BuildStepError",
    "ConfigCheckError",
    "DoesNotFitError",
    "EngineBuildError",
    "MissingRequirementError",
    "NoGPUError",
    "PlanError",
    "TensorRTLLMNotInstalledError",
    "TokenizerInfoError",
    "UnknownGPUError",
    "UnknownModelFamilyError",
    "UnsupportedVersionError",
]


class EngineBuildError(ToolrailError):
    """Base class of every engine-build error."""

    type = "engine_build_error"


class MissingRequirementError(EngineBuildError):
    """A tool, package or device the command needs is not available here."""

    def __init__(self, what: str, hint: str = "") -> None:
        self.what = what
        self.hint = hint
        super().__init__(f"missing: {what}" + (f" ({hint})" if hint else ""))


class TensorRTLLMNotInstalledError(MissingRequirementError):
    """``tensorrt_llm`` (or its ``trtllm-build`` command) cannot be found."""


class NoGPUError(MissingRequirementError):
    """No NVIDIA GPU (or no ``nvidia-smi``), or not the GPU the plan targets."""


class PlanError(EngineBuildError):
    """The requested build cannot be planned."""


class UnknownGPUError(PlanError):
    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = tuple(sorted(known))
        super().__init__(f"unknown GPU {name!r}; known: {', '.join(self.known)}")


class UnsupportedVersionError(PlanError):
    def __init__(self, version: str, reason: str) -> None:
        self.version = version
        self.reason = reason
        super().__init__(f"TensorRT-LLM {version}: {reason}")


class UnknownModelFamilyError(PlanError):
    def __init__(self, model_type: str, known: Iterable[str] = ()) -> None:
        self.model_type = model_type
        self.known = tuple(sorted(known))
        super().__init__(
            f"no convert_checkpoint recipe for model_type {model_type!r}"
            + (f"; known: {', '.join(self.known)}" if self.known else "")
        )


class DoesNotFitError(PlanError):
    """Weights, KV cache and processes do not fit the GPU or the task's host memory."""

    def __init__(self, message: str, numbers: dict[str, Any]) -> None:
        self.numbers = numbers
        super().__init__(message)


class BuildStepError(EngineBuildError):
    def __init__(self, step: str, returncode: int, log_path: Path | None = None) -> None:
        self.step = step
        self.returncode = returncode
        self.log_path = log_path
        where = f"; log: {log_path}" if log_path else ""
        super().__init__(f"build step {step!r} failed with exit code {returncode}{where}")


class TokenizerInfoError(EngineBuildError):
    """The tokenizer cannot be turned into an xgrammar tokenizer-info file."""


class ConfigCheckError(EngineBuildError):
    def __init__(self, model: str, problems: Sequence[str]) -> None:
        self.model = model
        self.problems = tuple(problems)
        super().__init__(f"model config {model!r} does not match the client: " + "; ".join(self.problems))
