"""Worker pools of a module's own, and the process tree around a call."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.harness.fixtures import TEST_TOOL_MODULES
from tests.harness.serving import worker_pool

__all__ = ["decider_worker", "parent_pid", "pool_process_of"]


@contextlib.contextmanager
def decider_worker(db_url: str, *, factory: str, env: dict[str, str] | None = None, queues: tuple[str, ...] = (),
                   name: str) -> Iterator[object]:
    """A real worker pool on ``db_url`` with the test tools and ``TOOLRAIL_DECIDER=custom`` from ``factory``, on every
    queue of the deployment and ``queues``: the process while the block runs, stopped when it ends."""
    from executor.stack import deployment_queues

    worker_env = {"TOOLRAIL_DECIDER": "custom", "TOOLRAIL_DECIDER_FACTORY": factory,
                  "TOOLRAIL_TOOL_MODULES": TEST_TOOL_MODULES, "TOOLRAIL_LOG_JSON": "1", **(env or {})}
    log = Path(tempfile.mkdtemp(prefix=f"toolrail-{name}-")) / "worker.log"
    with worker_pool(db_url, queues=deployment_queues(db_url, extra=queues), concurrency=2, env=worker_env,
                     log_file=log, hostname=f"toolrail-{name}@%h") as proc:
        yield proc


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` (None once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def pool_process_of(pid: int) -> int:
    """The Celery pool process above ``pid`` (a tool process, a sandbox's monitor, a deciding process)."""
    for _ in range(6):
        if b"celery" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        parent = parent_pid(pid)
        assert parent is not None, f"process {pid} is gone"
        pid = parent
    raise AssertionError("no Celery pool process above the given pid")
