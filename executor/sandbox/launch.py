"""Start a long-lived third-party command (an extension's stdio server) in the tool sandbox:
``python -m executor.sandbox.launch [limits] -- ARGV...`` (``executor.sandbox.launcher`` builds that command line;
an extension gets it as ``executor.ports.LAUNCHER``). This module stays light: it is the relay's whole program.

The extension's client spawns this module instead of the server's command (on a worker for a call, in the API
for a listing). This process is platform code and never runs the
server's: it sets up the namespaces, forks the server's process, which confines itself with the tool
sandbox's own primitives (:mod:`executor.sandbox.linux`: ``confine``, the same as a tool call's) and
``exec``s the command, and stays as its relay. The server gets:

- a **PID namespace** of its own, of which it is PID 1, with a fresh ``/proc`` (no pid of the API, the
  worker or another call is there to read); when it exits the kernel kills whatever it left;
- a **mount namespace** in which the scratch root shows only the server's own scratch dir (its
  working directory, ``HOME`` and ``TMPDIR``; the caller removes it), an **IPC namespace**;
- **no network** (an empty network namespace and the seccomp filter that refuses ``socket(2)``) unless
  registered with ``network: true``; then the host's network, but Landlock lets it ``connect`` over TCP
  to ports ``NETWORK_PORTS`` only (HTTP, HTTPS, DNS) and ``bind`` none, so the platform's Redis and API
  ports are refused on every address (docs/mcp.md says what stays reachable for a stdio MCP server). Without Landlock's
  network rules (ABI < 4) a networked server is not started;
- a **uid of its own** (root workers: ``SANDBOX_UID_BASE`` + this process's pid; others: a user
  namespace of its own mapping only the worker's uid), **no capabilities**, ``no_new_privs``;
- **Landlock**: read-only the command's own files (:func:`own_files`: the executable, its install
  prefix's ``lib``, an interpreter named by its ``#!``), the registration's ``read_paths`` (``--read``;
  checked against the operator's allow-list at registration, never inferred from arguments) and the
  system's libraries (``SYSTEM_READ_PATHS``), read-write its scratch dir; nothing else;
- **rlimits**: address space (``memory_mb``), CPU seconds, processes, open files, file size, no cores;
- an **environment built from nothing**: ``PATH`` (``SANDBOX_PATH``), ``LANG``, ``HOME``, ``TMPDIR``, and
  only the variables the registration declares (``env``; passed in ``SERVER_ENV``, never on argv);
- it dies with its relay (``PR_SET_PDEATHSIG``), which dies with the worker or API;
- its stdout bounded (``--max-line-bytes``): the relay stops it at the first line (one JSON-RPC
  message) longer than the limit, saying so on stderr (``LINE_TOO_LONG``).

The relay ends with one line on stderr, ``sandbox launch: exit CODE`` (``EXIT_LINE``), from which
errors say how the server ended; nothing the server printed is ever quoted. A layer that cannot be
applied fails the start (exit 126, ``sandbox launch: sandbox unavailable: LAYER``); a command that is
not there exits 127.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import sys
from collections.abc import Sequence

from executor.sandbox import linux
from executor.sandbox.child import SANDBOX_UID_BASE, SYSTEM_READ_PATHS

__all__ = ["EXIT_LINE", "LINE_TOO_LONG", "NETWORK_PORTS", "SANDBOX_PATH", "SERVER_ENV", "launch_argv", "main",
           "own_files"]

#: What the relay writes on stderr (followed by `` <limit> bytes``) when it stopped a server for a long line.
LINE_TOO_LONG = "sandbox launch: the server wrote a line over"
#: The relay's last line on stderr: ``sandbox launch: exit <code>`` (negative: killed by that signal).
EXIT_LINE = "sandbox launch: exit"
#: The variable of this process's environment holding the registration's declared variables (a JSON object).
SERVER_ENV = "TOOLRAIL_LAUNCH_ENV"
#: The server's ``PATH`` (the worker's is not passed on).
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
#: The TCP ports a ``network: true`` server may connect to (Landlock); every other port, on any address, is refused.
NETWORK_PORTS = (53, 80, 443)
#: Processes (and threads) one server may have at once.
MAX_PROCESSES = 256


def launch_argv(command: list[str], *, scratch: str, memory_mb: int, cpu_s: int, network: bool,
                max_line_bytes: int, read_paths: Sequence[str] = ()) -> list[str]:
    """The argv (after the interpreter) that starts ``command`` confined (``read_paths``: what it may read besides its
    program and the system's libraries, checked by the caller against the operator's allow-list)."""
    argv = ["-m", "executor.sandbox.launch", "--scratch", scratch, "--memory-mb", str(memory_mb), "--cpu-s", str(cpu_s),
            "--max-line-bytes", str(max_line_bytes), *(f"--read={path}" for path in read_paths)]
    if network:
        argv.append("--network")
    return [*argv, "--", *command]


def _executable(name: str) -> str | None:
    if "/" not in name:
        return shutil.which(name, path=SANDBOX_PATH)
    return os.path.abspath(name) if os.path.isfile(name) and os.access(name, os.X_OK) else None


def own_files(command: list[str], exe: str) -> list[str]:
    """What the server may read as its program: the executable (as named and resolved), the ``lib`` folders of the
    prefix it is installed in (``<prefix>/bin/<exe>``; a virtualenv's ``pyvenv.cfg``) and the interpreter of a ``#!``
    script. Never anything its arguments name: what else it reads (a script's folder, its data) is the
    registration's ``read_paths``, under the operator's ``TOOLRAIL_MCP_STDIO_READ_ROOTS``."""
    paths: list[str] = []

    def program(path: str, depth: int = 0) -> None:
        for each in dict.fromkeys([path, os.path.realpath(path)]):
            paths.append(each)
            folder = os.path.dirname(each)
            if os.path.basename(folder) == "bin":
                prefix = os.path.dirname(folder)
                paths.extend([folder, *(os.path.join(prefix, p) for p in ("lib", "lib64", "pyvenv.cfg"))])
        try:
            with open(path, "rb") as fh:
                head = fh.read(256)
        except OSError:
            return
        if head.startswith(b"#!") and depth < 2:
            words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
            if words and words[0].endswith("/env") and len(words) > 1:
                words = [shutil.which(words[1], path=SANDBOX_PATH) or words[1]]
            if words and os.path.isabs(words[0]):
                program(words[0], depth + 1)

    program(exe)
    return paths


def _fenced(paths: list[str], scratch_root: str) -> list[str]:
    """``paths`` less ``/`` and anything at, above or below the scratch root (other calls' scratch dirs)."""
    root = os.path.realpath(scratch_root)
    out = []
    for path in dict.fromkeys(paths):
        real = os.path.realpath(path)
        if real != "/" and os.path.exists(real) and not (
                real == root or real.startswith(root + os.sep) or root.startswith(real + os.sep)):
            out.append(path)
    return out


def _limits(memory_mb: int, cpu_s: int) -> None:
    memory = memory_mb * 1024 * 1024
    for which, value in {resource.RLIMIT_AS: (memory, memory), resource.RLIMIT_CPU: (cpu_s, cpu_s + 1),
                         resource.RLIMIT_NOFILE: (256, 256), resource.RLIMIT_FSIZE: (64 << 20, 64 << 20),
                         resource.RLIMIT_CORE: (0, 0), resource.RLIMIT_NPROC: (MAX_PROCESSES, MAX_PROCESSES)}.items():
        resource.setrlimit(which, value)


def _declared_env() -> dict[str, str]:
    try:
        declared = json.loads(os.environ.get(SERVER_ENV) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in declared.items()} if isinstance(declared, dict) else {}


def _relay(source: int, child: int, limit: int) -> int:
    """Copy the server's stdout to ours until it ends, or stop it at a line over ``limit`` bytes; its exit code."""
    pending = 0  # bytes of the line being written so far
    while chunk := os.read(source, 65536):
        lines = chunk.split(b"\n")
        longest = max([pending + len(lines[0]), *map(len, lines[1:])])
        pending = pending + len(lines[0]) if len(lines) == 1 else len(lines[-1])
        if longest > limit:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            print(f"{LINE_TOO_LONG} {limit} bytes; it was stopped", file=sys.stderr, flush=True)
            return 1
        view = memoryview(chunk)
        while view:
            view = view[os.write(1, view):]
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])


class _Refused(Exception):
    """A layer of the sandbox that could not be applied: the server is not started."""


def _need(how: str, layer: str) -> str:
    if how.startswith(("unavailable", "failed")):
        raise _Refused(layer)
    return how


def _namespaces(*, scratch: str, reachable: list[str], network: bool, uid: int | None) -> None:
    """In this (the relay) process, before the server's is forked: the namespaces it is born into."""
    if os.geteuid() != 0:
        _need(linux.enter_user_namespace(), "user namespace")
    try:
        linux.private_mounts()
        if uid is not None:
            linux.make_reachable(reachable)  # an unprivileged uid reaches the code and the scratch dir
    except OSError:
        raise _Refused("mount namespace") from None
    if not network:
        _need(linux.drop_network(), "network namespace")
    _need(linux.own_ipc(), "IPC namespace")
    _need(linux.new_pid_namespace(), "PID namespace")


def _server(command: list[str], exe: str, *, scratch: str, read: list[str], network: bool, uid: int | None,
            memory_mb: int, cpu_s: int) -> None:
    """The server's process, PID 1 of its namespace: confine, then exec the command. Never returns."""
    try:
        linux.remember_parent()
        linux.die_with_parent()
        own_proc = "/proc" if linux.mount_own_proc() == "own-proc" else f"/proc/{linux.host_pid()}"
        _limits(memory_mb, cpu_s)
        applied = linux.confine(uid=uid, scratch_dir=scratch, read=read, network=network, own_proc=own_proc)
        if uid is not None and applied["uid"] != str(uid):
            raise _Refused("uid")
        _need("unavailable" if applied["caps"] != "none" else "none", "capabilities")
        _need(applied["filesystem"], "Landlock")
        if network:
            _need(linux.tcp_connect_only(NETWORK_PORTS), "Landlock network rules")
        else:
            _need(applied["sockets"], "seccomp")
        env = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", **_declared_env(), "HOME": scratch, "TMPDIR": scratch}
        os.chdir(scratch)
    except _Refused as exc:
        print(f"sandbox launch: sandbox unavailable: {exc}", file=sys.stderr, flush=True)
        os._exit(126)
    except Exception as exc:  # noqa: BLE001 - a sandbox that cannot be set up must not run the server
        print(f"sandbox launch: sandbox unavailable: {type(exc).__name__}", file=sys.stderr, flush=True)
        os._exit(126)
    try:
        os.execve(exe, command, env)
    except OSError as exc:
        print(f"sandbox launch: cannot start the command ({exc.strerror})", file=sys.stderr, flush=True)
    os._exit(127)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="executor.sandbox.launch")
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--memory-mb", type=int, default=1024)
    parser.add_argument("--cpu-s", type=int, default=60)
    parser.add_argument("--network", action="store_true")
    parser.add_argument("--max-line-bytes", type=int, default=0, help="0: no relay, the server writes to our stdout")
    parser.add_argument("--read", action="append", default=[], help="a path the server may read (repeatable)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("sandbox launch: usage: [limits] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    cut = argv.index("--")
    args, command = parser.parse_args(argv[:cut]), argv[cut + 1:]
    linux.remember_parent()
    linux.die_with_parent()
    scratch = os.path.abspath(args.scratch)
    exe = _executable(command[0])
    if exe is None:
        print("sandbox launch: command not found", file=sys.stderr, flush=True)
        print(f"{EXIT_LINE} 127", file=sys.stderr, flush=True)
        return 127
    read = _fenced([*SYSTEM_READ_PATHS, *own_files(command, exe), *args.read], os.path.dirname(scratch))
    uid = SANDBOX_UID_BASE + os.getpid() if os.geteuid() == 0 else None
    try:
        if uid is not None:
            os.chown(scratch, uid, uid)
            os.chmod(scratch, 0o700)
        _namespaces(scratch=scratch, reachable=[*read, scratch], network=args.network, uid=uid)
    except (_Refused, OSError) as exc:
        print(f"sandbox launch: sandbox unavailable: {exc if isinstance(exc, _Refused) else 'scratch dir'}",
              file=sys.stderr, flush=True)
        print(f"{EXIT_LINE} 126", file=sys.stderr, flush=True)
        return 126
    relay = args.max_line_bytes > 0
    source, sink = os.pipe() if relay else (-1, -1)
    child = os.fork()
    if child == 0:
        if relay:
            os.close(source)
            os.dup2(sink, 1)
            os.close(sink)
        _server(command, exe, scratch=scratch, read=read, network=args.network, uid=uid, memory_mb=args.memory_mb,
                cpu_s=args.cpu_s)
    if relay:
        os.close(sink)
        code = _relay(source, child, args.max_line_bytes)
    else:
        code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    print(f"{EXIT_LINE} {code}", file=sys.stderr, flush=True)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
