"""Local means local (issue 25, item 1): a key-less API serves this machine only, by ``Host`` and ``Origin``.

A web page can rebind its own name to 127.0.0.1: the browser then connects to the loopback API but
sends the page's name as ``Host`` and the page's origin as ``Origin``. Every route of a key-less API
refuses such a request with 403 before any route runs; with keys the key is the boundary, and only a
cross-origin browser request is still refused (unless ``TOOLRAIL_ALLOWED_ORIGINS`` lists its origin).
The real API on a loopback port, real HTTP; only loopback addresses.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from toolrail.settings import Settings

KEYS = "key-local-a:alpha"
FORGED = "evil.example"


def _serve(runtime, settings: Settings) -> Iterator[tuple[str, object]]:
    from executor.api.app import create_app
    from tests.harness.serving import api_server

    app = create_app(settings, runtime, enqueue=lambda job: None, ping_workers=lambda: 1, mount_openai=False)
    with api_server(app) as base:
        yield base, app


@pytest.fixture(scope="module")
def keyless(runtime) -> Iterator[tuple[str, object]]:
    yield from _serve(runtime, Settings(rate_limit_per_s=0, allowed_hosts="api.internal"))


@pytest.fixture(scope="module")
def keyed(runtime) -> Iterator[tuple[str, object]]:
    yield from _serve(runtime, Settings(api_keys=KEYS, rate_limit_per_s=0, allowed_origins="https://console.example"))


def _routes(app: object) -> list[tuple[str, str]]:
    """(method, concrete path) of every route the app serves (its own and included routers'), parameters filled in."""
    found = {(m, r.path) for r in app.routes if isinstance(getattr(r, "path", None), str)  # type: ignore[attr-defined]
             for m in (getattr(r, "methods", None) or {"GET", "POST"})}
    found |= {(m.upper(), path) for path, item in app.openapi()["paths"].items() for m in item}  # type: ignore[attr-defined]
    return sorted((m, re.sub(r"\{[^}]+\}", "job_0123abcd", p)) for m, p in found if m not in {"HEAD", "OPTIONS"})


def _assert_refused(response: httpx.Response, kind: str) -> None:
    assert response.status_code == 403, (response.request.method, response.request.url, response.status_code,
                                         response.text[:300])
    body = response.json()
    assert body["error"]["type"] == kind and body["error"]["message"] and body["error"]["details"] == {}, body
    assert response.headers.get("x-request-id")  # refused inside the correlation middleware: logged, quotable


def test_every_route_refuses_a_forged_host_without_keys(keyless) -> None:
    base, app = keyless
    routes = _routes(app)
    assert len(routes) >= 15 and {("POST", "/v1/jobs"), ("GET", "/v1/jobs/job_0123abcd/trace")} <= set(routes), routes
    with httpx.Client(base_url=base, timeout=30) as client:
        for method, path in routes:
            _assert_refused(client.request(method, path, headers={"Host": FORGED}, json={}), "host_not_allowed")
            _assert_refused(client.request(method, path, headers={"Host": f"{FORGED}:8000"}), "host_not_allowed")


def test_a_rebinding_page_cannot_submit_a_job_without_keys(keyless, runtime) -> None:
    base, _ = keyless
    before = runtime.store.list_jobs("default", limit=200)
    body = {"tools": ["get_weather"], "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "date": "today"}}]}
    with httpx.Client(base_url=base, timeout=30) as client:
        forged = client.post("/v1/jobs", json=body, headers={"Host": FORGED, "Origin": f"http://{FORGED}"})
        _assert_refused(forged, "host_not_allowed")
        # the page's origin with the loopback Host (a page posting to http://127.0.0.1:<port> directly)
        cross = client.post("/v1/jobs", json=body, headers={"Origin": f"http://{FORGED}"})
        _assert_refused(cross, "origin_not_allowed")
        _assert_refused(client.post("/v1/jobs", json=body, headers={"Origin": "null"}), "origin_not_allowed")
    assert runtime.store.list_jobs("default", limit=200) == before  # nothing was created


def test_loopback_names_and_operator_hosts_are_served_without_keys(keyless) -> None:
    base, _ = keyless
    port = base.rsplit(":", 1)[1]
    with httpx.Client(base_url=base, timeout=30) as client:
        for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "[::1]",
                     "api.internal:8443"):
            response = client.get("/v1/tools", headers={"Host": host})
            assert response.status_code == 200, (host, response.text[:200])
        for origin in (f"http://127.0.0.1:{port}", "http://localhost:3000", "https://[::1]"):
            assert client.get("/healthz", headers={"Origin": origin}).status_code == 200, origin
        for host in ("127.0.0.1.evil.example", "localhost.evil.example", "127.0.0.1:80:80", "[::1]evil", ""):
            _assert_refused(client.get("/healthz", headers={"Host": host}), "host_not_allowed")


def test_with_keys_the_key_is_the_boundary_and_cross_origin_is_refused(keyed) -> None:
    base, _ = keyed
    auth = {"Authorization": "Bearer key-local-a"}
    with httpx.Client(base_url=base, timeout=30) as client:
        assert client.get("/v1/tools", headers={**auth, "Host": "api.example.com"}).status_code == 200  # any Host
        assert client.get("/v1/tools", headers={"Host": "api.example.com"}).status_code == 401  # the key decides
        same = client.get("/v1/tools", headers={**auth, "Host": "api.example.com", "Origin": "https://api.example.com"})
        assert same.status_code == 200, same.text  # the API's own origin
        listed = client.get("/v1/tools", headers={**auth, "Origin": "https://console.example"})
        assert listed.status_code == 200, listed.text  # TOOLRAIL_ALLOWED_ORIGINS
        _assert_refused(client.get("/v1/tools", headers={**auth, "Origin": f"https://{FORGED}"}), "origin_not_allowed")
        _assert_refused(client.post("/v1/jobs", json={}, headers={**auth, "Origin": "http://localhost:3000"}),
                        "origin_not_allowed")  # with keys, a loopback page is just another origin
