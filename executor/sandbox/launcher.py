"""The launcher an extension starts a long-lived command with (``executor.ports.SandboxLauncher``): a scratch directory
under the sandbox's root and the command line of ``executor.sandbox.launch``, the relay that confines it."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence

from executor.sandbox.launch import EXIT_LINE, LINE_TOO_LONG, SERVER_ENV, launch_argv
from executor.sandbox.process import default_scratch_root, module_search_path, prepare_scratch_root

__all__ = ["LAUNCHER", "Launcher"]


class Launcher:
    """``executor.ports.SandboxLauncher``: the scratch directory and the command line that start a command confined."""

    exit_line = EXIT_LINE
    line_too_long = LINE_TOO_LONG

    def scratch_dir(self, prefix: str) -> str:
        """A fresh scratch directory under the sandbox's scratch root (the caller removes it)."""
        return tempfile.mkdtemp(prefix=prefix, dir=prepare_scratch_root(default_scratch_root()))

    def command(self, argv: Sequence[str], *, scratch: str, memory_mb: int, cpu_s: int, network: bool,
                max_line_bytes: int, env: Mapping[str, str],
                read_paths: Sequence[str] = ()) -> tuple[str, list[str], dict[str, str]]:
        """``(executable, arguments, environment)`` of the process that runs ``argv`` confined, with ``env`` declared
        and ``read_paths`` readable."""
        args = launch_argv(list(argv), scratch=scratch, memory_mb=memory_mb, cpu_s=cpu_s, network=network,
                           max_line_bytes=max_line_bytes, read_paths=read_paths)
        return sys.executable, args, {"PYTHONPATH": os.pathsep.join(module_search_path()), SERVER_ENV: json.dumps(dict(env))}


LAUNCHER = Launcher()
