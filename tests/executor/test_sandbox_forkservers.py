"""One fork server per set of tool modules: a call is forked from a server that imported only what its tool needs.

``get_weather`` is forked from a server of ``tools.builtin`` alone, which never imports redis-py (the
ledger's client, ~16 MB that every fork copies); ``transfer`` from one that also preloads ``tools.ledger``,
so it imports nothing after confinement, and it still applies once per idempotency key. Real processes
and the session's Redis throughout.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from executor.sandbox.boundary import CallRun
from executor.sandbox.process import ProcessSandbox, call_modules
from tools.ledger import Ledger
from tools.registry import builtin_specs
from tools.spec import ToolSpec

SPECS = {spec.name: spec for spec in builtin_specs()}
WEATHER, TRANSFER, STRESS = SPECS["get_weather"], SPECS["transfer"], SPECS["stress"]
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


def probe(preload: tuple[str, ...]) -> ToolSpec:
    """A tool that reports the heavy modules of its process, run by the fork server of ``preload`` (and itself)."""
    return ToolSpec(name="module_probe", parameters=NO_ARGUMENTS, entrypoint="tests.executor.module_probe:loaded_modules",
                    preload=preload)


def run(box: ProcessSandbox, spec: ToolSpec, arguments: dict, *, call_id: str = "c", key: str = "k",
        env: dict[str, str] | None = None):
    return box.run(spec, CallRun(request_id=f"req-{call_id}", job_id="job-forkservers", call_id=call_id,
                                 idempotency_key=key, arguments=arguments, env=env or {}))


def server_preload(box: ProcessSandbox) -> dict[str, str]:
    """Each running fork server's ``TOOLRAIL_SANDBOX_PRELOAD``, read from its process's environment."""
    found = {}
    for key, server in box._forkservers.items():
        environ = Path(f"/proc/{server.proc.pid}/environ").read_bytes().split(b"\0")
        found[key] = next(v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"TOOLRAIL_SANDBOX_PRELOAD="))
    return found


@pytest.fixture()
def box() -> Iterator[ProcessSandbox]:
    sandbox = ProcessSandbox()
    yield sandbox
    sandbox.close()


def test_the_ledger_tools_name_their_lazy_import_and_the_others_do_not() -> None:
    assert call_modules(WEATHER) == call_modules(STRESS) == ("tools.builtin",)
    assert call_modules(TRANSFER) == call_modules(SPECS["query_balance"]) == ("tools.builtin", "tools.ledger")
    with pytest.raises(ValueError, match="preload names no module"):
        probe(("tools.ledger,redis",))  # one module a name: the list travels comma separated


def test_a_get_weather_call_is_forked_from_a_server_without_redis(box: ProcessSandbox) -> None:
    assert not box._forkservers  # started at the first call of their tools, not before
    assert run(box, WEATHER, {"city": "Beijing", "date": "today"}).result["city"] == "Beijing"
    assert run(box, STRESS, {"mode": "ok"}).result["mode"] == "ok"  # the same modules: the same server
    assert server_preload(box) == {"tools.builtin": "tools.builtin"}
    # what a process forked from that image holds, seen from inside one (confined like any call)
    loaded = run(box, probe(call_modules(WEATHER)), {}, call_id="probe").result["loaded"]
    assert loaded == ["pydantic", "tools.builtin"]


def test_a_transfer_call_runs_once_from_the_ledger_server(box: ProcessSandbox) -> None:
    prefix = f"test:ledger:forkservers:{uuid.uuid4().hex[:8]}"
    env = {"TOOLRAIL_LEDGER_URL": os.environ["REDIS_URL"], "TOOLRAIL_LEDGER_PREFIX": prefix}
    arguments = {"from_account": "alice", "to": "bob", "amount": 1.25, "currency": "CNY"}
    assert run(box, WEATHER, {"city": "Beijing", "date": "today"}).result
    first = run(box, TRANSFER, arguments, call_id="t1", key="job-forkservers:t", env=env).result
    again = run(box, TRANSFER, arguments, call_id="t2", key="job-forkservers:t", env=env).result  # a redelivery
    assert (first["status"], again["status"]) == ("applied", "replayed")
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        book = Ledger(client, prefix=prefix)
        assert [entry["cents"] for entry in book.applications()] == [125]
        assert book.replays() == ["job-forkservers:t"]
        assert book.balance("alice")["CNY"] == 1_000_000 - 125
    finally:
        client.delete(*client.keys(f"{prefix}:*"))
        client.close()
    assert server_preload(box) == {"tools.builtin": "tools.builtin", "tools.builtin,tools.ledger": "tools.builtin,tools.ledger"}
    # the ledger's server imported redis before any call: the transfer imported nothing after confinement
    assert "redis" in run(box, probe(call_modules(TRANSFER)), {}, call_id="probe").result["loaded"]


def test_one_preload_set_serves_every_call_when_given() -> None:
    shared = ProcessSandbox(preload="tools.builtin,tools.ledger,tests.executor.module_probe")
    try:
        assert run(shared, WEATHER, {"city": "Beijing", "date": "today"}).result
        assert "redis" in run(shared, probe(()), {}, call_id="probe").result["loaded"]
        assert list(shared._forkservers) == ["tools.builtin,tools.ledger,tests.executor.module_probe"]
    finally:
        shared.close()


def test_the_tool_check_imports_what_a_tool_preloads_and_names_a_failure() -> None:
    from executor.sandbox.toolcheck import sandbox_import_check
    from tools.registry import Registry

    assert Registry([TRANSFER]).modules() == ["tools.builtin", "tools.ledger"]
    assert sandbox_import_check(Registry([WEATHER, TRANSFER])) == []
    broken = TRANSFER.model_copy(update={"name": "broken_transfer", "preload": ("tests.executor.no_such_module",)})
    (finding,) = sandbox_import_check(Registry([WEATHER, broken]))
    assert finding.tool == "broken_transfer" and finding.fatal
    assert "sandbox import of tests.executor.no_such_module" in finding.kind
    assert "ModuleNotFoundError" in finding.reason


def test_a_pool_process_prewarm_starts_the_fork_servers_of_its_tools_only() -> None:
    from executor.runtime import Runtime
    from toolrail.settings import get_settings

    runtime = Runtime.from_settings(get_settings(), redis_url=os.environ["REDIS_URL"])
    try:
        runtime.prewarm_sandbox(["get_weather", "stress", "not_a_tool"])  # a worker of those two tools' queues
        servers = runtime.sandbox._forkservers
        assert list(servers) == ["tools.builtin"] and servers["tools.builtin"].alive()
        assert run(runtime.sandbox, WEATHER, {"city": "Beijing", "date": "today"}).result  # served by the started one
        assert list(servers) == ["tools.builtin"]
    finally:
        runtime.sandbox.close()
        runtime.redis.close()
