"""Every command README.md prints works as printed, on the defaults (issue 26, item 5).

The commands are read from README.md's ``bash`` blocks (a line, or lines joined while a quote is open or a line
ends in ``\\``; comments dropped), and each one must be listed in ``CHECKS`` below with how it is checked — a
command added to the README without a check fails ``test_every_readme_command_is_checked``; a check whose command
the README no longer prints fails it too. Each runs in ``bash`` from a folder of the user's own (the README's
``shop_tools.py`` written there), after the ``export`` lines of its block and of the blocks above it, in an
environment without any ``TOOLRAIL_*`` variable or ``REDIS_URL`` (a fresh shell), and must exit with the code the
README documents.

- ``fast``: run for real here (the CLI without the model: tools, config, repair, model info);
- ``slow``: run for real, marked ``slow`` (the real model on CPU: ``toolrail run``, ``toolrail generate``;
  ``toolrail serve`` started as printed, its ``export REDIS_URL=…`` line, a ``toolrail worker`` on it, and the
  ``curl`` lines against it);
- ``help``: only ``--help`` (``toolrail engine``: needs a GPU, TensorRT-LLM, Triton or AWS), or a dry form of a
  command that writes a tracked file (``config docs --check``), or needs what this machine may not give (a Redis
  of one's own on 6379), each with its reason;
- ``elsewhere``: checked by another test, named.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Check:
    kind: str  # fast | slow | serve | help | elsewhere
    rc: int = 0
    why: str = ""
    instead: str = ""  # the command run instead (help): the README's, in a form that changes nothing


CHECKS: dict[str, Check] = {
    # -- "The two commands"
    "make demo": Check("elsewhere", why="tests/e2e/test_demo.py runs `toolrail demo`, what `make demo` runs"),
    "make test": Check("elsewhere", why="the test suite itself"),
    # -- "Using it"
    "export TOOLRAIL_DEMO_TOOLS=get_weather": Check("fast"),
    "toolrail serve": Check("serve"),
    "toolrail serve --redis-url redis://127.0.0.1:6379/0": Check(
        "help", why="needs a Redis of one's own on 6379 (on a shared machine, another's may be there)",
        instead="toolrail serve --help"),
    "toolrail serve --api-workers 4": Check("serve"),
    "toolrail worker -Q decide,tool.get_weather": Check("serve", why="on the REDIS_URL `toolrail serve` printed"),
    "toolrail tools list": Check("fast"),
    "toolrail tools show get_weather": Check("fast"),
    "toolrail tools check": Check("fast"),
    "toolrail config show": Check("fast"),
    "toolrail config docs": Check("help", why="writes docs/configuration.md, a tracked file: --check renders the same "
                                              "and writes nothing", instead="toolrail config docs --check"),
    'toolrail run "北京明天天气怎么样" --tools get_weather --max-steps 1 --json': Check("slow"),
    "toolrail run \"What's the weather in Beijing tomorrow?\" --trace": Check("slow"),
    'TOOLRAIL_DEMO_TOOLS=transfer toolrail run "Transfer 12 CNY from alice to bob" --tools transfer '
    '--require-approval side_effects':
        Check("elsewhere", why="tests/console/test_console_newcomer.py runs it as printed and approves the transfer at "
                               "the console URL it prints, in chromium"),
    "echo '{“city”：“沪”，“date”：“明天”}' | toolrail repair --tool get_weather": Check("fast"),
    'toolrail generate --schema s.json --prompt "..."': Check("slow", why="s.json: a small schema the test writes"),
    "toolrail model pull": Check("fast"),
    "toolrail model info": Check("fast"),
    "toolrail engine --help": Check("fast", why="engines need a GPU and TensorRT-LLM: their subcommands' --help below"),
    # -- "The job API" (against `toolrail serve`)
    "curl -s localhost:8000/v1/jobs -H 'content-type: application/json' -H 'X-Request-ID: demo-1' -d '{\"messages\": "
    "[{\"role\": \"user\", \"content\": \"北京明天天气怎么样\"}], \"tools\": [\"get_weather\"]}'": Check("serve"),
    "curl -s localhost:8000/v1/jobs/job_…": Check("serve"),
    "curl -N localhost:8000/v1/jobs/job_…/events": Check("serve"),
    "curl -s -X POST localhost:8000/v1/jobs/job_…/cancel": Check("serve"),
    # -- "Write your own tool"
    "export TOOLRAIL_TOOL_MODULES=shop_tools PYTHONPATH=$PWD": Check("fast"),
    "curl -s localhost:8000/v1/jobs -H 'content-type: application/json' -d '{ \"messages\": [{\"role\": \"user\", "
    "\"content\": \"What does A-42 cost?\"}], \"tools\": [\"shop_lookup\"], \"tool_calls\": [{\"id\": \"call_1\", "
    "\"type\": \"function\", \"function\": {\"name\": \"shop_lookup\", \"arguments\": \"{\\\"sku\\\": \\\"A-42\\\"}\"}}]}'":
        Check("serve"),
}

#: The subcommands that need a GPU, TensorRT-LLM, Triton or AWS: checked with --help only.
HELP_ONLY = ["engine plan", "engine build", "engine triton-repo", "engine publish"]


def _scan(text: str) -> tuple[str, bool]:
    """``text`` without its shell comment, and whether a quote is still open at its end."""
    quote, i = "", 0
    while i < len(text):
        char = text[i]
        if char == "\\" and quote != "'":
            i += 2  # an escaped character, quoted or not
            continue
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip(), False
        i += 1
    return text.rstrip(), bool(quote)


def readme_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block of README.md, in order."""
    return [(lang, body) for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), re.S | re.M)]


def block_commands(body: str) -> list[str]:
    """The commands of a block, one per logical line: lines joined while a quote is open or a line ends in ``\\``;
    whitespace collapsed, except inside a quoted argument, whose line breaks become one space (JSON stays JSON)."""
    commands, pending = [], ""
    for line in body.splitlines():
        joined = f"{pending}\n{line}" if pending else line
        command, open_quote = _scan(joined)
        if open_quote or command.endswith("\\"):
            pending = joined.rstrip("\\").rstrip() if not open_quote else joined
            continue
        pending = ""
        command = " ".join(command.split()) if "'" not in command else re.sub(r"\s*\n\s*", " ", command).strip()
        if command:
            commands.append(command)
    return commands


def readme_commands() -> list[tuple[str, list[str]]]:
    """Each README command with the ``export`` lines printed before it (its block's and the blocks' above)."""
    found, exports = [], []
    for lang, body in readme_blocks():
        if lang != "bash":
            continue
        for command in block_commands(body):
            found.append((command, list(exports)))
            if command.startswith("export "):
                exports.append(command)
    return found


def shop_tools_source() -> str:
    return next(body for lang, body in readme_blocks() if lang == "python" and "shop_lookup" in body)


def _fresh_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLRAIL_") and k not in {"REDIS_URL", "PYTHONPATH"}}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])  # the venv's `toolrail`, as after `make`
    return env


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("readme-user")
    (home / "shop_tools.py").write_text(shop_tools_source())
    (home / "s.json").write_text(json.dumps({"type": "object", "properties": {"city": {"type": "string"}},
                                             "required": ["city"], "additionalProperties": False}))
    return home


def sh(command: str, exports: list[str], cwd: Path, *, timeout: float = 120) -> subprocess.CompletedProcess:
    script = "\n".join(["set -e", *exports, command])
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=_fresh_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_every_readme_command_is_checked() -> None:
    printed = [command for command, _ in readme_commands()]
    assert len(printed) >= 20, printed  # the extraction found the README's blocks
    unchecked = [command for command in printed if command not in CHECKS]
    assert not unchecked, f"README commands without a check in CHECKS: {unchecked}"
    stale = [command for command in CHECKS if command not in printed]
    assert not stale, f"checks of commands the README no longer prints: {stale}"


def _cases(kind: str) -> list:
    """pytest params (command, its exports) of the README commands checked as ``kind``."""
    return [pytest.param(command, exports, id=command[:60] + (" (after its block's exports)" if len(exports) > 1 else ""))
            for command, exports in readme_commands() if CHECKS.get(command, Check("?")).kind == kind]


def _expect(command: str, exports: list[str], out: subprocess.CompletedProcess) -> None:
    """What each fast command prints, beyond its exit code."""
    if command == "toolrail tools list":
        assert re.search(r"^get_weather\s", out.stdout, re.M), out.stdout
    elif command == "toolrail tools show get_weather":
        assert json.loads(out.stdout)["name"] == "get_weather"
    elif command == "toolrail tools check":
        assert re.search(r"^ok\s+get_weather\s", out.stdout, re.M), out.stdout
        if "export TOOLRAIL_TOOL_MODULES=shop_tools PYTHONPATH=$PWD" in exports:  # "Write your own tool"
            assert re.search(r"^ok\s+shop_lookup\s", out.stdout, re.M), out.stdout
    elif command == "toolrail config show":
        assert "TOOLRAIL_DEMO_TOOLS=get_weather" in out.stdout.splitlines()
    elif "toolrail repair" in command:
        assert json.loads(out.stdout) == {"city": "Shanghai", "date": "tomorrow", "unit": "celsius"}
    elif command == "toolrail model info":
        assert "present: True" in out.stdout


@pytest.mark.parametrize(("command", "exports"), _cases("fast"))
def test_fast_command_works_as_printed(command: str, exports: list[str], user_dir: Path) -> None:
    out = sh(command, exports, user_dir)
    assert out.returncode == CHECKS[command].rc, f"{command!r} exited {out.returncode}: {out.stderr[-2000:]}"
    _expect(command, exports, out)


@pytest.mark.parametrize(("printed", "exports"), _cases("help"))
def test_help_only_command(printed: str, exports: list[str], user_dir: Path) -> None:
    check = CHECKS[printed]
    assert check.why and check.instead, printed
    out = sh(check.instead, exports, user_dir)
    assert out.returncode == 0, f"{check.instead!r}: {out.stderr[-2000:]}"


def subcommands_shown() -> list[str]:
    """``serve``, ``tools show``, ``engine`` …: each toolrail subcommand a README command names."""
    found = {re.search(r"\btoolrail ([a-z][\w-]*)(?: ([a-z][\w-]*))?", command) for command, _ in readme_commands()}
    return sorted({" ".join(filter(None, match.groups())) for match in found if match})


@pytest.mark.parametrize("sub", sorted(set(subcommands_shown()) | set(HELP_ONLY)))
def test_help_of_each_subcommand_shown(sub: str, user_dir: Path) -> None:
    out = sh(f"toolrail {sub} --help", [], user_dir)
    assert out.returncode == 0 and "usage: toolrail" in out.stdout, out.stderr[-2000:]


# ---------------------------------------------------------------------------------------------- slow: the real model


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize(("command", "exports"), _cases("slow"))
def test_model_command_works_as_printed(command: str, exports: list[str], user_dir: Path) -> None:
    out = sh(command, exports, user_dir, timeout=600)
    assert out.returncode == CHECKS[command].rc, f"{command!r} exited {out.returncode}:\n{out.stdout[-3000:]}\n" \
                                                 f"{out.stderr[-3000:]}"
    if "--json" in command:
        assert json.loads(out.stdout)["status"] == "succeeded"


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
@pytest.mark.model
def test_serve_worker_and_curl_lines_work_as_printed(user_dir: Path) -> None:
    """``toolrail serve`` as printed (on 8000, as the ``curl`` lines expect; skipped when 8000 is taken) in the user's
    folder with the exports of both blocks: it prints its URL and ``export REDIS_URL=…``; ``toolrail worker -Q …``
    on that line answers; the ``curl`` lines of "The job API" and "Write your own tool" answer as their comments say
    (``job_…``: the job id the first one printed). Then ``toolrail serve --api-workers 4`` starts and is ready."""
    if not _port_free(8000):
        pytest.skip("port 8000 is taken on this machine: the README's curl lines name it")
    if shutil.which("curl") is None:
        pytest.skip("no curl here")
    cases = {command: exports for command, exports in readme_commands() if CHECKS[command].kind == "serve"}
    exports = cases["curl -s localhost:8000/v1/jobs/job_…"] + [c for c in CHECKS if c.startswith("export TOOLRAIL_TOOL")]
    serve = _start(user_dir, exports, "toolrail serve")
    try:
        lines = _lines(serve)
        ready, redis_line = lines.get(timeout=180).strip(), lines.get(timeout=10).strip()
        assert ready == "toolrail serve: ready at http://127.0.0.1:8000", ready
        assert redis_line.startswith("export REDIS_URL=redis://127.0.0.1:"), redis_line
        worker = _start(user_dir, [*exports, redis_line], "toolrail worker -Q decide,tool.get_weather")
        try:
            _worker_answers(redis_line.split("=", 1)[1])
        finally:
            _stop(worker)
        post = next(c for c in cases if c.startswith("curl -s localhost:8000/v1/jobs -H") and "get_weather" in c)
        out = sh(post, exports, user_dir)
        job = json.loads(out.stdout)
        assert job["request_id"] == "demo-1" and job["status"] == "queued", out.stdout
        for command in ("curl -N localhost:8000/v1/jobs/job_…/events", "curl -s localhost:8000/v1/jobs/job_…",
                        "curl -s -X POST localhost:8000/v1/jobs/job_…/cancel"):
            out = sh(command.replace("job_…", job["job_id"]), exports, user_dir, timeout=300)
            assert out.returncode == 0 and out.stdout, (command, out.stderr)
        record = json.loads(sh(f"curl -s localhost:8000/v1/jobs/{job['job_id']}", exports, user_dir).stdout)
        # what its comment promises: a status (terminal: the event stream above ran to the end), attempts, calls
        assert record["status"] in {"succeeded", "failed", "needs_review", "cancelled"} and "attempts" in record \
            and "calls" in record, record
        shop = next(c for c in cases if "shop_lookup" in c)
        queued = json.loads(sh(shop, exports, user_dir).stdout)
        deadline = time.monotonic() + 60
        while (record := json.loads(sh(f"curl -s localhost:8000/v1/jobs/{queued['job_id']}", exports,
                                       user_dir).stdout))["status"] not in {"succeeded", "failed", "needs_review"}:
            assert time.monotonic() < deadline, record
            time.sleep(0.5)
        assert record["status"] == "succeeded" and record["calls"][0]["result"] == {"sku": "A-42", "price_cents": 1299}
    finally:
        _stop(serve)
    many = _start(user_dir, exports, "toolrail serve --api-workers 4")
    try:
        assert _lines(many).get(timeout=180).strip() == "toolrail serve: ready at http://127.0.0.1:8000"
    finally:
        _stop(many)


def _start(cwd: Path, exports: list[str], command: str) -> subprocess.Popen:
    return subprocess.Popen(["bash", "-c", "\n".join([*exports, f"exec {command}"])], cwd=cwd, env=_fresh_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)


def _lines(proc: subprocess.Popen) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    return lines


def _stop(proc: subprocess.Popen) -> None:
    from executor.stack import stop_process  # noqa: PLC0415

    stop_process(proc, grace_s=30)


def _worker_answers(redis_url: str) -> None:
    from executor.stack import wait_for_workers  # noqa: PLC0415

    assert wait_for_workers(redis_url, count=2, timeout_s=120) >= 2  # serve's pool and the README's worker
