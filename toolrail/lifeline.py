"""Processes that die with the process that started them, however it dies.

``toolrail serve`` starts a ``redis-server`` and a Celery worker in sessions of their own (so that one signal to
their group stops each whole); a SIGKILLed serve then left them re-parented to init, running for ever. Each child is
started with :func:`dies_with_parent` as its ``preexec_fn``, and each Celery pool process calls
:func:`die_with_parent` after its fork: the kernel sends SIGKILL to it when its parent goes (``PR_SET_PDEATHSIG``).

The kernel's notion of "parent" is the *thread* that forked: a child must be started by a thread that lives as long
as the child should (``executor.stack.SupervisedWorker`` stops its pool from the thread that started it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
from collections.abc import Callable

__all__ = ["die_with_parent", "dies_with_parent"]

PR_SET_PDEATHSIG = 1

try:  # loaded before any fork: nothing to look up in a forked child
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: children outlive a SIGKILLed parent, as before
    _prctl = None


def die_with_parent(parent_pid: int | None = None) -> None:
    """SIGKILL this process when its parent dies; exit at once when it already has (``parent_pid`` was the parent
    at the fork, and is no longer)."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent died between the fork and the prctl


def dies_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child dies with this process (with the calling thread)."""
    parent = os.getpid()
    return lambda: die_with_parent(parent)
