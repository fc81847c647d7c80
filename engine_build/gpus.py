"""GPU names → compute capability (SM) and architecture.

An engine built by ``trtllm-build`` runs only on the SM it was built for, so the
build key carries the SM, not the marketing name: an H100 engine serves an H200.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from engine_build.errors import NoGPUError, UnknownGPUError

__all__ = ["GPU", "GPUS", "detect_gpus", "resolve_gpu"]


@dataclass(frozen=True, kw_only=True)
class GPU:
    """One GPU model."""

    name: str
    sm: int
    arch: str
    memory_gib: int
    #: FP8 tensor cores (Ada and newer).
    fp8: bool

    @property
    def compute_capability(self) -> str:
        return f"{self.sm // 10}.{self.sm % 10}"


def _gpu(name: str, sm: int, arch: str, memory_gib: int) -> GPU:
    return GPU(name=name, sm=sm, arch=arch, memory_gib=memory_gib, fp8=sm >= 89)


#: Keyed by a normalized short name; see :func:`resolve_gpu` for what normalizes to it.
GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        _gpu("v100", 70, "volta", 32),
        _gpu("t4", 75, "turing", 16),
        _gpu("a100", 80, "ampere", 80),
        _gpu("a30", 80, "ampere", 24),
        _gpu("a10", 86, "ampere", 24),
        _gpu("a10g", 86, "ampere", 24),
        _gpu("a40", 86, "ampere", 48),
        _gpu("rtx3090", 86, "ampere", 24),
        _gpu("l4", 89, "ada", 24),
        _gpu("l40", 89, "ada", 48),
        _gpu("l40s", 89, "ada", 48),
        _gpu("rtx4090", 89, "ada", 24),
        _gpu("h100", 90, "hopper", 80),
        _gpu("h200", 90, "hopper", 141),
        _gpu("h20", 90, "hopper", 96),
        _gpu("gh200", 90, "hopper", 96),
        _gpu("b200", 100, "blackwell", 180),
        _gpu("gb200", 100, "blackwell", 186),
        _gpu("rtx5090", 120, "blackwell", 32),
    )
}


def _normalize(name: str) -> str:
    text = name.lower().replace("nvidia", "").replace("geforce", "").replace("tesla", "")
    return re.sub(r"[^a-z0-9 ]", " ", text).strip()


def resolve_gpu(name: str) -> GPU:
    """Map a GPU name (``h100``, ``NVIDIA H100 80GB HBM3``, ``L40S``, ``sm90``) to a :class:`GPU`."""
    norm = _normalize(name)
    compact = norm.replace(" ", "")
    if compact in GPUS:
        return GPUS[compact]
    # nvidia-smi names: the model is the first word, e.g. "h100 80gb hbm3", "a100 sxm4 80gb".
    words = norm.split()
    if words:
        first = words[0]
        if first == "rtx" and len(words) > 1:
            first = "rtx" + words[1]
        if first in GPUS:
            return GPUS[first]
    match = re.fullmatch(r"sm_?(\d{2,3})", compact)
    if match:
        sm = int(match.group(1))
        for gpu in GPUS.values():
            if gpu.sm == sm:
                return gpu
    raise UnknownGPUError(name, GPUS)


def detect_gpus(*, nvidia_smi: str | None = None, timeout_s: float = 20.0) -> list[GPU]:
    """The GPUs ``nvidia-smi`` reports here; raises :class:`NoGPUError` when there are none."""
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if not exe:
        raise NoGPUError("an NVIDIA GPU", "nvidia-smi is not on PATH; engine builds need the target GPU")
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NoGPUError("an NVIDIA GPU", f"nvidia-smi failed: {exc}") from exc
    found: list[GPU] = []
    for line in filter(None, (raw.strip() for raw in out.splitlines())):
        name, _, cap = line.partition(",")
        try:
            found.append(resolve_gpu(name))
        except UnknownGPUError:
            major, _, minor = cap.strip().partition(".")
            if major.isdigit() and minor.isdigit():
                sm = int(major) * 10 + int(minor)
                found.append(GPU(name=_normalize(name).replace(" ", ""), sm=sm, arch="unknown", memory_gib=0, fp8=sm >= 89))
    if not found:
        raise NoGPUError("an NVIDIA GPU", "nvidia-smi lists no GPUs")
    return found
