from __future__ import annotations

import stat
from pathlib import Path

import pytest

from engine_build.errors import NoGPUError, UnknownGPUError
from engine_build.gpus import detect_gpus, resolve_gpu


@pytest.mark.parametrize(
    ("name", "short", "sm", "arch", "fp8"),
    [
        ("h100", "h100", 90, "hopper", True),
        ("H200", "h200", 90, "hopper", True),
        ("NVIDIA H100 80GB HBM3", "h100", 90, "hopper", True),
        ("NVIDIA A100-SXM4-80GB", "a100", 80, "ampere", False),
        ("NVIDIA A10G", "a10g", 86, "ampere", False),
        ("L40S", "l40s", 89, "ada", True),
        ("NVIDIA L4", "l4", 89, "ada", True),
        ("NVIDIA GeForce RTX 4090", "rtx4090", 89, "ada", True),
        ("Tesla T4", "t4", 75, "turing", False),
        ("NVIDIA B200", "b200", 100, "blackwell", True),
        ("sm90", "h100", 90, "hopper", True),
    ],
)
def test_resolve_gpu_names_to_sm(name, short, sm, arch, fp8):
    gpu = resolve_gpu(name)
    assert (gpu.name, gpu.sm, gpu.arch, gpu.fp8) == (short, sm, arch, fp8)
    assert gpu.compute_capability == f"{sm // 10}.{sm % 10}"


def test_unknown_gpu_names_the_known_ones():
    with pytest.raises(UnknownGPUError) as info:
        resolve_gpu("voodoo5")
    assert "h100" in str(info.value) and info.value.name == "voodoo5"


def _fake_smi(tmp_path: Path, output: str, code: int = 0) -> str:
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '%s' '{output}'\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_detect_gpus_parses_nvidia_smi(tmp_path):
    smi = _fake_smi(tmp_path, "NVIDIA H200, 9.0\nNVIDIA Mystery X, 12.1\n")
    gpus = detect_gpus(nvidia_smi=smi)
    assert [(g.name, g.sm) for g in gpus] == [("h200", 90), ("mysteryx", 121)]


def test_detect_gpus_without_nvidia_smi(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(NoGPUError, match="nvidia-smi"):
        detect_gpus()


def test_detect_gpus_when_smi_fails(tmp_path):
    with pytest.raises(NoGPUError, match="failed"):
        detect_gpus(nvidia_smi=_fake_smi(tmp_path, "", code=9))
