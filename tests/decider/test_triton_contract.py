"""The shared backend contract suite on the Triton backend.

The decider talks to the Triton wire-protocol double over gRPC; the double serves the model
repository generated from tensorrtllm_backend v0.19.0's templates for the engine's tokenizer
and streams text from the embedded engine (tiny random model) the way the release's BLS does
(cumulative text, empty final), shuffling responses across requests.
"""

from __future__ import annotations

import pytest

from contract import *  # noqa: F401,F403
from decider_fixtures import tiny_engine  # noqa: F401
from test_triton_backend import _ServerThread
from triton_double import TritonProtocolDouble, engine_generator


@pytest.fixture(scope="module")
def triton_double_server(tiny_engine, tmp_path_factory):  # noqa: F811
    from engine_build.triton_repo import RepoOptions, write_triton_repo
    from test_triton_backend import RELEASE_V0190

    root = tmp_path_factory.mktemp("triton-contract-repo")
    write_triton_repo(RepoOptions(flavor="engine", output=root, model="/models/tiny", engine_dir="/engines/tiny",
                                  model_code_from=RELEASE_V0190),
                      tiny_engine.tokenizer, stop_token_ids=sorted(tiny_engine.eos_token_ids))
    double = TritonProtocolDouble(root, engine_generator(tiny_engine), seed=11)
    server = _ServerThread(double)
    yield server, double
    server.stop()


@pytest.fixture(scope="module")
def contract_decider(triton_double_server, tiny_engine):  # noqa: F811
    from decider.service import BackendDecider
    from decider.triton import TritonBackend

    server, _double = triton_double_server
    backend = TritonBackend(url=server.url, model_name="tensorrt_llm_bls", request_timeout_s=120,
                            context_length=tiny_engine.context_length)
    return BackendDecider(backend, tokenizer=tiny_engine.tokenizer, context_length=tiny_engine.context_length)


def test_triton_contract_sent_exact_tensors_and_unique_ids(contract_decider, triton_double_server):
    """After the suite's requests: nothing was rejected by the double, no wire id repeated."""
    from decider.protocol import DecideRequest
    from decider_fixtures import marker_tools

    _server, double = triton_double_server
    decision = contract_decider.decide(DecideRequest(
        request_id="tc-1", messages=[{"role": "user", "content": "Account M00abcd: balance of M00abcd."}],
        tools=marker_tools(), tool_choice="required", max_tokens=128))
    assert decision.request_id == "tc-1" and decision.backend == "triton"
    assert double.stats.rejected == []
    assert double.stats.duplicate_ids == []
    assert len(set(double.stats.seen_ids)) == len(double.stats.seen_ids)
