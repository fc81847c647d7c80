"""``toolrail run --require-approval`` meets the console: it prints the waiting job's console URL and waits for the
decision (made here through the API, as the console makes it), or with ``--no-wait`` exits 3 at once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
CALLS = json.dumps([{"name": "transfer", "arguments": {"from_account": "alice", "to": "bob", "amount": 3, "currency": "CNY"}}])


def _run(api: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOOLRAIL_LOG_LEVEL": "WARNING"}
    return subprocess.Popen([sys.executable, "-m", "toolrail.cli", "run", "--url", api, "--tools", "transfer",
                             "--tool-calls", CALLS, "--require-approval", "side_effects", "--timeout", "60", *extra],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_run_waits_for_the_decision_made_at_the_console_url(console_api: str) -> None:
    proc = _run(console_api)
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if "decide in the console:" in line:
                seen.set()

    threading.Thread(target=read, daemon=True).start()
    assert seen.wait(30), "".join(lines)
    url = next(line for line in lines if "decide in the console:" in line).split(": ", 1)[1].strip()
    match = re.fullmatch(re.escape(console_api) + r"/console/#/jobs/(job_\w+)", url)
    assert match, url
    job_id = match.group(1)
    time.sleep(1.0)
    assert proc.poll() is None  # still waiting, its stack (here: the API it was given) up
    job = httpx.get(f"{console_api}/v1/jobs/{job_id}", timeout=10).json()
    assert httpx.get(url.split("#")[0], timeout=10).status_code == 200  # the page it names is served
    call = job["calls"][0]
    assert httpx.post(f"{console_api}/v1/jobs/{job_id}/calls/{call['id']}/approve", timeout=10).status_code == 200
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(lines)
    assert "status: succeeded" in out and '"status": "applied"' in out, out


def test_run_no_wait_exits_3_at_once(console_api: str) -> None:
    proc = _run(console_api, "--no-wait")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert "awaiting approval: transfer(" in err and "/approve (or /reject)" in err
    assert re.search(re.escape(console_api) + r"/console/#/jobs/job_\w+", err), err


def test_on_a_terminal_it_asks_and_a_decision_elsewhere_ends_the_question(console_api: str) -> None:
    """On a terminal the prompt is asked too; a decision made at the console URL meanwhile ends the wait."""
    import pty
    import select

    argv = [sys.executable, "-m", "toolrail.cli", "run", "--url", console_api, "--tools", "transfer", "--tool-calls", CALLS,
            "--require-approval", "side_effects", "--timeout", "60"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the pty
        os.environ.update(PYTHONPATH=str(REPO), TOOLRAIL_LOG_LEVEL="WARNING")
        os.execv(sys.executable, argv)
    seen, approved = b"", False
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if not select.select([fd], [], [], 0.5)[0]:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child ended
                break
            if not chunk:
                break
            seen += chunk
            if b"[y/N/reason]" in seen and not approved:
                job_id = re.search(rb"/console/#/jobs/(job_\w+)", seen).group(1).decode()  # type: ignore[union-attr]
                call = httpx.get(f"{console_api}/v1/jobs/{job_id}", timeout=10).json()["calls"][0]
                assert httpx.post(f"{console_api}/v1/jobs/{job_id}/calls/{call['id']}/approve", timeout=10).status_code == 200
                approved = True
    finally:
        _, status = os.waitpid(pid, 0)
    text = seen.decode(errors="replace")
    assert approved and os.waitstatus_to_exitcode(status) == 0, text
    assert "(decided elsewhere)" in text and "status: succeeded" in text, text
