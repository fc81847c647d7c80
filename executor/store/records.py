"""Job records in Redis: the source of truth for every job's state.

Celery's own result backend answers PENDING for unknown ids; clients need more, so
every job has its own record, keyed by job id, owned by a tenant, carrying the
``request_id``:

    tr:job:<id>            JSON of the job (status, conversation, attempts, error, ...: ``executor.store.models``)
    tr:job:<id>:calls      hash call_id → JSON of the call
    tr:job:<id>:pending    calls not yet terminal
    tr:job:<id>:events     stream of state changes (Server-Sent Events read it)
    tr:job:<id>:statuses   stream of its status changes alone (a waiter reads it: woken by no call or progress event)
    tr:job:<id>:cancelled  set in the write that cancels the job: what a running call's watch reads
    tr:tenant:<t>:jobs     sorted set of job ids by creation time
    tr:idemkey:<t>:<key>   Idempotency-Key of the API → {job_id, body_hash}
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol

import redis

from executor import metrics
from executor.errors import IdempotencyConflictError, JobNotFoundError, StoreUnavailableError
from executor.store.models import DECIDING_JOB, NOT_STARTED, TERMINAL_CALL, TERMINAL_JOB, CallRecord, JobRecord

__all__ = ["CallRecord", "JobRecord", "JobStore", "NOT_STARTED", "RedisJobStore", "StoredJob", "TERMINAL_CALL", "TERMINAL_JOB"]


class StoredJob(NamedTuple):
    """A job with its calls as read from the store, and the JSON its record was read from: an update that
    starts from it (``update(..., read=...)``) needs no read of its own while nobody has written the job since."""

    job: JobRecord
    raw: bytes


#: Jobs waiting for approval, scored by their approval deadline.
WAITING_KEY = "tr:awaiting"


class JobStore(Protocol):
    def create(self, job: JobRecord, *, idempotency_key: str | None = None, body_hash: str | None = None) -> tuple[JobRecord, bool]: ...
    def get(self, job_id: str, *, tenant: str | None = None) -> JobRecord: ...
    def update(self, job_id: str, mutate: Callable[[JobRecord], None], *, event: dict[str, Any] | None = None,
               read: StoredJob | None = None) -> JobRecord: ...
    def set_calls(self, job_id: str, calls: list[CallRecord], *, step: int = 0) -> None: ...
    def get_call(self, job_id: str, call_id: str) -> CallRecord: ...
    def put_call(self, job_id: str, call: CallRecord) -> None: ...
    def add_call(self, job_id: str, call: CallRecord) -> CallRecord | None: ...
    def settle_calls(self, job_id: str, calls: list[CallRecord], *, step: int, discard: set[str],
                     keep_stale: Callable[[CallRecord], bool] = ...) -> int: ...
    def finish_call(self, job_id: str, call: CallRecord) -> int: ...
    def end_unstarted(self, job_id: str) -> int: ...
    def finish_call_and_read(self, job_id: str, call: CallRecord) -> tuple[int, StoredJob | None]: ...
    def events(self, job_id: str, *, last_id: str = "0", block_ms: int = 15000) -> Iterator[tuple[str, dict[str, Any]]]: ...


def _run_commands(first: int) -> str:
    """Lua that runs the commands laid out flat in ARGV from ``ARGV[first]`` on (see :class:`_Commands`)."""
    return f"""local i = {first}
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
"""


_FINISH_CALL = """
local target = KEYS[1]
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then
  current = redis.call('HGET', KEYS[4], ARGV[1])
  if current then target = KEYS[4] end  -- a discarded early call: its outcome is kept, no step waits on it
end
if current then
  local status = cjson.decode(current)['status']
  if status == 'succeeded' or status == 'failed' or status == 'validated' or status == 'rejected' then return -1 end
end
redis.call('HSET', target, ARGV[1], ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 1000, '*', 'data', ARGV[3])
local remaining = -2
if target == KEYS[1] then remaining = redis.call('DECR', KEYS[2]) end
-- the outcome's metrics, counted in the same step that made the call final
""" + _run_commands(5) + """if remaining == 0 and ARGV[4] == '1' then  -- the step's last call: the job as it stands now, for advancing the run
  return {remaining, redis.call('GET', KEYS[5]), redis.call('HVALS', KEYS[1]), redis.call('HVALS', KEYS[4])}
end
return remaining
"""

#: Compare-and-set of a job record in one round trip (WATCH + GET + MULTI/EXEC took three): the commands
#: (see _Commands) run only while KEYS[1] still holds ARGV[1], the value the caller read; 0 when it changed.
_CAS = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end\n" + _run_commands(2) + "return 1\n"

#: The commands of one write (see _Commands), run together: one command for the client to send and parse
#: instead of a MULTI/EXEC pipeline of one per write (the client's CPU per command is most of a job's store cost).
_EXEC = _run_commands(1)


#: A job's record, calls and discarded calls, read together (one command for the server, one reply to parse).
_GET_JOB = """
return {redis.call('GET', KEYS[1]), redis.call('HVALS', KEYS[2]), redis.call('HVALS', KEYS[3])}
"""

#: Write a call where it lives (its step's hash, or the discarded hash once the decision dropped it) + its event.
_PUT_CALL = """
local target = KEYS[1]
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then target = KEYS[3] end
redis.call('HSET', target, ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'data', ARGV[3])
"""

#: Queue-time record of a call dispatched while its step is still decoding: written once (HSETNX).
#: Returns nil when written, else the record already there.
_ADD_CALL = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'data', ARGV[3])
  return false
end
return redis.call('HGET', KEYS[1], ARGV[1])
"""

#: Settle a step whose calls were partly queued early, atomically with every finish_call: calls already there
#: keep their record (running or done), the others are written; early calls the decision dropped move to the
#: discarded hash, stale ones are deleted; the pending counter is set to the step's calls not yet terminal.
#: ARGV: ttl, n, n × (id, record, open), then "d" id ... (discard) and "x" id ... (delete).
_SETTLE_CALLS = """
local function open(status)
  return not (status == 'succeeded' or status == 'failed' or status == 'validated' or status == 'rejected')
end
local ttl, n, pending = tonumber(ARGV[1]), tonumber(ARGV[2]), 0
for i = 0, n - 1 do
  local id, record, fresh = ARGV[3 + 3 * i], ARGV[4 + 3 * i], ARGV[5 + 3 * i]
  local current = redis.call('HGET', KEYS[1], id)
  if current then
    if open(cjson.decode(current)['status']) then pending = pending + 1 end
  else
    redis.call('HSET', KEYS[1], id, record)
    if fresh == '1' then pending = pending + 1 end
  end
end
local j = 3 + 3 * n
while j < #ARGV do
  local current = redis.call('HGET', KEYS[1], ARGV[j + 1])
  if current then
    if ARGV[j] == 'd' then redis.call('HSET', KEYS[3], ARGV[j + 1], current) end
    redis.call('HDEL', KEYS[1], ARGV[j + 1])
  end
  j = j + 2
end
redis.call('EXPIRE', KEYS[1], ttl)
if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('EXPIRE', KEYS[3], ttl) end
redis.call('SET', KEYS[2], pending, 'EX', ttl)
return pending
"""


class _Commands:
    """Commands batched into one script call, flat as ``argc, arg...`` (pipeline-shaped for ``executor.metrics``)."""

    def __init__(self) -> None:
        self.args: list[str | bytes | int | float] = []

    def command(self, *args: str | bytes | int | float) -> None:
        self.args += [len(args), *args]

    def hincrby(self, key: str, field: str, amount: int = 1) -> None:
        self.command("HINCRBY", key, field, int(amount))

    def hincrbyfloat(self, key: str, field: str, amount: float) -> None:
        self.command("HINCRBYFLOAT", key, field, repr(float(amount)))


def _time_decision(job: JobRecord, before: str) -> bool:
    """Stamp when a job starts deciding; on leaving, set ``decision_s``. True when a decision just ended."""
    if job.status in DECIDING_JOB and before not in DECIDING_JOB:
        job.decision_started_at, job.decision_s = job.updated_at, None
    elif before in DECIDING_JOB and job.status not in DECIDING_JOB:
        if job.decision_started_at is not None:
            job.decision_s = round(job.updated_at - job.decision_started_at, 6)
        return True
    return False


def _read_job(raw: bytes, calls: list[bytes], discarded: list[bytes]) -> StoredJob:
    """A job record with its calls (by step, then index), and the JSON it was read from."""
    job = JobRecord.model_validate_json(raw)
    job.calls = sorted((CallRecord.model_validate_json(c) for c in calls), key=lambda c: (c.step, c.index))
    job.discarded_calls = sorted((CallRecord.model_validate_json(c) for c in discarded), key=lambda c: (c.step, c.index))
    return StoredJob(job, raw)


def _guard(fn):
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailableError(f"job store unavailable: {exc}") from exc

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


class RedisJobStore:
    """``JobStore`` on Redis."""

    def __init__(self, client: redis.Redis, *, prefix: str = "tr", ttl_s: int = 7 * 24 * 3600) -> None:
        self.redis = client
        self._p = prefix
        self._ttl = ttl_s
        self._finish = client.register_script(_FINISH_CALL)
        self._cas = client.register_script(_CAS)
        self._exec = client.register_script(_EXEC)
        self._put_call = client.register_script(_PUT_CALL)
        self._add_call = client.register_script(_ADD_CALL)
        self._settle = client.register_script(_SETTLE_CALLS)
        self._get = client.register_script(_GET_JOB)
        self._metrics = metrics.metrics_key(prefix)
        #: Non-terminal jobs scored by their last status change: what the reconciler watches.
        self._active = f"{prefix}:active"

    def _k(self, job_id: str, suffix: str = "") -> str:
        return f"{self._p}:job:{job_id}{suffix}"

    def events_key(self, job_id: str) -> str:
        """The Redis stream of the job's state changes (what :meth:`events` reads; async readers read it too)."""
        return self._k(job_id, ":events")

    def statuses_key(self, job_id: str) -> str:
        """The Redis stream of the job's status changes alone (field ``status``), written with each status event."""
        return self._k(job_id, ":statuses")

    @_guard
    def create(self, job: JobRecord, *, idempotency_key: str | None = None, body_hash: str | None = None) -> tuple[JobRecord, bool]:
        """Store a new job (with its ``calls``, if it has any); with an idempotency key, return the existing job
        for the same body.

        Returns ``(job, created)``. Raises ``IdempotencyConflictError`` for the same key with another body.
        """
        if idempotency_key:
            ikey = f"{self._p}:idemkey:{job.tenant}:{idempotency_key}"
            claim = json.dumps({"job_id": job.job_id, "body_hash": body_hash})
            if not self.redis.set(ikey, claim, nx=True, ex=self._ttl):
                existing = json.loads(self.redis.get(ikey) or "{}")
                if existing.get("body_hash") != body_hash:
                    raise IdempotencyConflictError("Idempotency-Key was already used with a different request body",
                                                   idempotency_key=idempotency_key)
                for _ in range(50):  # the first request may still be writing its record
                    try:
                        return self.get(existing["job_id"], tenant=job.tenant), False
                    except JobNotFoundError:
                        time.sleep(0.02)
                raise JobNotFoundError("job for this Idempotency-Key is not readable yet", job_id=existing.get("job_id"))
        ttl, events = self._ttl, self._k(job.job_id, ":events")
        pipe = _Commands()  # one script call: the server runs every write at once, the client parses one reply
        pipe.command("SET", self._k(job.job_id), job.model_dump_json(exclude={"calls", "discarded_calls"}), "EX", ttl)
        pipe.command("ZADD", f"{self._p}:tenant:{job.tenant}:jobs", repr(job.created_at), job.job_id)
        if job.status not in TERMINAL_JOB:
            pipe.command("ZADD", self._active, repr(job.updated_at), job.job_id)
        # A job stored already decided (its client's calls checked where it was submitted) shows every status
        # it passed through, as if queued and decided by a task; its calls, counter and metrics go in the same write.
        statuses = ["queued", "validating", job.status] if job.decision_s is not None else [job.status]
        for status in statuses:
            event = {"type": "status", "status": status, "request_id": job.request_id}
            if status == job.status and job.error and job.status in TERMINAL_JOB:
                event["error"] = job.error.model_dump()
            pipe.command("XADD", events, "MAXLEN", "~", 1000, "*", "data", json.dumps(event, ensure_ascii=False, default=str))
        pipe.command("EXPIRE", events, ttl)
        if job.status not in TERMINAL_JOB:  # what its waiters read (a waiter wants the latest status, not the ones before)
            waiters = self.statuses_key(job.job_id)
            pipe.command("XADD", waiters, "MAXLEN", "~", 100, "*", "status", job.status)
            pipe.command("EXPIRE", waiters, ttl)
        if job.calls:
            calls = self._k(job.job_id, ":calls")
            pipe.command("HSET", calls, *(x for c in job.calls for x in (c.id, c.model_dump_json())))
            pipe.command("EXPIRE", calls, ttl)
            pipe.command("SET", self._k(job.job_id, ":pending"), sum(c.status not in TERMINAL_CALL for c in job.calls),
                         "EX", ttl)
            for call in job.calls:
                if call.status == "validated":
                    metrics.record_call(pipe, self._metrics, tool=metrics.NOT_RUN_TOOL, outcome="validated", seconds=None)
        if job.decision_s is not None:
            metrics.record_decision(pipe, self._metrics, outcome=job.status, seconds=job.decision_s,
                                    reasks=max(0, len(job.attempts) - 1))
        if job.status in TERMINAL_JOB:
            metrics.record_job_finished(pipe, self._metrics, job.status)
        self._exec(args=pipe.args)
        return job, True

    @_guard
    def get(self, job_id: str, *, tenant: str | None = None) -> JobRecord:
        """The job with its calls; ``JobNotFoundError`` if absent or owned by another tenant."""
        raw, calls, discarded = self._get(keys=[self._k(job_id), self._k(job_id, ":calls"), self._k(job_id, ":discarded")])
        if raw is None:
            raise JobNotFoundError(f"job {job_id} not found", job_id=job_id)
        job = _read_job(raw, calls, discarded).job
        if tenant is not None and job.tenant != tenant:
            raise JobNotFoundError(f"job {job_id} not found", job_id=job_id)
        return job

    @_guard
    def update(self, job_id: str, mutate: Callable[[JobRecord], Any], *, event: dict[str, Any] | None = None,
               read: StoredJob | None = None) -> JobRecord:
        """Read-modify-write the job (compare-and-set: two round trips, retried when another writer got there
        first); emits a status event when the status changes, and the event ``mutate`` returns (a dict), if any.

        ``read``: the job as the caller just read it from this store; the first attempt starts from its JSON (one
        round trip) and, when the job has changed since, the write is refused and retried from a fresh read.
        ``mutate`` may thus run more than once; only the run whose write lands counts.
        """
        key = self._k(job_id)
        known = read.raw if read is not None else None
        while True:
            raw = known if known is not None else self.redis.get(key)
            known = None  # a retry reads the record afresh
            if raw is None:
                raise JobNotFoundError(f"job {job_id} not found", job_id=job_id)
            job = JobRecord.model_validate_json(raw)
            before = job.status
            extra = mutate(job)
            job.updated_at = time.time()
            decided = _time_decision(job, before)
            pipe = _Commands()
            pipe.command("SET", key, job.model_dump_json(exclude={"calls", "discarded_calls"}), "KEEPTTL")
            if decided:
                metrics.record_decision(pipe, self._metrics, outcome=job.status, seconds=job.decision_s,
                                        reasks=max(0, len(job.attempts) - 1))
            if job.status in TERMINAL_JOB and before not in TERMINAL_JOB:
                metrics.record_job_finished(pipe, self._metrics, job.status)
            events = []
            if job.status != before:
                events.append({"type": "status", "status": job.status, "request_id": job.request_id,
                               **({"error": job.error.model_dump()} if job.error and job.status in TERMINAL_JOB else {})})
            if event:
                events.append(event)
            if isinstance(extra, dict):  # an event the mutation itself produced (it only happened once)
                events.append(extra)
            for item in events:
                pipe.command("XADD", self._k(job_id, ":events"), "MAXLEN", "~", 1000, "*", "data",
                             json.dumps(item, ensure_ascii=False, default=str))
                if item.get("type") == "status" and isinstance(item.get("status"), str):  # NOMKSTREAM: a job stored
                    # before this stream existed gets none (and no key without a TTL); its waiters read the events
                    pipe.command("XADD", self.statuses_key(job_id), "NOMKSTREAM", "MAXLEN", "~", 100, "*", "status",
                                 item["status"])
            if job.status == "cancelled" and before != "cancelled":  # running calls watch for it (cheap to poll)
                pipe.command("SET", self._k(job_id, ":cancelled"), "1", "EX", self._ttl)
            if job.status in TERMINAL_JOB:
                pipe.command("ZREM", self._active, job_id)
            elif job.status != before:
                pipe.command("ZADD", self._active, repr(job.updated_at), job_id)
            if int(self._cas(keys=[key], args=[raw, *pipe.args])):
                return job

    def cancelled(self, job_id: str) -> bool:
        """Whether the job was cancelled (one EXISTS: what a running call polls)."""
        return bool(self.redis.exists(self._k(job_id, ":cancelled")))

    @_guard
    def end_unstarted(self, job_id: str) -> int:
        """On a cancelled job (its mark set), end every call not started (``pending``, ``awaiting_approval``) as
        ``failed`` (:data:`NOT_STARTED`); nothing on another job. The cancel calls it, and so does whoever writes
        calls after a status move: whichever comes last finds them. Returns how many it ended."""
        key, mark = self._k(job_id, ":calls"), self._k(job_id, ":cancelled")

        def end(pipe: redis.client.Pipeline) -> int:  # a call starting meanwhile: its own cancellation watch stops it
            calls = [c for c in map(CallRecord.model_validate_json, pipe.hvals(key))
                     if c.status in {"pending", "awaiting_approval"}] if pipe.exists(mark) else []
            pipe.multi()
            for call in calls:
                call.status, call.error, call.finished_at = "failed", NOT_STARTED, time.time()
                pipe.hset(key, call.id, call.model_dump_json())
                pipe.xadd(self._k(job_id, ":events"), {"data": json.dumps({"type": "call", "call_id": call.id, "index":
                          call.index, "name": call.name, "status": "failed"})}, maxlen=1000)
            return len(calls)

        return self.redis.transaction(end, key, mark, value_from_callable=True)

    @_guard
    def set_calls(self, job_id: str, calls: list[CallRecord], *, step: int = 0) -> None:
        """Store one step's calls and arm the pending counter; earlier steps' calls stay (the run's journal).

        A decision redone for the same step (its worker died) replaces that step's calls: any call of the
        step that the new decision does not make is dropped, so no orphan is ever run.
        """
        calls_key = self._k(job_id, ":calls")
        new_ids = {c.id for c in calls}
        stale = [cid for cid, raw in self.redis.hgetall(calls_key).items()
                 if cid.decode() not in new_ids and CallRecord.model_validate_json(raw).step == step]
        pipe = self.redis.pipeline()
        if stale:
            pipe.hdel(calls_key, *stale)
        if calls:
            pipe.hset(calls_key, mapping={c.id: c.model_dump_json() for c in calls})
            pipe.expire(calls_key, self._ttl)
        pending = sum(1 for c in calls if c.status not in TERMINAL_CALL)
        pipe.set(self._k(job_id, ":pending"), pending, ex=self._ttl)
        for call in calls:
            if call.status == "validated":
                metrics.record_call(pipe, self._metrics, tool=metrics.NOT_RUN_TOOL, outcome="validated", seconds=None)
        pipe.execute()

    @_guard
    def get_call(self, job_id: str, call_id: str) -> CallRecord:
        raw = self.redis.hget(self._k(job_id, ":calls"), call_id)
        if raw is None:
            raise JobNotFoundError(f"call {call_id} of job {job_id} not found", job_id=job_id, call_id=call_id)
        return CallRecord.model_validate_json(raw)

    @_guard
    def put_call(self, job_id: str, call: CallRecord) -> None:
        """Overwrite a non-terminal call (e.g. mark it running) and emit an event (a discarded call stays discarded)."""
        event = json.dumps({"type": "call", "call_id": call.id, "index": call.index, "name": call.name, "status": call.status})
        self._put_call(keys=[self._k(job_id, ":calls"), self._k(job_id, ":events"), self._k(job_id, ":discarded")],
                       args=[call.id, call.model_dump_json(), event])

    @_guard
    def add_call(self, job_id: str, call: CallRecord) -> CallRecord | None:
        """Store a call queued before its step's decision ended; None when stored, else the record already there."""
        event = json.dumps({"type": "call", "call_id": call.id, "index": call.index, "name": call.name,
                            "status": call.status, "early": True})
        existing = self._add_call(keys=[self._k(job_id, ":calls"), self._k(job_id, ":events")],
                                  args=[call.id, call.model_dump_json(), event, self._ttl])
        return CallRecord.model_validate_json(existing) if existing else None

    @_guard
    def settle_calls(self, job_id: str, calls: list[CallRecord], *, step: int, discard: set[str],
                     keep_stale: Callable[[CallRecord], bool] = lambda call: False) -> int:
        """Store a decided step's calls where some were queued early (``add_call``); returns calls still pending.

        Calls already stored keep their record; ``discard`` (early calls the decision did not make) move to the
        job's discarded calls; other calls of the step from an earlier decision are dropped, or discarded when
        ``keep_stale`` says so (a read-only call that may have run). One script: atomic with every ``finish_call``.
        """
        new_ids = {c.id for c in calls}
        stale = [CallRecord.model_validate_json(raw) for cid, raw in self.redis.hgetall(self._k(job_id, ":calls")).items()
                 if cid.decode() not in new_ids and cid.decode() not in discard]
        args: list[str | int] = [self._ttl, len(calls)]
        for call in calls:
            args += [call.id, call.model_dump_json(), int(call.status not in TERMINAL_CALL)]
        for cid in sorted(discard - new_ids):
            args += ["d", cid]
        for call in stale:
            if call.step == step:
                args += ["d" if keep_stale(call) else "x", call.id]
        pending = int(self._settle(keys=[self._k(job_id, ":calls"), self._k(job_id, ":pending"),
                                         self._k(job_id, ":discarded")], args=args))
        validated = [c for c in calls if c.status == "validated"]
        if validated:
            pipe = self.redis.pipeline(transaction=False)
            for _ in validated:
                metrics.record_call(pipe, self._metrics, tool=metrics.NOT_RUN_TOOL, outcome="validated", seconds=None)
            pipe.execute()
        return pending

    @_guard
    def finish_call(self, job_id: str, call: CallRecord) -> int:
        """Record a terminal call once. Returns calls still pending, -1 if it was already terminal, -2 for a
        discarded call (outcome recorded, no step waits on it)."""
        return self._finish_call(job_id, call, read=False)[0]

    @_guard
    def finish_call_and_read(self, job_id: str, call: CallRecord) -> tuple[int, StoredJob | None]:
        """:meth:`finish_call`, and when it ended the step (0 pending) the job with its calls as they stood at that
        moment, read in the same script (None otherwise, or when the job record is gone): what advancing the run
        needs, without reading it again."""
        return self._finish_call(job_id, call, read=True)

    def _finish_call(self, job_id: str, call: CallRecord, *, read: bool) -> tuple[int, StoredJob | None]:
        event = json.dumps({"type": "call", "call_id": call.id, "index": call.index, "name": call.name,
                            "status": call.status, **({"error": call.error.model_dump()} if call.error else {})},
                           ensure_ascii=False, default=str)
        counts = _Commands()  # applied by the script only when this process makes the call final: counted once
        metrics.record_call(counts, self._metrics, tool=call.name if call.queue else metrics.NOT_RUN_TOOL,
                            outcome=call.status, seconds=call.duration_s)
        reply = self._finish(keys=[self._k(job_id, ":calls"), self._k(job_id, ":pending"), self._k(job_id, ":events"),
                                   self._k(job_id, ":discarded"), self._k(job_id)],
                             args=[call.id, call.model_dump_json(), event, int(read), *counts.args])
        if not isinstance(reply, list):
            return int(reply), None
        remaining, raw, calls, discarded = reply
        return int(remaining), _read_job(raw, calls, discarded) if raw is not None else None

    @_guard
    def stale_jobs(self, *, older_than_s: float, limit: int = 100) -> list[str]:
        """Non-terminal jobs whose status has not changed for ``older_than_s`` seconds."""
        cutoff = time.time() - older_than_s
        return [j.decode() for j in self.redis.zrangebyscore(self._active, "-inf", cutoff, start=0, num=limit)]

    @_guard
    def touch_active(self, job_id: str) -> None:
        """Restart the staleness clock of a job (after the reconciler re-queued its work)."""
        self.redis.zadd(self._active, {job_id: time.time()}, xx=True)

    @_guard
    def forget_active(self, job_id: str) -> None:
        self.redis.zrem(self._active, job_id)

    @_guard
    def mark_waiting(self, job: JobRecord) -> None:
        """Remember when a job waiting for approval expires (the reconciler's sweep reads it)."""
        self.redis.zadd(WAITING_KEY, {job.job_id: job.approval_deadline_at or time.time()})

    @_guard
    def forget_waiting(self, job_id: str) -> None:
        self.redis.zrem(WAITING_KEY, job_id)

    @_guard
    def waiting_due(self, *, now: float, limit: int = 100) -> list[str]:
        """Waiting jobs whose approval deadline has passed, oldest first."""
        return [j.decode() for j in self.redis.zrangebyscore(WAITING_KEY, "-inf", now, start=0, num=limit)]

    @_guard
    def list_jobs(self, tenant: str, *, limit: int = 50) -> list[str]:
        return [j.decode() for j in self.redis.zrevrange(f"{self._p}:tenant:{tenant}:jobs", 0, limit - 1)]

    def events(self, job_id: str, *, last_id: str = "0", block_ms: int = 15000) -> Iterator[tuple[str, dict[str, Any]]]:
        """State changes after ``last_id``, blocking up to ``block_ms`` for new ones; ends on a terminal status."""
        key = self._k(job_id, ":events")
        deadline = time.monotonic() + block_ms / 1000
        while time.monotonic() < deadline:
            try:
                chunk = self.redis.xread({key: last_id}, count=100, block=1000)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise StoreUnavailableError(f"job store unavailable: {exc}") from exc
            for _stream, entries in chunk or []:
                for entry_id, fields in entries:
                    last_id = entry_id.decode()
                    data = json.loads(fields[b"data"])
                    yield last_id, data
                    if data.get("type") == "status" and data.get("status") in TERMINAL_JOB:
                        return
