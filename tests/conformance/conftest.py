"""The conformance suite: each surface driven by the official clients, as a user would, asserting the protocol.

The surfaces are served by the real app (``decider.openai_api.create_app``: Chat Completions and the Responses
API) on loopback, over the embedded engine with a tiny random model that shares SmolLM2's tokenizer (every
grammar compiles as for the real model; a decode takes milliseconds). Each test is marked
``conformance(surface, client)``; when the whole suite ran, the table of what passed is written to
``docs/conformance.md`` (surface × client → pass).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import defaultdict
from importlib import metadata
from pathlib import Path

import pytest
import uvicorn

TABLE = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
#: Pinned in the ``test`` extra; shown in the table.
CLIENTS = {"openai-python": "openai", "OpenAI Agents SDK": "openai-agents", "langchain-openai": "langchain-openai",
           "openai-node": None}
_RESULTS: dict[tuple[str, str], list[str]] = defaultdict(list)
_COLLECTED: dict[str, int] = {"all": 0, "run": 0}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def conformance_decider(tmp_path_factory):
    """The embedded decider over a tiny random model with SmolLM2's tokenizer and the real model's 4096-token
    context (what a client's ``max_tokens=4096`` is measured against)."""
    from decider.embedded import DEFAULT_MAX_SEQ_LEN, EmbeddedEngine
    from decider.model import ModelError, resolve_model_path, tiny_random_model
    from decider.service import EmbeddedDecider

    try:
        resolve_model_path(None, pull=False)
    except ModelError as exc:  # only the missing model skips: any other failure here is a regression
        pytest.skip(f"default model tokenizer not available: {exc}")
    path = tiny_random_model(tmp_path_factory.mktemp("tiny-4k"), max_position_embeddings=DEFAULT_MAX_SEQ_LEN)
    engine = EmbeddedEngine.load(path, max_batch_size=4)
    yield EmbeddedDecider.from_engine(engine)
    engine.close()


@pytest.fixture(scope="session")
def base_url(conformance_decider) -> str:
    """``http://127.0.0.1:<port>/v1``: Chat Completions and the Responses API over the tiny engine."""
    from decider.openai_api import create_app

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(lambda: conformance_decider), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def client(base_url):
    import openai

    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def aclient(base_url):
    import openai

    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


def pytest_collection_modifyitems(session, config, items) -> None:  # noqa: ANN001 - pytest hook
    here = Path(__file__).parent
    mine = [i for i in items if Path(str(i.fspath)).parent == here]
    _COLLECTED["all"] = len(list(here.glob("test_*.py")))
    _COLLECTED["files"] = len({i.fspath for i in mine})


def pytest_runtest_logreport(report) -> None:  # noqa: ANN001 - pytest hook
    marker = getattr(report, "conformance", None)
    if marker is None:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _RESULTS[marker].append("skip" if report.skipped else "pass" if report.passed else "FAIL")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ANN001 - pytest hook
    outcome = yield
    marker = item.get_closest_marker("conformance")
    if marker is not None:
        outcome.get_result().conformance = (marker.args[0], marker.args[1])


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ANN001 - pytest hook
    # only a run of the whole suite (every file, no -k / -m selection that drops rows) rewrites the table
    if not _RESULTS or _COLLECTED.get("files") != _COLLECTED["all"] or session.config.option.keyword \
            or session.config.option.deselect or os.environ.get("TOOLRAIL_CONFORMANCE_NO_TABLE"):
        return
    TABLE.write_text(render(), encoding="utf-8")


def _version(package: str | None) -> str:
    if package is None:  # openai-node: the version package.json pins
        import json  # noqa: PLC0415

        return json.loads((Path(__file__).parent / "node" / "package.json").read_text())["dependencies"]["openai"]
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def render() -> str:
    clients = [c for c in CLIENTS if any(k[1] == c for k in _RESULTS)]
    surfaces = sorted({k[0] for k in _RESULTS}, key=lambda s: (s.split(":")[0], s))
    lines = ["# Conformance: the official clients against toolrail", "",
             "Generated by `pytest tests/conformance` (the whole suite; rewritten on every full run). Each cell is",
             "the number of protocol checks that passed for that surface and client; `–` is a pair the suite does not",
             "drive, `skipped` one whose client is not installed here. Each check asserts the protocol as the client",
             "sees it (openai-python's types, the Agents SDK's run, LangChain's messages), not toolrail's own shapes.",
             "", "| surface | " + " | ".join(clients) + " |", "| --- |" + " --- |" * len(clients)]
    for surface in surfaces:
        cells = []
        for client in clients:
            outcomes = _RESULTS.get((surface, client), [])
            if not outcomes:
                cells.append("–")
            elif "FAIL" in outcomes:
                cells.append(f"**FAIL** ({outcomes.count('FAIL')} of {len(outcomes)})")
            elif all(o == "skip" for o in outcomes):
                cells.append("skipped")
            else:
                cells.append(f"pass ({outcomes.count('pass')})")
        lines.append(f"| {surface} | " + " | ".join(cells) + " |")
    lines += ["", "Client versions: " + ", ".join(f"{c} {_version(CLIENTS[c])}" for c in clients) + ".", ""]
    return "\n".join(lines)
