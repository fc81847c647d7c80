"""The conformance suite: each surface driven by the official clients, as a user would, asserting the protocol.

The surfaces are served by the real apps on loopback: Chat Completions and the Responses API
(``decider.openai_api.create_app``) over the embedded engine with a tiny random model that shares SmolLM2's
tokenizer (every grammar compiles as for the real model; a decode takes milliseconds); MCP by the job API's
``/mcp`` and by ``toolrail mcp stdio``, over the session's Redis and workers. The node clients (openai-node, the
TypeScript MCP SDK) run from ``node/`` at the versions its ``package-lock.json`` pins. Each test is marked
``conformance(surface, client)``; when the whole suite ran, the table of what passed is written to
``docs/conformance.md`` (surface × client → pass).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from importlib import metadata
from pathlib import Path

import pytest

from tests.harness.fixtures import workers_environment
from tests.harness.serving import api_server

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "conformance.md"
NODE_DIR = Path(__file__).parent / "node"
#: The columns and their packages: Python's pinned in pyproject.toml, node's (``npm:``) in node/package-lock.json.
CLIENTS = {"openai-python": "openai", "OpenAI Agents SDK": "openai-agents", "langchain-openai": "langchain-openai",
           "openai-node": "npm:openai", "MCP Python SDK": "mcp", "MCP TypeScript SDK": "npm:@modelcontextprotocol/sdk"}
_RESULTS: dict[tuple[str, str], list[str]] = defaultdict(list)
_COLLECTED: dict[str, int] = {"all": 0, "run": 0}


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

    with api_server(create_app(lambda: conformance_decider)) as base:
        yield f"{base}/v1"


@pytest.fixture(scope="session")
def client(base_url):
    import openai

    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def aclient(base_url):
    import openai

    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def mcp_http(db_url: str, worker_env: dict[str, str]) -> dict:
    """The job API's MCP endpoint over a worker pool of its own (the module's own Redis database: the session's
    shared worker is never started here, since tests after this directory's need it started their way), with API
    keys on: ``{url, headers}`` (its key). The pool and this API's runtime are built under the workers' environment,
    as a deployment's are."""
    from executor.api.app import create_app
    from executor.runtime import Runtime
    from executor.stack import deployment_queues
    from tests.harness.jobs import publishers
    from tests.harness.serving import worker_pool
    from toolrail.settings import Settings

    enqueue, rerun = publishers(db_url)  # the API process's own Celery app is bound to the session's Redis
    with workers_environment(worker_env), worker_pool(db_url, queues=deployment_queues(db_url), concurrency=2,
                                                      env=worker_env, hostname="toolrail-conformance@%h"):
        settings = Settings(api_keys="key-conformance:conformance")
        app = create_app(settings, Runtime.from_settings(settings, redis_url=db_url), mount_openai=False,
                         enqueue=enqueue, rerun=rerun)
        with api_server(app) as base:
            yield {"url": f"{base}/mcp", "headers": {"Authorization": "Bearer key-conformance"}, "redis_url": db_url}


@pytest.fixture(scope="module")
def mcp_stdio(mcp_http: dict) -> dict:
    """How a host launches ``toolrail mcp stdio`` (docs/mcp.md: its config names Redis only); it serves the tools the
    workers (started with ``mcp_http``) published."""
    return {"command": sys.executable, "args": ["-m", "toolrail.cli", "mcp", "stdio"], "cwd": str(ROOT),
            "env": {"REDIS_URL": mcp_http["redis_url"], "PYTHONPATH": str(ROOT)}}


@pytest.fixture(scope="session")
def node_script():
    """Run a script of ``node/`` with extra environment; its last stdout line parsed as JSON.

    Skipped when node or npm is missing, or when the clients cannot be installed (no registry). They are installed
    into ``node/node_modules`` (the npm cache beside it, both ignored by git) by ``npm ci``, at the versions
    ``package-lock.json`` pins; nothing is written outside the repository."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node / npm not installed")
    pinned = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]
    if any(_installed_npm(name) != version for name, version in pinned.items()):
        installed = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--cache", str(NODE_DIR / ".npm-cache")],
                                   cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
        if installed.returncode != 0:
            pytest.skip(f"the node clients could not be installed: {installed.stderr[-300:]}")

    def run(script: str, env: dict[str, str]) -> dict:
        done = subprocess.run([node, script], cwd=NODE_DIR, capture_output=True, text=True, timeout=300,
                              env={**os.environ, **env})
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


def _installed_npm(name: str) -> str | None:
    found = NODE_DIR / "node_modules" / name / "package.json"
    return json.loads(found.read_text())["version"] if found.is_file() else None


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
    # only a run of the whole suite (every file, no -k / -m selection that drops rows) rewrites the table; a process
    # of pytest-xdist (make test) ran only its share of the files it collected
    if not _RESULTS or _COLLECTED.get("files") != _COLLECTED["all"] or session.config.option.keyword \
            or session.config.option.deselect or os.environ.get("TOOLRAIL_CONFORMANCE_NO_TABLE") \
            or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    TABLE.write_text(render(), encoding="utf-8")


def _version(package: str) -> str:
    if package.startswith("npm:"):  # the version package.json pins (exact, as the lock file)
        return json.loads((NODE_DIR / "package.json").read_text())["dependencies"][package[4:]]
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
             "sees it (openai-python's types, the Agents SDK's run, LangChain's messages, the MCP SDKs' results and",
             "errors), not toolrail's own shapes.",
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
