"""One tool call's way through the worker: an ordered list of stages, each a small class with ``next``.

    slot → admission → idempotency → running → cancellation → span → breaker → runner

The run loop (``executor.runs.loop.run_call``) decides *whether* a call runs and records what came of it;
everything that wraps the side effect itself is a stage here, in this one order, as Temporal's activity
interceptors and httpx's transports are. A stage gets the :class:`Invocation` and ``next`` (the rest of the
pipeline) and returns an :class:`Outcome`: it may act before and after ``next``, change the invocation for the
stages after it, or answer without calling ``next`` (an open breaker, a replayed outcome). The runner at the end
is the call boundary (``Sandbox.run``: the process sandbox, or an extension's tool source).

Adding a concern (a quota, say) is one class with ``__call__(invocation, next)`` and one line in the list that
``executor.runtime.Runtime.calls`` builds. Exceptions other than a ``SandboxError`` (Redis down, a retryable
``ConcurrencyLimitedError``, a bug) pass through every stage to the worker task, which retries or ends the call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from executor.errors import SandboxError
from executor.sandbox.boundary import CallRun, SandboxResult
from executor.store.models import CallRecord, RecordedError
from tools.spec import ToolSpec

__all__ = ["Invocation", "Next", "Outcome", "Pipeline", "Runner", "Stage"]


@dataclass
class Invocation:
    """One call on its way through the stages (a stage may replace ``run`` for those after it)."""

    job_id: str
    tenant: str
    call: CallRecord
    spec: ToolSpec
    #: What the runner is told (arguments, env, progress, trace context, cancellation).
    run: CallRun
    #: The call's queue: the concurrency limiter's key.
    queue: str


@dataclass
class Outcome:
    """What came of one call: a result or a typed error, and how (replayed from its idempotency record)."""

    ok: bool
    result: Any = None
    #: The typed error of a failed call.
    error: RecordedError | None = None
    duration_s: float | None = None
    replayed: bool = False
    #: The failure as raised, for the stages that judge it (the breaker); None when replayed from a record.
    failure: SandboxError | None = field(default=None, repr=False)
    #: The runner's whole answer (logs, isolation), when it ran here.
    ran: SandboxResult | None = field(default=None, repr=False)

    @classmethod
    def succeeded(cls, ran: SandboxResult) -> Outcome:
        return cls(ok=True, result=ran.result, duration_s=ran.duration_s, ran=ran)

    @classmethod
    def failed(cls, failure: SandboxError) -> Outcome:
        return cls(ok=False, error=RecordedError.of(failure), failure=failure)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Outcome:
        """An outcome stored by the idempotency stage, replayed."""
        error = record.get("error")
        return cls(ok=bool(record.get("ok")), result=record.get("result"), duration_s=record.get("duration_s"),
                   error=RecordedError.model_validate(error) if error else None, replayed=True)

    def record(self) -> dict[str, Any]:
        """The outcome as the idempotency record stores it (``{"ok", "result"|"error", "duration_s"}``)."""
        if self.ok:
            return {"ok": True, "result": self.result, "duration_s": self.duration_s}
        record: dict[str, Any] = {"ok": False, "error": self.error.model_dump() if self.error else None}
        if self.error and self.error.type == "call_cancelled":
            record["cancelled"] = True  # stopped mid-run: whatever it changed before the kill may stand
        return record


#: ``next(invocation)``: the rest of the pipeline.
Next = Callable[[Invocation], Outcome]
#: The call boundary for a spec: ``runner_for(spec)(spec, call) -> SandboxResult``.
Runner = Callable[[ToolSpec], Callable[[ToolSpec, CallRun], SandboxResult]]


class Stage(Protocol):
    def __call__(self, invocation: Invocation, next: Next) -> Outcome:  # noqa: A002 - the interceptor's own word
        ...


class Pipeline:
    """The stages in order, ending in the runner; calling it runs one call through all of them."""

    def __init__(self, stages: Sequence[Stage], runner: Runner) -> None:
        self.stages = tuple(stages)
        self._runner = runner
        chain: Next = self._run
        for stage in reversed(self.stages):
            chain = _link(stage, chain)
        self._chain = chain

    def __call__(self, invocation: Invocation) -> Outcome:
        return self._chain(invocation)

    def with_stage(self, stage: Stage, *, before: type | None = None) -> Pipeline:
        """A copy with ``stage`` inserted before the first stage of type ``before`` (last, before the runner, if None)."""
        stages = list(self.stages)
        at = next((i for i, s in enumerate(stages) if before is not None and isinstance(s, before)), len(stages))
        stages.insert(at, stage)
        return Pipeline(stages, self._runner)

    def _run(self, invocation: Invocation) -> Outcome:
        """The end of the line: the call boundary; a ``SandboxError`` becomes a failed outcome."""
        run = self._runner(invocation.spec)
        try:
            return Outcome.succeeded(run(invocation.spec, invocation.run))
        except SandboxError as exc:
            return Outcome.failed(exc)


def _link(stage: Stage, next_: Next) -> Next:
    return lambda invocation: stage(invocation, next_)
