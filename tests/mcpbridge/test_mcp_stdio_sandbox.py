"""A stdio MCP server runs in the tool sandbox, at registration (the API's listing) and on the workers (its calls).

Through the real entry points: ``POST /v1/mcp-servers`` of an API with two tenants' keys and
``TOOLRAIL_MCP_ALLOW_STDIO`` on (``keyed_api``), jobs on the session's real workers, and the SDK-written
``probe`` server (tests/mcpbridge/mcp_servers.py), which reports what its process could read, write and
connect to. Loopback only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.harness.jobs import wait_terminal
from tests.mcpbridge.mcp_servers import KEYS, probes, stdio_command, stdio_server

ROOT = Path(__file__).resolve().parents[2]
#: Variables a sandboxed server may see: the sandbox's own, and LC_CTYPE (Python's C-locale coercion, PEP 538).
SANDBOX_ENV = {"PATH", "LANG", "HOME", "TMPDIR", "LC_CTYPE"}


def tenant_client(base: str, tenant: str) -> httpx.Client:
    return httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {KEYS[tenant]}"})


def _worker_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if b"executor.worker.celery" in fh.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids[:4]


def _secret_markers() -> list[str]:
    """Whole ``NAME=value`` entries of this process's (the API's) environment a server must never see, reversed."""
    with open("/proc/self/environ", "rb") as fh:
        entries = [e.decode(errors="replace") for e in fh.read().split(b"\0") if b"=" in e]
    return [e[::-1] for e in entries if e.split("=", 1)[0] not in {"PATH", "LANG", "LC_ALL", "TZ", "LC_CTYPE"}
            and len(e) > 8][:20]


@pytest.fixture()
def asked(tmp_path: Path, redis_url: str) -> dict:
    """What the probe server is asked to try: the API's and the workers' environments, files outside its scratch and
    its code, writes there, and the session Redis."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the server")
    own_code = str(Path(stdio_command("probe")[1]))
    redis_port = urlsplit(redis_url).port or 6379
    return {
        "read": [f"/proc/{os.getpid()}/environ", f"/proc/{os.getppid()}/environ",
                 *(f"/proc/{pid}/environ" for pid in _worker_pids()), "/proc/1/environ", str(secret),
                 str(ROOT / "toolrail" / "settings.py"), str(ROOT / "tests" / "harness" / "__init__.py"), "/etc/shadow",
                 own_code],
        "write": [str(tmp_path / "dropped.txt"), "in-scratch.txt"],
        "connect": [["127.0.0.1", redis_port]],
        "markers": _secret_markers(),
    }


def _listed_report(server: dict, asked: dict) -> dict[str, str]:
    """The probe's report from the listing the API made at registration (tool ``p<i>``: outcome of probe ``i``)."""
    by_name = {t["remote_name"]: t["description"].split("] ", 1)[-1] for t in server["tools"]}
    return {key: by_name[f"p{i}"] for i, key in enumerate(probes(asked))}


def _assert_confined(report: dict[str, str], asked: dict, *, tmp_path: Path) -> None:
    own_code = asked["read"][-1]
    for path in asked["read"][:-1]:
        if path == "/proc/1/environ":  # PID 1 of its own namespace is the server itself: its own, empty, environment
            assert report[f"read {path}"] in {"ok", "EACCES", "ENOENT"}, report
        else:
            assert report[f"read {path}"] in {"EACCES", "ENOENT", "EPERM"}, (path, report)
    assert report[f"read {own_code}"] == "ok", report  # its own code stays readable
    assert report[f"write {tmp_path / 'dropped.txt'}"] in {"EACCES", "EPERM", "EROFS"}, report
    assert not (tmp_path / "dropped.txt").exists()
    assert report["write in-scratch.txt"] == "ok", report  # its scratch dir is writable
    assert "LEAKED" not in report.values(), report
    assert int(report["uid"]) != os.getuid(), report  # a uid of its own, not the API's or the worker's
    assert report["pid"] == "1", report  # PID 1 of a PID namespace of its own: no other process is there
    assert set(report["env"].split(",")) <= SANDBOX_ENV, report  # an environment built from nothing
    redis = next(k for k in report if k.startswith("connect 127.0.0.1:"))
    assert report[redis] != "ok", report


def test_the_listing_at_registration_runs_sandboxed(keyed_api: str, asked: dict, tmp_path: Path) -> None:
    """Before: the listing ran as the API's uid in its PID namespace, read /proc/<API pid>/environ and its files."""
    with tenant_client(keyed_api, "alpha") as client:
        response = client.post("/v1/mcp-servers", json={"name": "probelist", "timeout_s": 20,
                                                        **stdio_server("probe", json.dumps(asked))})
        assert response.status_code in (200, 201), response.text
        _assert_confined(_listed_report(response.json(), asked), asked, tmp_path=tmp_path)


def test_calls_on_the_workers_run_sandboxed(keyed_api: str, worker, asked: dict, tmp_path: Path) -> None:  # noqa: ANN001
    asked = {**asked, "read": [*(f"/proc/{pid}/environ" for pid in _worker_pids()), *asked["read"]]}
    with tenant_client(keyed_api, "alpha") as client:
        response = client.post("/v1/mcp-servers", json={"name": "probecall", "timeout_s": 20,
                                                        **stdio_server("probe", json.dumps(asked))})
        assert response.status_code in (200, 201), response.text
        job = client.post("/v1/jobs", json={"tools": ["mcp__probecall__probe"],
                                            "tool_calls": [{"name": "mcp__probecall__probe", "arguments": {}}]})
        assert job.status_code == 202, job.text
        done = wait_terminal(client, job.json()["job_id"], timeout_s=90)
    assert done["status"] == "succeeded", (done["calls"][0].get("error"), done.get("error"))
    _assert_confined(done["calls"][0]["result"], asked, tmp_path=tmp_path)


def test_a_path_argument_never_widens_what_the_server_may_read(keyed_api: str, asked: dict, tmp_path: Path) -> None:
    """Only ``read_paths`` (under the operator's roots) are readable. Before: any absolute path argument made its folder
    readable, so naming the folder of a secret (``/etc``, the API's own tree) in the command read it."""
    secret = str(tmp_path / "secret.txt")
    assert f"read {secret}" in [f"read {path}" for path in asked["read"]]
    with tenant_client(keyed_api, "alpha") as client:
        response = client.post("/v1/mcp-servers", json={"name": "probeargs", "timeout_s": 20,
                                                        **stdio_server("probe", json.dumps(asked), str(tmp_path), "/etc",
                                                                       str(ROOT / "toolrail"))})
        assert response.status_code in (200, 201), response.text
        report = _listed_report(response.json(), asked)
        assert report[f"read {secret}"] in {"EACCES", "ENOENT"}, report
        assert report[f"read {ROOT / 'toolrail' / 'settings.py'}"] in {"EACCES", "ENOENT"}, report
        assert report["read /etc/shadow"] in {"EACCES", "ENOENT"}, report
        refused = client.post("/v1/mcp-servers", json={"name": "probewide", "timeout_s": 20,
                                                       "command": stdio_command("probe"), "read_paths": [str(tmp_path)]})
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["details"]["reason"] == "read_path_not_allowed" and error["details"]["path"] == str(tmp_path), error
        escape = stdio_server("probe")["read_paths"][0] + "/../../toolrail"  # resolved: it leads out of the root
        refused = client.post("/v1/mcp-servers", json={"name": "probedots", "command": stdio_command("probe"),
                                                       "read_paths": [escape]})
        assert refused.status_code == 422 and refused.json()["error"]["details"]["reason"] == "read_path_not_allowed"


def test_network_true_reaches_web_ports_but_not_the_platform(keyed_api: str, asked: dict, redis_url: str) -> None:
    """``network: true``: TCP connect to 53, 80 and 443 only (Landlock); the session Redis and the API are refused."""
    redis_port = urlsplit(redis_url).port or 6379
    api_port = urlsplit(keyed_api).port
    asked = {"connect": [["127.0.0.1", redis_port], ["127.0.0.1", api_port], ["127.0.0.1", 80]]}
    with tenant_client(keyed_api, "beta") as client:
        response = client.post("/v1/mcp-servers", json={"name": "probenet", "timeout_s": 20, "network": True,
                                                        **stdio_server("probe", json.dumps(asked))})
        assert response.status_code in (200, 201), response.text
    report = _listed_report(response.json(), asked)
    assert report[f"connect 127.0.0.1:{redis_port}"] == "EACCES", report  # Landlock: not a port it may connect to
    assert report[f"connect 127.0.0.1:{api_port}"] == "EACCES", report
    assert report["connect 127.0.0.1:80"] != "EACCES", report  # allowed: refused by nobody listening, or connected


def test_declared_variables_are_its_whole_environment(keyed_api: str) -> None:
    with tenant_client(keyed_api, "alpha") as client:
        response = client.post("/v1/mcp-servers", json={"name": "probeenv", "timeout_s": 20,
                                                        "env": {"PROBE": "{}", "SERVER_TOKEN": "t0ken-value"},
                                                        **stdio_server("probe")})
        assert response.status_code in (200, 201), response.text
        server = response.json()
    report = _listed_report(server, {})
    assert set(report["env"].split(",")) <= SANDBOX_ENV | {"PROBE", "SERVER_TOKEN"}, report
    assert "SERVER_TOKEN" in report["env"]
    assert server["env"] == ["PROBE", "SERVER_TOKEN"] and "t0ken-value" not in json.dumps(server)  # names only


@pytest.mark.parametrize("script, says", [
    ("echo SECRET-STDOUT-LINE; echo SECRET-STDERR-LINE >&2; exit 3", "not JSON-RPC"),
    ("echo SECRET-STDERR-LINE >&2; cat /proc/self/environ >&2; exit 5", "exited with code 5"),
])
def test_registration_never_echoes_what_the_process_printed(keyed_api: str, script: str, says: str) -> None:
    """Before: the API's error quoted the command's first stdout line and carried its stderr tail."""
    with tenant_client(keyed_api, "alpha") as client:
        response = client.post("/v1/mcp-servers", json={"name": "leaky", "command": ["/bin/sh", "-c", script]})
    assert response.status_code == 422, response.text
    assert "SECRET" not in response.text and "PATH=" not in response.text, response.text
    error = response.json()["error"]
    assert says in error["message"] and "stderr_tail" not in error["details"], error


def test_a_missing_command_says_so(keyed_api: str) -> None:
    with tenant_client(keyed_api, "alpha") as client:
        response = client.post("/v1/mcp-servers", json={"name": "nothere", "command": ["no-such-server-binary"]})
    assert response.status_code == 422, response.text
    assert "could not be started (exit 127)" in response.json()["error"]["message"], response.text


@pytest.fixture(scope="module")
def strict_api(runtime) -> Iterator[str]:  # noqa: ANN001 - the session runtime
    """An API with keys and TOOLRAIL_MCP_ALLOW_STDIO unset (the default)."""
    from executor.api.app import create_app
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    settings = Settings(api_keys=",".join(f"{k}:{t}" for t, k in KEYS.items()))
    with api_server(create_app(settings, runtime, mount_openai=False, enqueue=lambda job: None,
                               ping_workers=lambda: 1)) as base:
        yield base


def test_with_keys_stdio_is_refused_unless_the_operator_allows_it(strict_api: str) -> None:
    with httpx.Client(base_url=strict_api, timeout=30, headers={"Authorization": f"Bearer {KEYS['alpha']}"}) as client:
        response = client.post("/v1/mcp-servers", json={"name": "nope", "command": [sys.executable, "-c", "print(1)"]})
    assert response.status_code == 403 and response.json()["error"]["type"] == "mcp_stdio_not_allowed", response.text


def test_an_mcp_call_job_carries_its_tenant_and_owns_its_trace(keyed_api: str, runtime) -> None:  # noqa: ANN001
    """``/mcp`` ``tools/call`` starts its job's trace as ``POST /v1/jobs`` does: the tenant as baggage (before: none,
    so the job's trace showed only its job span), and never inside another tenant's trace."""
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from toolrail.tracing import TENANT_BAGGAGE

    foreign = "f" * 32
    runtime.redis.set(f"tr:trace-owner:{foreign}", "beta", ex=600)  # beta's trace

    async def call() -> str:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEYS['alpha']}",
                                           "traceparent": f"00-{foreign}-{'a' * 16}-01"}, timeout=60)
        async with Client(streamable_http_client(f"{keyed_api}/mcp", http_client=http), cache=None) as mcp:
            result = await mcp.call_tool("get_weather", {"city": "Paris"})
            return result.meta["toolrail.dev/job_id"]

    job = runtime.store.get(anyio.run(call), tenant="alpha")
    context = job.trace_context
    assert f"{TENANT_BAGGAGE}=alpha" in context.get("baggage", ""), context
    assert foreign not in context["traceparent"], context  # never joins another tenant's trace
