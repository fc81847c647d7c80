"""A tool author's first hour, scripted: a package of one's own, listed, checked, served, failing in its own words.

The journey of issue 27, as a newcomer walks it on a fresh clone, through the commands the docs
give (``docs/tools.md``) and nothing else:

1. a tool package in a folder of one's own (not in this tree), installed the way ``pip install``
   leaves one — a ``.dist-info`` with a ``toolrail.tools`` entry point — on ``PYTHONPATH``;
2. ``toolrail tools list`` shows its tools, with the entry point as their source;
3. ``toolrail tools check`` imports it in a real sandbox and passes;
4. ``toolrail serve`` (API + worker pool) runs a job whose call fails with the tool's own error
   type, message and details, one level deep, and no traceback unless asked for;
5. a malformed call the client brings is a 422 with the JSON path, and no job.

No model (``TOOLRAIL_DECIDER=none``: the client brings the calls), no demo tools; a Redis database
of the session's own, so the served worker shares no queue with any other test's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from executor.job_client import wait_for_job
from executor.stack import stop_process, wait_http_ok
from tests.harness.databases import own_database

ROOT = Path(__file__).resolve().parents[2]

ORDER_SHOP = '''
"""Order tools of a shop: a package of the user's own, installed with an entry point."""
from pydantic import BaseModel, ConfigDict, Field

from tools.errors import ToolError
from tools.spec import ToolSpec

ORDERS = {"A-7": {"status": "shipped"}}


class OrderNotFound(ToolError):
    type = "order_not_found"


class FindOrder(BaseModel):
    """Find an order by its id."""

    model_config = ConfigDict(extra="forbid")
    order_id: str = Field(min_length=1, max_length=16)


def find_order(args: FindOrder) -> dict:
    if args.order_id not in ORDERS:
        raise OrderNotFound(f"no order {args.order_id}", order_id=args.order_id, known=len(ORDERS))
    return {"order_id": args.order_id, **ORDERS[args.order_id]}


def register(registry) -> None:
    registry.add(ToolSpec.from_model("find_order", FindOrder, entrypoint="order_shop:find_order", timeout_s=5))
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The user's folder: their package, installed (a dist-info with the entry point), and their environment."""
    home = tmp_path_factory.mktemp("newcomer")
    site = home / "site"
    (site / "order_shop").mkdir(parents=True)
    (site / "order_shop" / "__init__.py").write_text(ORDER_SHOP)
    dist = site / "order_shop-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: order-shop\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[toolrail.tools]\norders = order_shop:register\n")
    redis_url = own_database(__name__)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLRAIL_")}
    env.update({"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "REDIS_URL": redis_url,
                "TOOLRAIL_DECIDER": "none", "TOOLRAIL_LOG_JSON": "1"})
    return {"home": home, "env": env, "redis_url": redis_url}


def toolrail(newcomer: dict, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolrail.cli", *args], capture_output=True, text=True,
                          env=newcomer["env"], cwd=newcomer["home"], timeout=timeout, check=False)


@pytest.fixture(scope="module")
def served(newcomer: dict) -> Iterator[str]:
    """``toolrail serve`` as the docs start it, on a port of its own."""
    port = _free_port()
    log = (newcomer["home"] / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "serve", "--port", str(port), "--concurrency", "1"],
                            env=newcomer["env"], cwd=newcomer["home"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url, timeout_s=90)
        yield url
    finally:
        stop_process(proc)
        log.close()


def test_1_tools_list_shows_the_package_and_where_it_came_from(newcomer: dict) -> None:
    listed = toolrail(newcomer, "tools", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == {"find_order"}, rows  # no demo tools unless asked for
    assert rows["find_order"]["source"] == "entry point orders = order_shop:register (order-shop)"
    table = toolrail(newcomer, "tools", "list")
    assert "find_order" in table.stdout and "entry point orders" in table.stdout and not table.stderr.strip()


def test_2_tools_check_passes_in_a_real_sandbox(newcomer: dict) -> None:
    checked = toolrail(newcomer, "tools", "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok    find_order  (entry point orders = order_shop:register (order-shop))" in checked.stdout
    assert "1 of 1 tool(s) pass" in checked.stdout


def test_3_a_job_fails_with_the_tools_own_error_type(newcomer: dict, served: str) -> None:
    with httpx.Client(base_url=served, timeout=30) as client:
        found = client.post("/v1/jobs", json={"tool_calls": [{"name": "find_order", "arguments": {"order_id": "A-7"}}]})
        assert found.status_code == 202, found.text
        ok = wait_for_job(client, found.json()["job_id"], timeout_s=120)
        missing = client.post("/v1/jobs", json={"tool_calls": [{"name": "find_order", "arguments": {"order_id": "Z-1"}}]})
        assert missing.status_code == 202, missing.text
        failed = wait_for_job(client, missing.json()["job_id"], timeout_s=120)
    assert ok["status"] == "succeeded" and ok["calls"][0]["result"] == {"order_id": "A-7", "status": "shipped"}, ok
    assert failed["status"] == "failed", failed
    # before: {"type": "tool_error", "details": {"tool_error": {"type": "order_not_found", ..., "details":
    #          {"traceback": "... /abs/path/executor/sandbox/child.py ..."}}}}
    assert failed["calls"][0]["error"] == {"type": "order_not_found", "message": "no order Z-1",
                                           "details": {"order_id": "Z-1", "known": 1}}, failed["calls"][0]
    assert "order_not_found" in json.dumps(failed["error"])


def test_4_a_malformed_call_is_refused_with_its_path(newcomer: dict, served: str) -> None:
    with httpx.Client(base_url=served, timeout=30) as client:
        before = client.get("/v1/jobs").json()["jobs"]
        refused = client.post("/v1/jobs", json={"tool_calls": [{"name": "find_order", "arguments": {"order_id": ""}}]})
        after = client.get("/v1/jobs").json()["jobs"]
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["type"] == "invalid_tool_calls"
    assert [e["path"] for e in error["details"]["errors"]] == ["/tool_calls/0/arguments/order_id"], error
    assert after == before  # nothing stored (before: a job ending needs_review, "no decider is configured to re-ask")
