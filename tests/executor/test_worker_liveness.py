"""Liveness, not timeouts (issue 35, item 1): a job whose worker died resumes within seconds.

Under a real ``toolrail serve`` with the *default* visibility timeout (3,600 s): decide jobs (a scripted decider that
takes 3 s), validate-only jobs and sandboxed side-effecting transfers (the ledger) are in flight when a process is
SIGKILLed. Every job must be terminal within 60 s of the kill, none lost, no transfer applied twice.

- the Celery main process killed: its messages wait in kombu's ``unacked`` hash. Before: until the visibility
  timeout, an hour (the jobs stayed ``running``/``deciding`` past the 60 s); now serve's supervisor restores exactly
  the messages that process held (``executor.worker.liveness``) as it restarts the pool;
- a pool process killed: its main process requeues the message at once (``task_reject_on_worker_lost``);
- a worker no supervisor watches (``toolrail worker`` elsewhere): its beats stop and ``restore_dead_workers`` (the
  API's reconciler, every 2 s) puts what it held back in its queue;
- a message the main process took but had not noted as unacked when it died: the job's pending work is queued again
  seconds after the death (``liveness.deaths_due``); before, after the reconciler's stale sweep (~70 min);
- the sandbox's fork server or a tool process killed: that call fails, typed; every other job succeeds.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from executor.job_client import wait_for_job
from executor.stack import stop_process
from executor.store.records import TERMINAL_JOB
from tests.harness.processes import parent_pid, pool_process_of
from toolrail.redis_embed import EmbeddedRedis, free_port
from tools.ledger import Ledger

REPO = Path(__file__).resolve().parents[2]
PREFIX = "liveness:ledger"
ACCOUNTS = {"alice": {"CNY": 10_000_000}, "bob": {"CNY": 10_000_000}}
INLINE = {"type": "function", "function": {"name": "book_table", "parameters": {
    "type": "object", "properties": {"people": {"type": "integer"}}, "required": ["people"]}}}


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen, redis.Redis, Path]]:
    """``toolrail serve`` (3 pool processes, default visibility timeout) on a Redis of its own."""
    redis_server = EmbeddedRedis(data_dir=tmp_path_factory.mktemp("liveness-redis")).start()
    client = redis.Redis.from_url(redis_server.url)
    Ledger(client, prefix=PREFIX).seed(ACCOUNTS)
    port, log = free_port(), tmp_path_factory.mktemp("liveness-log") / "serve.log"
    env = {**os.environ, "TOOLRAIL_DECIDER": "custom", "TOOLRAIL_DECIDER_FACTORY": "tests.executor.scripted_decider:make",
           "TOOLRAIL_TOOL_MODULES": "tests.executor.tools_for_tests", "TOOLRAIL_LEDGER_PREFIX": PREFIX,
           "TOOLRAIL_LOG_JSON": "1", "TOOLRAIL_RATE_LIMIT_PER_S": "0", "PYTHONPATH": str(REPO)}
    for name in ("REDIS_URL", "TOOLRAIL_VISIBILITY_TIMEOUT_S", "TOOLRAIL_RECONCILE_INTERVAL_S"):
        env.pop(name, None)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "serve", "--port", str(port), "--redis-url",
                                 redis_server.url, "--concurrency", "3"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=out, text=True, start_new_session=True)
    try:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        assert lines.get(timeout=150).startswith("toolrail serve: ready at"), log.read_text()[-3000:]
        yield f"http://127.0.0.1:{port}", proc, client, log
    finally:
        stop_process(proc, grace_s=5)
        redis_server.stop()


def _celery_main(serve_pid: int) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == serve_pid and \
                        b"celery" in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except (OSError, ValueError, IndexError):
                continue
    raise AssertionError("serve runs no Celery worker")


def _submit_mix(client: httpx.Client, tag: str) -> tuple[list[str], list[str]]:
    """Two slow transfers, a slow decision, a validate-only job: (every job id, the transfers' ids)."""
    transfers = []
    for index in range(2):
        created = client.post("/v1/jobs", json={"tool_calls": [{"name": "slow_transfer", "arguments": {
            "from_account": "alice", "to": "bob", "amount": 1 + index, "delay_s": 4}}], "tools": ["slow_transfer"]},
            headers={"X-Request-ID": f"{tag}-transfer-{index}"})
        assert created.status_code == 202, created.text
        transfers.append(created.json()["job_id"])
    script = json.dumps({"steps": [{"text": "decided slowly", "sleep_s": 4}]})
    decide = client.post("/v1/jobs", json={"messages": [{"role": "user", "content": f"RUN {script}"}],
                                           "tools": ["slow_echo"]})
    validate = client.post("/v1/jobs", json={"tools": [INLINE], "raw_output": '{"name": "book_table", '
                                                                                  '"arguments": {"people": "4"}}'})
    assert decide.status_code == 202 and validate.status_code == 202, (decide.text, validate.text)
    return [*transfers, decide.json()["job_id"], validate.json()["job_id"]], transfers


def _wait_running(client: httpx.Client, redis_client: redis.Redis, transfers: list[str]) -> dict[str, int]:
    """Until both transfers' tool processes started: {job id: the host pid of its tool process}."""
    deadline, pids = time.monotonic() + 60, {}
    while len(pids) < len(transfers):
        assert time.monotonic() < deadline, "the transfers never started"
        for job_id in transfers:
            calls = client.get(f"/v1/jobs/{job_id}").json().get("calls") or []
            if calls and (pid := redis_client.get(f"test:started:{calls[0]['id']}")):
                pids[job_id] = int(pid)
        time.sleep(0.1)
    return pids


def _check_all_ended(client: httpx.Client, redis_client: redis.Redis, ids: list[str], transfers: list[str],
                     killed_at: float, before: int, *, crashed: str | None = None, crashed_as: str = "") -> float:
    """Every job terminal within 60 s of the kill, each transfer applied once — but ``crashed``, the transfer whose
    tool process died with the kill: failed with ``crashed_as`` (the platform's ``sandbox_error`` when the fork server
    died, the tool's ``tool_crashed`` when its own process did), applied never."""
    jobs = [wait_for_job(client, job_id, timeout_s=max(1.0, 60 - (time.monotonic() - killed_at)), poll_s=0.2)
            for job_id in ids]
    took = time.monotonic() - killed_at
    stuck = {job["job_id"]: job["status"] for job in jobs if job["status"] not in TERMINAL_JOB}
    assert not stuck, f"not terminal {took:.0f} s after the kill: {stuck}"
    ended = {job["job_id"]: (job["status"], (job.get("calls") or [{}])[0].get("error")) for job in jobs}
    for job_id, (status, error) in ended.items():
        assert (status, error["type"] if error else None) in ({("failed", crashed_as)} if job_id == crashed
                                                             else {("succeeded", None)}), ended
    applications = Ledger(redis_client, prefix=PREFIX).applications()[before:]
    keys = [entry["key"] for entry in applications]
    applied = [job_id for job_id in transfers if job_id != crashed]
    assert len(keys) == len(set(keys)) == len(applied), applications  # each transfer applied once, none twice
    assert {key.split(":")[0] for key in keys} == set(applied), applications
    return took


def test_the_main_process_killed_mid_work_resumes_within_seconds(serve) -> None:  # noqa: ANN001
    base, proc, redis_client, log = serve
    before = len(Ledger(redis_client, prefix=PREFIX).applications())
    with httpx.Client(base_url=base, timeout=30) as client:
        ids, transfers = _submit_mix(client, "main")
        _wait_running(client, redis_client, transfers)
        main = _celery_main(proc.pid)
        assert redis_client.hlen("unacked") >= 2  # messages this worker holds
        os.kill(main, signal.SIGKILL)
        killed_at = time.monotonic()
        took = _check_all_ended(client, redis_client, ids, transfers, killed_at, before)
    print(f"main process killed: every job terminal {took:.1f} s later")
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(e.get("event") == "worker.messages_restored" and e.get("messages", 0) >= 2 for e in events), events[-10:]


def test_a_pool_process_killed_mid_call_resumes_within_seconds(serve) -> None:  # noqa: ANN001
    base, _, redis_client, _ = serve
    before = len(Ledger(redis_client, prefix=PREFIX).applications())
    with httpx.Client(base_url=base, timeout=30) as client:
        ids, transfers = _submit_mix(client, "pool")
        tool_pids = _wait_running(client, redis_client, transfers)
        os.kill(pool_process_of(tool_pids[transfers[0]]), signal.SIGKILL)
        killed_at = time.monotonic()
        took = _check_all_ended(client, redis_client, ids, transfers, killed_at, before)
    print(f"pool process killed: every job terminal {took:.1f} s later")


def _sandbox_process_of(tool_pid: int, kind: str) -> int:
    """The tool process itself (``tool``) or the sandbox's fork server above it (``forkserver``)."""
    pid: int | None = tool_pid
    # by its name: a forked call's command line is still the fork server's (a fork, no exec)
    while kind == "forkserver" and pid is not None and Path(f"/proc/{pid}/comm").read_text().strip() != "tr-forkserver":
        pid = parent_pid(pid)
    assert pid is not None, f"no fork server above tool process {tool_pid}"
    return pid


@pytest.mark.parametrize("kind", ["forkserver", "tool"])
def test_a_sandbox_process_killed_mid_call_ends_its_call_and_no_other(serve, kind: str) -> None:  # noqa: ANN001
    """The fork server (the parent of every call of its pool process) or the tool process of a running transfer
    SIGKILLed: that call fails, typed (its tool died: nothing applied, the record says so), every other job of the
    mix succeeds within 60 s, the other transfer applied once."""
    base, _, redis_client, _ = serve
    before = len(Ledger(redis_client, prefix=PREFIX).applications())
    with httpx.Client(base_url=base, timeout=30) as client:
        ids, transfers = _submit_mix(client, kind)
        tool_pids = _wait_running(client, redis_client, transfers)
        os.kill(_sandbox_process_of(tool_pids[transfers[0]], kind), signal.SIGKILL)
        killed_at = time.monotonic()
        took = _check_all_ended(client, redis_client, ids, transfers, killed_at, before, crashed=transfers[0],
                                crashed_as="sandbox_error" if kind == "forkserver" else "tool_crashed")
    print(f"{kind} killed: every job terminal {took:.1f} s later")


def _drop_message(client: redis.Redis, job_id: str) -> None:
    """Take ``job_id``'s message off its queue as kombu's BRPOP does, noting it nowhere (unless the stopped worker's
    BRPOP already took it); then it is in no queue and not in ``unacked``: lost, as a kill between the two loses it."""
    for key in client.scan_iter(count=1000, _type="list"):
        for raw in client.lrange(key, 0, -1):
            if job_id.encode() in raw:
                client.lrem(key, 1, raw)
    assert not any(job_id.encode() in raw for raw in client.hvals("unacked"))
    assert not any(job_id.encode() in raw for key in client.scan_iter(count=1000, _type="list")
                   for raw in client.lrange(key, 0, -1))


def test_a_message_lost_between_its_take_and_its_note_is_requeued_seconds_after_the_death(serve) -> None:  # noqa: ANN001
    """kombu's Redis transport takes a message (BRPOP) and only then notes it in ``unacked``: a main process killed
    between the two loses it, held by nobody (bench/results/soak.md: 2 of 600 jobs). Reproduced exactly: the main
    process stopped, a transfer's call message and a decision's message taken off their queues and noted nowhere,
    the process killed. Before: both jobs waited for the reconciler's stale sweep (visibility timeout + task limit,
    ~70 min); now the death's pending work is queued again seconds after it (``liveness.deaths_due``)."""
    base, proc, redis_client, _ = serve
    before = len(Ledger(redis_client, prefix=PREFIX).applications())
    main = _celery_main(proc.pid)
    os.kill(main, signal.SIGSTOP)  # a few seconds only: after DEAD_AFTER_S without a beat it would count as dead
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            transfer = client.post("/v1/jobs", json={"tools": ["slow_transfer"], "tool_calls": [{
                "name": "slow_transfer", "arguments": {"from_account": "alice", "to": "bob", "amount": 7, "delay_s": 0}}]})
            decide = client.post("/v1/jobs", json={"messages": [{"role": "user", "content": "RUN " + json.dumps(
                {"steps": [{"text": "decided"}]})}], "tools": ["slow_echo"]})
            assert transfer.status_code == decide.status_code == 202, (transfer.text, decide.text)
            ids = [transfer.json()["job_id"], decide.json()["job_id"]]
            for job_id in ids:
                _drop_message(redis_client, job_id)
    finally:
        os.kill(main, signal.SIGKILL)
    killed_at = time.monotonic()
    with httpx.Client(base_url=base, timeout=30) as client:
        took = _check_all_ended(client, redis_client, ids, ids[:1], killed_at, before)
    print(f"lost messages: both jobs terminal {took:.1f} s after the kill")


def test_the_messages_of_a_worker_that_stopped_beating_go_back_to_their_queue(tmp_path: Path) -> None:
    """No supervisor: the reconciler's check finds the holder silent and restores what it held."""
    from celery import Celery
    from kombu import Connection

    from executor.sandbox.linux import children
    from executor.stack import start_worker, wait_for_workers
    from executor.worker import liveness
    from executor.worker.config import celery_config

    redis_server = EmbeddedRedis(data_dir=tmp_path / "redis").start()
    client = redis.Redis.from_url(redis_server.url)
    env = {"TOOLRAIL_DECIDER": "none", "TOOLRAIL_TOOL_MODULES": "tests.executor.tools_for_tests"}
    worker = start_worker(redis_server.url, queues=["tool.slow_echo"], concurrency=1, env=env,
                          hostname=f"liveness-{free_port()}@%h")
    try:
        wait_for_workers(redis_server.url, count=1, timeout_s=90)
        for pid in children(worker.pid):  # the pool process never runs (nor acks) what its main process takes
            os.kill(pid, signal.SIGSTOP)
        Celery("liveness-probe", broker=redis_server.url).send_task("toolrail.run_call", args=["job_nothing", "call_0"],
                                                                    queue="tool.slow_echo")
        deadline = time.monotonic() + 30
        while not client.hlen(liveness.HELD_PREFIX + liveness.holder_id(worker.pid)):
            assert time.monotonic() < deadline, "the worker never noted the message it took"
            time.sleep(0.05)
        assert client.hlen("unacked") == 1 and client.llen("tool.slow_echo") == 0
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
        connect = lambda: Connection(redis_server.url, transport=celery_config(redis_server.url)["broker_transport"])  # noqa: E731
        assert liveness.restore_dead_workers(connect, client, dead_after_s=30) == 0  # it beat moments ago: alive
        time.sleep(1.5)
        assert liveness.restore_dead_workers(connect, client, dead_after_s=1) == 1
        assert client.llen("tool.slow_echo") == 1 and client.hlen("unacked") == 0
        assert not client.exists(liveness.HELD_PREFIX + liveness.holder_id(worker.pid))
        assert liveness.restore_dead_workers(connect, client, dead_after_s=1) == 0  # restored once
        assert liveness.deaths_due(client, grace_s=60) is None  # its pending work waits out the grace
        assert liveness.deaths_due(client, grace_s=0) is not None and liveness.deaths_due(client, grace_s=0) is None
    finally:
        stop_process(worker, grace_s=0)
        redis_server.stop()
