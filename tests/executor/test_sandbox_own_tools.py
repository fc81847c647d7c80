"""Bring your own tools: a local module and an installed package, end to end through real workers.

Every tool module here lives outside the project tree, in a temporary folder the test
writes: a local module registered by ``TOOLRAIL_TOOL_MODULES`` (on the worker's module
search path through ``PYTHONPATH``), and a package registered by a ``toolrail.tools``
entry point (a ``.dist-info`` next to it, as ``pip install`` leaves one). A Celery worker
started with them and the API over the same registry run calls through the real sandbox.
Broken modules stop a worker with a message naming the module and the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from executor.job_client import wait_for_job
from executor.stack import start_worker, stop_process, wait_for_workers
from tests.harness.serving import api_server
from tools.registry import ENTRY_POINT_GROUP, load_registry
from executor.worker.config import worker_queues
from tests.harness.databases import own_database

ROOT = Path(__file__).resolve().parents[2]

SHOP_TOOLS = '''
"""A user's local tool module (not inside the toolrail tree)."""
from pydantic import BaseModel, ConfigDict, Field

from tools.context import current_call
from tools.spec import ToolSpec


class LookupArgs(BaseModel):
    """Look up a product by SKU."""

    model_config = ConfigDict(extra="forbid")
    sku: str = Field(min_length=1, max_length=32)


def lookup(args: LookupArgs) -> dict:
    import json  # a lazy import of the standard library, after confinement
    return {"sku": args.sku, "price": len(args.sku) * 100, "call_id": current_call().call_id,
            "encoded": json.dumps([args.sku])}


def register(registry) -> None:
    registry.add(ToolSpec.from_model("shop_lookup", LookupArgs, entrypoint="shop_tools:lookup", timeout_s=5))
'''

ACME_TOOLS = '''
"""A pip-installed package of tools, found through its entry point."""
from pydantic import BaseModel, ConfigDict

from tools.spec import ToolSpec


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


def echo(text: str) -> dict:  # keyword arguments, no model
    print(f"acme echo: {text}")
    return {"echo": text[::-1]}


def register(registry) -> None:
    registry.add(ToolSpec.from_model("acme_echo", EchoArgs, entrypoint="acme_tools:echo", timeout_s=5))
'''

DUP_TOOLS = '''
from pydantic import BaseModel, ConfigDict

from tools.spec import ToolSpec


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: int = 0


def good(args: Args) -> dict:
    return {"value": args.value}


def needs_two(left, right) -> dict:
    return {}


def register(registry) -> None:
    registry.add(ToolSpec.from_model("get_weather", Args, entrypoint="dup_tools:good"))  # a taken name
    registry.add(ToolSpec.from_model("bad_signature", Args, entrypoint="dup_tools:needs_two"))
    registry.add(ToolSpec.from_model("dup_good", Args, entrypoint="dup_tools:good"))
'''


ENV_TOOLS = '''
import os

from shop_tools import LookupArgs
from tools.spec import ToolSpec

API_KEY = os.environ["SHOP_API_KEY"]  # read at import: the worker has it, a sandboxed tool never does


def lookup(args: LookupArgs) -> dict:
    return {"sku": args.sku}


def register(registry) -> None:
    registry.add(ToolSpec.from_model("env_lookup", LookupArgs, entrypoint="env_tools:lookup"))
'''


ORDER_ERRORS = '''
"""The package's own error types, as a tool author writes them."""
from tools.errors import ToolError


class OrderNotFound(ToolError):
    type = "order_not_found"


class PosingAsTimeout(ToolError):
    type = "tool_timeout"  # the platform's own outcome: a tool may not claim it
'''

ORDER_LOOKUP = '''
"""A tool package (a folder of its own) whose failures have types of their own."""
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from order_tools.errors import OrderNotFound, PosingAsTimeout
from tools.spec import ToolSpec


class OrderArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order_id: str = Field(min_length=1, max_length=32)
    mode: Literal["missing", "plain", "forged", "flood"] = "missing"


def _find(order_id: str) -> dict:
    raise OrderNotFound(f"no order {order_id}", order_id=order_id, message="a detail may be called message")


def find_order(args: OrderArgs) -> dict:
    if args.mode == "plain":
        raise ValueError("the order service answered nonsense")
    if args.mode == "forged":
        raise PosingAsTimeout("not really a timeout")
    if args.mode == "flood":  # a flood on stdout must not hide stderr
        for i in range(5000):
            print(f"out {i}")
            print(f"err {i}", file=sys.stderr)
        return {"printed": 5000}
    return _find(args.order_id)


def register(registry) -> None:
    registry.add(ToolSpec.from_model("find_order", OrderArgs, entrypoint="order_tools.lookup:find_order", timeout_s=5))
    registry.add(ToolSpec.from_model("find_order_traced", OrderArgs, entrypoint="order_tools.lookup:find_order",
                                     timeout_s=5, error_traceback=True))
'''


def write_tool_tree(root: Path) -> tuple[Path, Path]:
    """A local-module folder and a site folder holding an installed distribution with an entry point."""
    local = root / "project"
    site = root / "site"
    local.mkdir(parents=True)
    (site / "acme_tools").mkdir(parents=True)
    (local / "shop_tools.py").write_text(SHOP_TOOLS)
    (local / "dup_tools.py").write_text(DUP_TOOLS)
    (local / "broken_tools.py").write_text("raise RuntimeError('shop database unreachable at import')\n")
    (local / "env_tools.py").write_text(ENV_TOOLS)
    (local / "order_tools").mkdir()
    (local / "order_tools" / "__init__.py").write_text("from order_tools.lookup import register  # noqa: F401\n")
    (local / "order_tools" / "errors.py").write_text(ORDER_ERRORS)
    (local / "order_tools" / "lookup.py").write_text(ORDER_LOOKUP)
    (site / "acme_tools" / "__init__.py").write_text(ACME_TOOLS)
    dist = site / "acme_tools-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-tools\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nacme = acme_tools:register\n")
    return local, site


@pytest.fixture(scope="module")
def tool_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    local, site = write_tool_tree(tmp_path_factory.mktemp("own-tools"))
    sys.path[:0] = [str(local), str(site)]
    yield local, site
    for entry in (str(local), str(site)):
        sys.path.remove(entry)
    for name in ("shop_tools", "dup_tools", "acme_tools", "order_tools", "order_tools.errors", "order_tools.lookup"):
        sys.modules.pop(name, None)


def tool_env(local: Path, site: Path, modules: str, **extra: str) -> dict[str, str]:
    return {"TOOLRAIL_DECIDER": "none", "TOOLRAIL_TOOL_MODULES": modules, "TOOLRAIL_LOG_JSON": "1",
            "PYTHONPATH": os.pathsep.join([str(local), str(site)]), **extra}


def enqueue_on(broker_url: str):  # noqa: ANN201 - the API's ``enqueue`` hook
    """Queue a job's decide step on ``broker_url`` (the process-wide Celery app talks to the session's Redis)."""
    from celery import Celery

    from toolrail.context import CELERY_REQUEST_ID_HEADER

    app = Celery("toolrail-test-enqueue", broker=broker_url)

    def enqueue(job) -> None:  # noqa: ANN001
        app.send_task("toolrail.decide", args=[job.job_id], queue="decide",
                      headers={CELERY_REQUEST_ID_HEADER: job.request_id})

    return enqueue


@pytest.fixture(scope="module")
def own_stack(tool_tree: tuple[Path, Path], redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A worker with the user's tools, and an API whose registry was built the same way."""
    from executor.api.app import create_app
    from executor.runtime import Runtime
    from toolrail.settings import get_settings

    redis_url = own_database(f"{__name__}:workers")
    local, site = tool_tree
    registry = load_registry(modules=["shop_tools", "dup_tools", "order_tools"])
    log_file = tmp_path_factory.mktemp("own-worker") / "worker.log"
    worker = start_worker(redis_url, queues=worker_queues(registry), concurrency=1,
                          env=tool_env(local, site, "shop_tools,dup_tools,order_tools"), log_file=log_file,
                          hostname="toolrail-own-tools@%h")
    try:
        wait_for_workers(redis_url, count=1, timeout_s=90)
        runtime = Runtime.from_settings(get_settings(), redis_url=redis_url)
        runtime.registry = registry
        with api_server(create_app(get_settings(), runtime, mount_openai=False,
                                   enqueue=enqueue_on(redis_url))) as base:
            yield {"url": base, "registry": registry, "log": log_file, "worker": worker, "local": local}
    finally:
        stop_process(worker)


def run_job(url: str, name: str, arguments: dict) -> dict:
    with httpx.Client(base_url=url, timeout=30) as client:
        response = client.post("/v1/jobs", json={"tool_calls": [{"name": name, "arguments": arguments}], "tools": [name]})
        assert response.status_code == 202, response.text
        return wait_for_job(client, response.json()["job_id"], timeout_s=60)


# ----------------------------------------------------------------- registration


def test_registry_loads_modules_and_entry_points_and_names_each_source(tool_tree: tuple[Path, Path]) -> None:
    registry = load_registry(modules=["shop_tools"])
    assert "shop_lookup" in registry and "acme_echo" in registry
    assert registry.source("shop_lookup") == "module shop_tools"
    assert registry.source("acme_echo").startswith("entry point acme = acme_tools:register (acme-tools")
    assert registry.source("get_weather") == "builtin"
    assert registry.problems == []


def test_duplicate_names_and_bad_signatures_are_refused_and_the_rest_load(tool_tree: tuple[Path, Path]) -> None:
    registry = load_registry(modules=["dup_tools", "no_such_tools"])
    by_tool = {p.tool: p for p in registry.problems}
    assert by_tool["get_weather"].kind == "duplicate" and by_tool["get_weather"].source == "module dup_tools"
    assert "already registered by builtin" in by_tool["get_weather"].reason
    assert by_tool["bad_signature"].kind == "signature"
    assert "requires left, right" in by_tool["bad_signature"].reason
    missing = by_tool[None]
    assert missing.kind == "import" and missing.source == "module no_such_tools"
    assert "No module named 'no_such_tools'" in missing.reason
    assert "dup_good" in registry and "bad_signature" not in registry
    assert registry.get("get_weather").entrypoint == "tools.builtin:get_weather"  # the built-in kept its name


# ----------------------------------------------------------------- end to end


def test_local_module_tool_runs_end_to_end(own_stack: dict) -> None:
    job = run_job(own_stack["url"], "shop_lookup", {"sku": "A-42"})
    assert job["status"] == "succeeded", job
    result = job["calls"][0]["result"]
    assert result["sku"] == "A-42" and result["price"] == 400
    assert result["call_id"] == job["calls"][0]["id"]
    assert result["encoded"] == '["A-42"]'


def test_entry_point_package_tool_runs_end_to_end_and_its_prints_are_logged(own_stack: dict) -> None:
    job = run_job(own_stack["url"], "acme_echo", {"text": "toolrail"})
    assert job["status"] == "succeeded", job
    assert job["calls"][0]["result"] == {"echo": "liarloot"}
    call_id = job["calls"][0]["id"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        events = [json.loads(line) for line in own_stack["log"].read_text().splitlines() if line.startswith("{")]
        printed = [e for e in events if e.get("event") == "tool.output" and e.get("call_id") == call_id]
        if printed:
            break
        time.sleep(0.2)
    assert printed and printed[0]["line"] == "acme echo: toolrail" and printed[0]["stream"] == "stdout", printed


def test_refused_tools_do_not_stop_the_worker_and_the_others_run(own_stack: dict) -> None:
    assert "bad_signature" not in own_stack["registry"]
    job = run_job(own_stack["url"], "dup_good", {"value": 7})
    assert job["status"] == "succeeded", job
    assert job["calls"][0]["result"] == {"value": 7}
    assert own_stack["worker"].poll() is None


def _events(log_file: Path, call_id: str, *, until: str, timeout_s: float = 10) -> list[dict]:
    """The worker's JSON log events of one call, once one named ``until`` is there."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = [json.loads(line) for line in log_file.read_text().splitlines() if line.startswith("{")]
        events = [e for e in events if e.get("call_id") == call_id]
        if any(e.get("event") == until for e in events) or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def test_a_tools_own_error_type_message_and_details_are_kept_one_level_deep(own_stack: dict) -> None:
    job = run_job(own_stack["url"], "find_order", {"order_id": "A-1"})
    assert job["status"] == "failed", job
    error = job["calls"][0]["error"]
    # before: {"type": "tool_error", "details": {"tool_error": {"type": "order_not_found", ..., "details": {traceback}}}}
    assert error == {"type": "order_not_found", "message": "no order A-1",
                     "details": {"order_id": "A-1", "message": "a detail may be called message"}}, error
    assert "order_not_found" in json.dumps(job["error"])  # the job's own summary names it too


def test_a_traceback_only_when_the_tool_asks_and_only_its_own_frames(own_stack: dict) -> None:
    job = run_job(own_stack["url"], "find_order_traced", {"order_id": "B-2"})
    error = job["calls"][0]["error"]
    assert error["type"] == "order_not_found" and set(error["details"]) == {"order_id", "message", "traceback"}
    trace = error["details"]["traceback"]
    assert 'File "order_tools/lookup.py"' in trace and "in _find" in trace and "in find_order" in trace, trace
    assert "executor" not in trace and str(own_stack["local"]) not in trace and 'File "/' not in trace, trace
    assert trace.rstrip().endswith("OrderNotFound: no order B-2"), trace
    plain = run_job(own_stack["url"], "find_order_traced", {"order_id": "C-3", "mode": "plain"})["calls"][0]["error"]
    assert plain["type"] == "tool_error" and plain["message"] == "ValueError: the order service answered nonsense"
    assert plain["details"]["exception"] == "ValueError" and "order_tools/lookup.py" in plain["details"]["traceback"]


def test_a_tool_cannot_claim_a_platform_error_type(own_stack: dict) -> None:
    error = run_job(own_stack["url"], "find_order", {"order_id": "D-4", "mode": "forged"})["calls"][0]["error"]
    assert error["type"] == "tool_error" and error["details"]["refused_type"] == "tool_timeout", error
    assert error["message"] == "not really a timeout"


def test_a_stdout_flood_leaves_stderr_its_own_share_of_the_logged_lines(own_stack: dict) -> None:
    job = run_job(own_stack["url"], "find_order", {"order_id": "E-5", "mode": "flood"})
    assert job["status"] == "succeeded", job
    events = _events(own_stack["log"], job["calls"][0]["id"], until="tool.output_truncated")
    logged = [e for e in events if e.get("event") == "tool.output"]
    # before: 200 stdout lines and not one of the 5,000 stderr lines
    assert sum(e["stream"] == "stdout" for e in logged) == 100 and sum(e["stream"] == "stderr" for e in logged) == 100
    assert [e["line"] for e in logged if e["stream"] == "stderr"][:2] == ["err 0", "err 1"]
    dropped = {e["stream"]: e["lines_not_logged"] for e in events if e.get("event") == "tool.output_truncated"}
    assert dropped == {"stdout": 4900, "stderr": 4900}, dropped


# ----------------------------------------------------------------- the worker's start-up check


def _worker_refuses(redis_url: str, env: dict[str, str], log_file: Path) -> str:
    proc = start_worker(redis_url, queues=["decide", "tool.shop_lookup"], concurrency=1, env=env, log_file=log_file)
    try:
        code = proc.wait(timeout=90)
    finally:
        stop_process(proc)
    text = log_file.read_text()
    assert code == 78, (code, text[-2000:])
    return text


def test_a_module_that_fails_to_import_stops_the_worker_with_the_message(tool_tree: tuple[Path, Path], redis_url: str,
                                                                      tmp_path: Path) -> None:
    text = _worker_refuses(redis_url, tool_env(*tool_tree, "shop_tools,broken_tools"), tmp_path / "worker.log")
    assert "refusing to start" in text
    assert "module broken_tools" in text and "RuntimeError: shop database unreachable at import" in text


def test_a_module_that_fails_only_inside_the_sandbox_stops_the_worker(tool_tree: tuple[Path, Path], redis_url: str,
                                                                      tmp_path: Path) -> None:
    # The worker has SHOP_API_KEY, the sandbox's scrubbed environment does not: the import fails in there only.
    env = tool_env(*tool_tree, "shop_tools,env_tools", SHOP_API_KEY="k-123")
    text = _worker_refuses(redis_url, env, tmp_path / "worker.log")
    assert "sandbox import" in text and "module env_tools" in text
    assert "KeyError: 'SHOP_API_KEY'" in text


# ----------------------------------------------------------------- toolrail tools


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(ROOT), env["PYTHONPATH"]])}
    return subprocess.run([sys.executable, "-m", "toolrail.cli", "tools", *args], capture_output=True, text=True,
                          env=full_env, timeout=180, check=False)


def test_tools_list_and_show_name_each_source(tool_tree: tuple[Path, Path]) -> None:
    env = tool_env(*tool_tree, "shop_tools")
    listed = _cli("list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["shop_lookup"]["source"] == "module shop_tools"
    assert rows["acme_echo"]["source"].startswith("entry point acme")
    shown = _cli("show", "shop_lookup", env=env)
    assert shown.returncode == 0 and json.loads(shown.stdout)["entrypoint"] == "shop_tools:lookup"
    unknown = _cli("show", "nope", env=env)
    assert unknown.returncode == 2
    assert unknown.stderr.strip().count("\n") == 0 and "unknown tool 'nope'" in unknown.stderr


def test_tools_list_with_a_tenant_adds_its_mcp_tools_from_the_runtimes_sources(tool_tree: tuple[Path, Path],
                                                                                redis_url: str) -> None:
    import redis

    from mcpbridge.providers import delete_server, save_server

    url = own_database(f"{__name__}:entry-points")
    client = redis.Redis.from_url(url)
    save_server(client, {"tenant": "acme", "name": "forecast", "url": "https://mcp.example.com/mcp", "timeout_s": 30,
                         "idle_timeout_s": 10, "queue": "mcp.acme.forecast", "tools": [
                             {"name": "forecast_week", "remote_name": "week", "description": "A week of weather",
                              "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
                              "side_effects": False, "requires_approval": False}]})
    try:
        env = tool_env(*tool_tree, "shop_tools")
        plain = {row["name"] for row in json.loads(_cli("list", "--json", env=env).stdout)}
        assert "forecast_week" not in plain  # no tenant named: the registry only
        listed = _cli("list", "--json", "--tenant", "acme", "--redis-url", url, env=env)
        assert listed.returncode == 0, listed.stderr
        rows = {row["name"]: row for row in json.loads(listed.stdout)}
        assert rows["forecast_week"]["source"] == "mcp:forecast (tenant acme)" and rows["forecast_week"]["tenant"] == "acme"
        assert rows["shop_lookup"]["source"] == "module shop_tools"  # and every registered tool, as before
        table = _cli("list", "--tenant", "acme", "--redis-url", url, env=env).stdout
        assert any(line.startswith("forecast_week") and line.endswith("mcp:forecast (tenant acme)")
                   for line in table.splitlines()), table
        other = json.loads(_cli("list", "--json", "--tenant", "other", "--redis-url", url, env=env).stdout)
        assert "forecast_week" not in {row["name"] for row in other}  # tenants are separate
    finally:
        delete_server(client, "acme", "forecast")
    down = _cli("list", "--tenant", "acme", "--redis-url", "redis://127.0.0.1:1/0", env=env)
    assert down.returncode == 2 and down.stderr.strip().count("\n") == 0 and "cannot read tenant 'acme'" in down.stderr


def test_tools_check_passes_good_tools_and_names_every_problem(tool_tree: tuple[Path, Path]) -> None:
    good = _cli("check", env=tool_env(*tool_tree, "shop_tools"))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "ok    shop_lookup  (module shop_tools)" in good.stdout and "ok    acme_echo" in good.stdout
    bad = _cli("check", "--json", env=tool_env(*tool_tree, "shop_tools,dup_tools,broken_tools"))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    findings = json.loads(bad.stdout)["findings"]
    assert {(f["source"], f["tool"]) for f in findings} >= {("module dup_tools", "get_weather"),
                                                            ("module dup_tools", "bad_signature"),
                                                            ("module broken_tools", None)}
    assert all(f["reason"] for f in findings)


def test_tools_help_lists_the_subcommands() -> None:
    out = subprocess.run([sys.executable, "-m", "toolrail.cli", "tools", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, check=True).stdout
    assert all(word in out for word in ("list", "show", "check"))
