"""Start a stdio MCP server confined: ``python -m mcpbridge.launch [limits] -- ARGV...``.

The MCP client spawns this module instead of the server's command; it confines itself and then
``exec``s the command, so the server inherits every limit:

- rlimits (address space, CPU seconds, open files, file size, no core dumps), the same kinds the
  tool sandbox sets (``executor.sandbox.process._limits``);
- a scratch directory of its own as working directory and ``HOME`` (the caller removes it);
- an allow-listed environment (``PATH``, ``LANG``, ``LC_ALL``, ``TZ`` and nothing of the worker's);
- no network unless the server was registered with ``network: true`` (a fresh network namespace,
  ``executor.sandbox.child.drop_network``); when that is not possible the launch fails rather
  than run unconfined;
- it dies with its parent (``PR_SET_PDEATHSIG``), so a killed worker leaves no server behind;
- its stdout is bounded (``--max-line-bytes``): this process stays as a relay between the server and
  the worker and stops the server at the first line (one JSON-RPC message) longer than the limit,
  saying so on stderr (``LINE_TOO_LONG``), so the worker never buffers more than that of an answer.

What the per-call tool sandbox has and this does not: a mount namespace hiding the filesystem, a
PID namespace, a uid of its own, Landlock and the seccomp socket filter (docs/mcp.md).
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys

__all__ = ["ALLOWED_ENV", "LINE_TOO_LONG", "launch_argv", "main"]

#: The only variables of the worker's environment a stdio server sees.
ALLOWED_ENV = ("PATH", "LANG", "LC_ALL", "TZ")
#: What the relay writes on stderr (followed by `` <limit> bytes``) when it stopped a server for a long line.
LINE_TOO_LONG = "mcpbridge.launch: the server wrote a line over"


def launch_argv(command: list[str], *, scratch: str, memory_mb: int, cpu_s: int, network: bool,
                max_line_bytes: int) -> list[str]:
    """The argv (after the interpreter) that starts ``command`` confined."""
    argv = ["-m", "mcpbridge.launch", "--scratch", scratch, "--memory-mb", str(memory_mb), "--cpu-s", str(cpu_s),
            "--max-line-bytes", str(max_line_bytes)]
    if network:
        argv.append("--network")
    return [*argv, "--", *command]


def _limit(memory_mb: int, cpu_s: int) -> None:
    memory = memory_mb * 1024 * 1024
    for which, value in {resource.RLIMIT_AS: (memory, memory), resource.RLIMIT_CPU: (cpu_s, cpu_s + 1),
                         resource.RLIMIT_NOFILE: (256, 256), resource.RLIMIT_FSIZE: (64 << 20, 64 << 20),
                         resource.RLIMIT_CORE: (0, 0)}.items():
        resource.setrlimit(which, value)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcpbridge.launch")
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--memory-mb", type=int, default=1024)
    parser.add_argument("--cpu-s", type=int, default=60)
    parser.add_argument("--network", action="store_true")
    parser.add_argument("--max-line-bytes", type=int, default=0, help="0: no relay, the server writes to our stdout")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("mcpbridge.launch: usage: [limits] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    cut = argv.index("--")
    args, command = parser.parse_args(argv[:cut]), argv[cut + 1:]
    from executor.sandbox.child import die_with_parent, drop_network, remember_parent  # noqa: PLC0415

    remember_parent()
    die_with_parent()
    if not args.network:
        how = drop_network()
        if how.startswith("unavailable"):
            print(f"mcpbridge.launch: cannot take the network away ({how}); refusing to start", file=sys.stderr)
            return 126
    os.chdir(args.scratch)
    env = {k: os.environ[k] for k in ALLOWED_ENV if k in os.environ}
    env["HOME"] = env["TMPDIR"] = args.scratch
    _limit(args.memory_mb, args.cpu_s)
    if args.max_line_bytes > 0:
        source, sink = os.pipe()
        child = os.fork()
        if child:
            os.close(sink)
            return _relay(source, child, args.max_line_bytes)
        os.close(source)
        os.dup2(sink, 1)
        os.close(sink)
        remember_parent()
        die_with_parent()  # of the relay, which dies with the worker
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"mcpbridge.launch: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
