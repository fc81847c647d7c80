"""Registering MCP servers through the real API: tenants cannot starve each other, names cannot clash, URLs are
guarded at every fetch, listings are bounded.

The API here runs in a thread of the test process over the session Redis, with a queue double (nothing is
queued: no worker is needed to register servers or list tools), so a resolver double set in a test applies
to the API's connections too.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mcpbridge import providers
from mcpbridge.settings import McpSettings
from tests.harness.fixtures import mcp_environment
from tests.mcpbridge.mcp_servers import KEYS, serve_http
from toolrail import netguard

HANGING = 12
CONNECT_TIMEOUT_S = 3.0


def _no_queue(job: object) -> None:
    """A queue double: registrations and listings never queue anything."""


@pytest.fixture(scope="module")
def fair_api(runtime) -> Iterator[str]:  # noqa: ANN001 - the session runtime
    """An API with keys for alpha and beta; room for HANGING registrations per tenant, a 60 s timeout ceiling."""
    from executor.api.app import create_app
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    settings = Settings(api_keys=",".join(f"{k}:{t}" for t, k in KEYS.items()), rate_limit_per_s=1000,
                        rate_limit_burst=1000)
    with mcp_environment(allow_private_urls=True, connect_timeout_s=CONNECT_TIMEOUT_S, max_timeout_s=60,
                         max_concurrent_per_tenant=HANGING):
        app = create_app(settings, runtime, mount_openai=False, enqueue=_no_queue, ping_workers=lambda: 1)
    with api_server(app) as base:
        yield base


@pytest.fixture(scope="module")
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never answers (an MCP server that hangs)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
    stop.set()
    thread.join(timeout=5)
    for conn in held:
        conn.close()
    listener.close()


def _as(base: str, tenant: str) -> httpx.Client:
    return httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {KEYS[tenant]}"})


def _tools_list_s(base: str, tenant: str) -> float:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Authorization": f"Bearer {KEYS[tenant]}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    started = time.monotonic()
    response = httpx.post(f"{base}/mcp", json=body, headers=headers, timeout=60)
    assert response.status_code == 200 and "get_weather" in response.text
    return time.monotonic() - started


def test_hanging_registrations_do_not_hold_other_tenants(fair_api: str, silent_server: str) -> None:
    """12 registrations of alpha's to a server that never answers wait on the event loop, not on threads: beta's
    /mcp tools/list is not held behind them (it took 19.8 s before). A 13th of alpha's is refused at once."""
    alone = min(_tools_list_s(fair_api, "beta") for _ in range(3))
    with ThreadPoolExecutor(HANGING + 1) as pool, _as(fair_api, "alpha") as alpha:
        hanging = [pool.submit(alpha.post, "/v1/mcp-servers", json={"name": f"hang{i}", "url": silent_server})
                   for i in range(HANGING)]
        time.sleep(0.5)  # all of them are waiting for the handshake now
        busy = alpha.post("/v1/mcp-servers", json={"name": "onemore", "url": silent_server})
        during = [_tools_list_s(fair_api, "beta") for _ in range(3)]
        answers = [f.result() for f in hanging]
    assert busy.status_code == 429 and busy.json()["error"]["type"] == "mcp_registrations_busy"
    assert all(a.status_code == 422 and a.json()["error"]["type"] == "mcp_server_unavailable" for a in answers)
    # the hang lasts CONNECT_TIMEOUT_S; beta never waited for it (loose: the figure itself is in bench/mcp.py)
    assert max(during) < CONNECT_TIMEOUT_S / 2, (alone, during)


def test_timeouts_above_the_operators_ceiling_are_refused(fair_api: str, http_server: str) -> None:
    with _as(fair_api, "alpha") as alpha:
        for field in ("timeout_s", "idle_timeout_s"):
            refused = alpha.post("/v1/mcp-servers", json={"name": "slowpoke", "url": http_server, field: 300})
            assert refused.status_code == 422, refused.text
            error = refused.json()["error"]
            assert error["type"] == "mcp_server_rejected" and error["details"]["reason"] == "timeout_above_ceiling"
            assert error["details"]["ceiling_s"] == 60 and error["details"]["field"] == field
        assert alpha.post("/v1/mcp-servers", json={"name": "slowpoke", "url": http_server, "timeout_s": 60}).status_code \
            in (200, 201)


def test_stored_timeouts_are_clamped_at_the_call() -> None:
    from toolrail.settings import Settings

    record = {"timeout_s": 600, "idle_timeout_s": 30}
    assert providers.timeouts(record, McpSettings(max_timeout_s=45)) == (45.0, 30.0)


@pytest.mark.parametrize("name", ["a__b", "pay__", "x_", "ok__ok"])
def test_server_names_with_double_underscores_are_refused(fair_api: str, http_server: str, name: str) -> None:
    with _as(fair_api, "alpha") as alpha:
        refused = alpha.post("/v1/mcp-servers", json={"name": name, "url": http_server})
    assert refused.status_code == 422 and "__" in refused.text


def test_a_tool_name_another_server_provides_is_refused(fair_api: str, runtime) -> None:  # noqa: ANN001
    """Server 'x__y' (stored before '__' was refused) provides mcp__x__y__z; server 'x' listing 'y__z' would map
    to the same name: that tool is refused with the other server named, and nothing silently wins."""
    legacy = {"name": "x__y", "tenant": "beta", "url": "http://127.0.0.1:9/mcp", "command": None, "network": True,
              "side_effects": [], "requires_approval": [], "timeout_s": 30.0, "idle_timeout_s": 10.0, "memory_mb": 1024,
              "queue": "mcp.beta.x__y", "refused": [], "fetched_at": 0,
              "tools": [{"name": "mcp__x__y__z", "remote_name": "z", "description": "legacy", "side_effects": False,
                         "requires_approval": False, "parameters": {"type": "object", "properties": {},
                                                                    "additionalProperties": False}}]}
    providers.save_server(runtime.redis, legacy)
    url, stop = serve_http("clash")
    try:
        with _as(fair_api, "beta") as beta:
            created = beta.post("/v1/mcp-servers", json={"name": "x", "url": url})
            assert created.status_code == 201, created.text
            record = created.json()
            assert record["tools"] == []
            clash = record["refused"][0]["details"]
            assert clash["reason"] == "name_collision" and clash["other_server"] == "x__y" and clash["tool"] == "y__z"
            # two stored records that clash (written before either rule): the name is served by neither
            providers.save_server(runtime.redis, {**legacy, "name": "x__y2", "queue": "mcp.beta.x__y2"})
            listed = [t["name"] for t in beta.get("/v1/tools").json()["tools"]]
            assert "mcp__x__y__z" not in listed
    finally:
        stop()
        for name in ("x__y", "x__y2", "x"):
            providers.delete_server(runtime.redis, "beta", name)


def test_a_listing_over_16_mib_is_refused_at_registration(fair_api: str) -> None:
    url, stop = serve_http("huge_list", json_response=True)
    try:
        with _as(fair_api, "alpha") as alpha:
            refused = alpha.post("/v1/mcp-servers", json={"name": "wide", "url": url})
    finally:
        stop()
    assert refused.status_code == 422 and refused.json()["error"]["type"] == "mcp_too_large"
    assert refused.json()["error"]["details"]["limit_bytes"] == 16 * 1024 * 1024


def test_urls_are_checked_at_registration_and_at_every_refresh(runtime, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A guarded API (private addresses refused): a name answering 100.64.0.7 is refused at registration; a stored
    server whose name answers it now is refused at refresh (resolved again, never connected)."""
    from executor.api.app import create_app
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    asked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["100.64.0.7"]

    monkeypatch.setattr(netguard, "resolve_host", resolver)
    settings = Settings(api_keys="key-guard:guard")
    with mcp_environment(connect_timeout_s=CONNECT_TIMEOUT_S):
        app = create_app(settings, runtime, mount_openai=False, enqueue=_no_queue, ping_workers=lambda: 1)
    with api_server(app) as base:
        record = {"name": "rebound", "tenant": "guard", "url": "http://rebind.example.test/mcp", "command": None,
                  "network": True, "side_effects": [], "requires_approval": [], "timeout_s": 30.0,
                  "idle_timeout_s": 10.0, "memory_mb": 1024, "queue": "mcp.guard.rebound", "refused": [], "fetched_at": 0, "tools": []}
        try:
            with httpx.Client(base_url=base, timeout=60, headers={"Authorization": "Bearer key-guard"}) as guard:
                refused = guard.post("/v1/mcp-servers", json={"name": "fresh", "url": "http://rebind.example.test/mcp"})
                assert refused.status_code == 403 and refused.json()["error"]["type"] == "mcp_url_not_allowed"
                assert refused.json()["error"]["details"]["address"] == "100.64.0.7"
                providers.save_server(runtime.redis, record)  # registered while the name answered a public address
                before = len(asked)
                again = guard.post("/v1/mcp-servers/rebound/refresh")
                assert again.status_code == 403 and again.json()["error"]["type"] == "mcp_url_not_allowed", again.text
                assert len(asked) > before
        finally:
            providers.delete_server(runtime.redis, "guard", "rebound")
