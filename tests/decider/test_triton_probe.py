"""scripts/triton_probe.py (the GPU host's first-run probe) against the protocol double, both flavors."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from test_triton_backend import RELEASE_V0190, _tiny_tokenizer
from triton_double import TritonProtocolDouble, serve_double

from engine_build.triton_repo import RepoOptions, write_triton_repo

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "triton_probe.py"


def _probe_module():
    spec = importlib.util.spec_from_file_location("toolrail_triton_probe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _echo_marker():
    async def produce(fields):
        prompt = fields["text_input"]
        marker = prompt.split("marker=", 1)[1].split()[0] if "marker=" in prompt else "none"
        text = json.dumps({"marker": marker}) if "marker=" in prompt else "the sea was wide and grey and old"
        guide = fields.get("guided_decoding_guide", "")
        if fields.get("guided_decoding_guide_type") == "ebnf_grammar" and "<tool_call>" in guide and marker in guide:
            # the Qwen-format probe: what a constrained model writes (the grammar names the call and its marker)
            text = '<tool_call>\n{"name": "echo_marker", "arguments": {"marker": "%s"}}\n</tool_call>' % marker
        for start in range(0, len(text), 3):
            await asyncio.sleep(0.0005)
            yield text[start:start + 3]

    return produce


@pytest.mark.parametrize("flavor", ["engine", "pytorch"])
def test_probe_passes_against_the_double_and_sees_the_bls_final_only_with_the_opt_in(tmp_path, flavor):
    result = write_triton_repo(
        RepoOptions(flavor=flavor, output=tmp_path / "repo", model="/models/m", engine_dir="/engines/m",
                    model_code_from=RELEASE_V0190), _tiny_tokenizer())
    probe = _probe_module()

    async def run():
        double = TritonProtocolDouble(result.root, _echo_marker(), seed=5)
        server, url = await serve_double(double)
        try:
            return await probe.probe(url, result.entry_model, raw_timeout=1.0), double
        finally:
            await server.stop(None)

    report, double = asyncio.run(run())
    checks = report["checks"]
    assert report["ok"], json.dumps(checks, indent=1)[:2000]
    assert len(checks["guided_16"]["requests"]) == 16 and checks["length"]["finish_reason"] == "length"
    raw = checks["raw_stream"]
    assert raw["with_opt_in"]["final_seen"] is True
    assert raw["without_opt_in"]["final_seen"] is (flavor == "pytorch")  # the BLS's empty final is withheld
    if flavor == "engine":
        assert checks["start"]["input_names"]["seed"] == "random_seed"
        assert "probe-raw-0:0" in double.stats.swallowed_finals
    assert double.stats.rejected == []
    assert checks["qwen_format"]["ok"] and checks["qwen_format"]["text"].startswith("<tool_call>")
