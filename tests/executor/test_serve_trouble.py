"""The CLI in trouble (issue 35, item 6): ``toolrail serve`` and ``toolrail run`` as a user meets them when things go
wrong — real processes, real signals, nothing faked.

- a SIGKILLed ``serve`` leaves nothing running: its Redis, its Celery main process, pool processes and sandboxes die
  with it (``toolrail.lifeline``: ``PR_SET_PDEATHSIG``). Before: every one of them ran on, re-parented to init;
- a used port is refused before anything starts, in one line naming the port and ``--port``; a second serve never
  touches the first one's Redis (before: it printed "ready at" from the first one's ``/readyz``, started workers on
  its Redis, then died with uvicorn's error);
- serve's own readiness polls are not logged at INFO (before: dozens of ``GET /readyz 503`` lines while warming);
- Ctrl-C during ``toolrail run`` prints one line (before: the pool's ``WorkerLostError`` tracebacks);
- a ``REDIS_URL`` without a scheme is one line (before: a 22-line ``ValueError``).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from executor.stack import stop_process
from toolrail.redis_embed import EmbeddedRedis, free_port

REPO = Path(__file__).resolve().parents[2]


def _descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid``: {pid: command line}."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                found[child] = _cmdline(child)
                frontier.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pids: dict[int, str]) -> dict[int, str]:
    """Those of ``pids`` still running the same command (not zombies)."""
    alive = {}
    for pid, command in pids.items():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and _cmdline(pid) == command:
            alive[pid] = command
    return alive


def _kill_all(pids: dict[int, str]) -> None:
    for pid in _alive(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "TOOLRAIL_DECIDER": "none", "TOOLRAIL_TOOL_MODULES": "tests.executor.tools_for_tests",
           "PYTHONPATH": str(REPO), **extra}
    env.pop("REDIS_URL", None)
    return env


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen, int, Path, str, list[str]]]:
    """``toolrail serve`` on its own embedded Redis with its worker pool: (process, port, its log, its REDIS_URL, the
    three lines it printed once ready)."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve-trouble") / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "serve", "--port", str(port), "--concurrency", "1"],
                                cwd=REPO, env=_env(TOOLRAIL_LOG_LEVEL="INFO", TOOLRAIL_LOG_JSON="1"),
                                stdout=subprocess.PIPE, stderr=out, text=True, start_new_session=True)
    started = {}
    try:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        printed = [lines.get(timeout=120)]
        assert printed[0].startswith("toolrail serve: ready at"), log.read_text()[-2000:]
        printed += [lines.get(timeout=10), lines.get(timeout=10)]  # export REDIS_URL=…, console: …
        redis_url = printed[1].split("=", 1)[1].split()[0]
        started = _descendants(proc.pid)
        yield proc, port, log, redis_url, printed
    finally:
        stop_process(proc, grace_s=20)
        _kill_all({**started, **_descendants(proc.pid)})


def test_serve_prints_its_url_and_the_redis_url_a_second_process_needs(
        serve: tuple[subprocess.Popen, int, Path, str, list[str]]) -> None:
    """Once ``/readyz`` answers serve prints the API's URL and ``export REDIS_URL=…`` of its own embedded Redis (a
    random port), and that Redis is the one serving (a second process can use it)."""
    _, port, log, redis_url, printed = serve
    ready, export, console = (line.strip() for line in printed)
    assert ready == f"toolrail serve: ready at http://127.0.0.1:{port}", log.read_text()[-2000:]
    assert export.startswith("export REDIS_URL=redis://127.0.0.1:"), export
    assert redis_url.endswith("/0") and not redis_url.startswith("redis://127.0.0.1:6379/")
    assert redis.Redis.from_url(redis_url, socket_connect_timeout=2).ping()
    assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200  # ready when it said so
    shell = subprocess.run(["bash", "-c", f"{export}; echo \"$REDIS_URL\""], capture_output=True, text=True)
    assert shell.stdout.strip() == redis_url  # the line works as printed
    assert console == f"console: http://127.0.0.1:{port}/console/", console  # where a person watches and approves
    assert httpx.get(console.split(" ", 1)[1], timeout=5).headers["content-security-policy"]


def test_readiness_polls_are_not_logged_at_info(serve: tuple[subprocess.Popen, int, Path, str, list[str]]) -> None:
    _, _, log, _, _ = serve
    polls = [line for line in log.read_text().splitlines() if "/readyz" in line]
    assert not polls, f"{len(polls)} readiness polls logged, e.g. {polls[0][:200]}"


def test_a_second_serve_on_the_port_is_refused_before_it_starts_anything(
        serve: tuple[subprocess.Popen, int, Path, str, list[str]]) -> None:
    proc, port, _, redis_url, _ = serve
    first = redis.Redis.from_url(redis_url)
    first.set("toolrail-test:first-serve", "mine")
    second = subprocess.run([sys.executable, "-m", "toolrail.cli", "serve", "--port", str(port)], cwd=REPO,
                            env={**_env(), "REDIS_URL": redis_url}, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2, second.stderr[-2000:]
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0] and "--port" in lines[0], second.stderr[-2000:]
    assert "ready at" not in second.stdout
    assert first.get("toolrail-test:first-serve") == b"mine" and proc.poll() is None
    assert first.ping()


def test_a_port_held_by_another_program_is_refused_and_its_redis_untouched(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    bystander = EmbeddedRedis(data_dir=tmp_path).start()
    try:
        client = redis.Redis.from_url(bystander.url)
        connections = int(client.info("stats")["total_connections_received"])
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "toolrail.cli", "serve", "--port", str(port)], cwd=REPO,
                             env={**_env(), "REDIS_URL": bystander.url}, capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - started
        assert out.returncode == 2 and f":{port}" in out.stderr and "--port" in out.stderr, out.stderr[-2000:]
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
        assert int(client.info("stats")["total_connections_received"]) == connections  # serve never connected
        assert elapsed < 8, f"refused after {elapsed:.1f} s"
    finally:
        holder.close()
        bystander.stop()


def test_a_sigkilled_serve_leaves_nothing_running(serve: tuple[subprocess.Popen, int, Path, str, list[str]]) -> None:
    """Last in the module: it kills the module's serve."""
    proc, _, _, _, _ = serve
    started = _descendants(proc.pid)
    assert any("redis-server" in c for c in started.values()) and any("celery" in c for c in started.values()), started
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while (left := _alive(started)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"{len(left)} of {len(started)} processes outlived a SIGKILLed serve: {sorted(left.values())}"


@pytest.mark.parametrize("command", [["serve"], ["worker"], ["run", "hi", "--tools", "slow_echo"]])
def test_a_redis_url_without_a_scheme_is_one_line(command: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "toolrail.cli", *command], cwd=REPO,
                         env={**_env(), "REDIS_URL": "localhost:6379"}, capture_output=True, text=True, timeout=60)
    lines = out.stderr.strip().splitlines()
    assert out.returncode != 0 and len(lines) == 1, out.stderr[-2000:]
    assert "REDIS_URL" in lines[0] and "redis://" in lines[0]


def test_a_bad_redis_url_flag_is_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "toolrail.cli", "serve", "--redis-url", "localhost:6379"], cwd=REPO,
                         env=_env(), capture_output=True, text=True, timeout=60)
    lines = out.stderr.strip().splitlines()
    assert out.returncode != 0 and len(lines) == 1 and "--redis-url" in lines[0], out.stderr[-2000:]


def test_ctrl_c_during_run_prints_one_line_and_leaves_nothing_running(tmp_path: Path) -> None:
    err = tmp_path / "run.err"
    calls = '[{"name": "slow_echo", "arguments": {"value": "a", "delay_s": 10}}, ' \
            '{"name": "slow_echo", "arguments": {"value": "b", "delay_s": 10}}]'
    with open(err, "wb") as err_file:  # SIGINT as a terminal's Ctrl-C sends it (a shell's background job ignores it)
        proc = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "run", "--tool-calls", calls, "--tools", "slow_echo"],
                                cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while err.read_text().count("slow_echo → running") < 2:
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-2000:]
            time.sleep(0.2)
        before = err.read_text()
        started = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        said = err.read_text()[len(before):].strip().splitlines()
        assert said == ["interrupted"], err.read_text()[-3000:]
        deadline = time.monotonic() + 10
        while (left := _alive(started)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, sorted(left.values())
    finally:
        stop_process(proc, grace_s=0)
        _kill_all(started)
