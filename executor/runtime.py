"""Per-process dependencies of the executor, built once by whoever starts the process: Redis pool, stores, the
call pipeline, sandbox, decider, and the queues work is published on.

The assembly builds one (the worker process: ``executor.worker.tasks.runtime``; the API: ``app_from_environment``;
``toolrail serve``: ``executor.stack``) and hands it on; nothing looks it up. The run loop and extensions see it
through ``executor.ports.Runtime``. Tests build their own over their own Redis.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import redis

from decider.protocol import Decider
from executor.calls import stages
from executor.calls.breaker import CircuitBreaker
from executor.calls.concurrency import ConcurrencyLimiter
from executor.calls.pipeline import Pipeline
from executor.store.idempotency import IdempotencyStore
from executor.sandbox.boundary import CallRun, Sandbox, SandboxResult
from executor.sandbox.process import ProcessSandbox
from executor.ports import Queues, ToolSource
from executor.store.records import RedisJobStore
from toolrail.logging import get_logger
from toolrail.redis_embed import redis_url as resolve_redis_url
from toolrail.settings import Settings
from toolrail.extensions import TOOL_SOURCES_GROUP, installed
from tools.registry import Registry, default_registry
from tools.spec import ToolSpec

__all__ = ["Runtime", "load_decider"]

log = get_logger("toolrail.runtime")


def load_decider(settings: Settings) -> Decider | None:
    """The configured decider, or None when ``TOOLRAIL_DECIDER=none`` or it cannot be built."""
    if settings.decider == "none":
        return None
    if settings.decider == "custom":
        return _custom_decider(settings)
    from decider.service import get_default_decider  # lazy: torch and the engine load only in a process that decides

    return get_default_decider(settings)


def _custom_decider(settings: Settings) -> Decider | None:
    """``TOOLRAIL_DECIDER_FACTORY=module:function``, called with the settings."""
    import importlib  # noqa: PLC0415

    module_name, _, attr = (settings.decider_factory or "").partition(":")
    if not module_name or not attr:
        log.error("decider.factory_invalid", factory=settings.decider_factory,
                  reason="TOOLRAIL_DECIDER_FACTORY must be module:function")
        return None
    return getattr(importlib.import_module(module_name), attr)(settings)


@dataclass
class Runtime:
    settings: Settings
    redis: redis.Redis
    store: RedisJobStore
    idempotency: IdempotencyStore
    registry: Registry
    sandbox_factory: Callable[[], Sandbox]
    decider_factory: Callable[[Settings], Decider | None] = load_decider
    #: Where this process publishes work (``executor.worker.tasks.QUEUES``); None: it publishes nothing.
    queues: Queues | None = None
    #: Tools beyond the registry (a tenant's MCP servers), each source running its own calls.
    tool_sources: tuple[ToolSource, ...] = field(default_factory=lambda: installed(TOOL_SOURCES_GROUP))
    _sandbox: Sandbox | None = field(default=None, init=False)
    _decider: Any = field(default=None, init=False)
    _decider_loaded: bool = field(default=False, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    @classmethod
    def from_settings(cls, settings: Settings, *, redis_url: str | None = None, queues: Queues | None = None) -> Runtime:
        url = redis_url or resolve_redis_url(settings)  # never a default port: unset is RedisNotConfiguredError
        client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=10,
                                      retry_on_timeout=True)
        return cls(settings=settings, redis=client, store=RedisJobStore(client, ttl_s=settings.job_ttl_s),
                   idempotency=IdempotencyStore(client, ttl_s=settings.idempotency_ttl_s), registry=default_registry(),
                   sandbox_factory=lambda: ProcessSandbox(warm=1), queues=queues)

    @cached_property
    def breaker(self) -> CircuitBreaker:
        """Per-(tool, tenant) circuit breakers, shared through Redis by every process of the deployment."""
        return CircuitBreaker(self.redis, failures=self.settings.breaker_failures, cooldown_s=self.settings.breaker_cooldown_s)

    @cached_property
    def concurrency(self) -> ConcurrencyLimiter:
        """The adaptive per-queue concurrency limits, shared through Redis."""
        s = self.settings
        return ConcurrencyLimiter(self.redis, initial=s.concurrency_initial, minimum=s.concurrency_min,
                                  maximum=s.concurrency_max)

    @cached_property
    def calls(self) -> Pipeline:
        """The call pipeline: every stage a call passes, in order, ending in its runner (``runner_for``)."""
        return Pipeline([
            stages.Slot(self.concurrency, wait_s=self.settings.concurrency_wait_s),
            stages.Admission(self.admission),
            stages.Idempotency(self.idempotency),
            stages.Running(self.store),
            stages.Cancellation(self.store),
            stages.Span(),
            stages.Breaker(self.breaker),
        ], runner=self.runner_for)

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = self.sandbox_factory()
        return self._sandbox

    def tenant_specs(self, tenant: str, names: list[str] | None = None) -> dict[str, ToolSpec]:
        """The tenant's tools from every source beyond the registry (all, or those of ``names`` they provide)."""
        specs: dict[str, ToolSpec] = {}
        for source in self.tool_sources:
            specs.update(source.specs(self, tenant, names))
        return specs

    def _source_of(self, spec: ToolSpec) -> ToolSource | None:
        """The tool source that provides ``spec`` (None: a registered tool, run by the process sandbox)."""
        return next((source for source in self.tool_sources if source.owns(spec)), None)

    def admission(self, spec: ToolSpec) -> AbstractContextManager[None]:
        """What a call of ``spec`` holds from before its idempotency lock to its end: its source's admission (an MCP
        tenant's call slot; none free raises a retryable error and the call goes back to its queue), else nothing."""
        source = self._source_of(spec)
        return nullcontext() if source is None else source.admit(self, spec)

    def runner_for(self, spec: ToolSpec) -> Callable[[ToolSpec, CallRun], SandboxResult]:
        """The call boundary for ``spec``: its source's sandbox, or the process sandbox for a registered tool."""
        source = self._source_of(spec)
        return self.sandbox.run if source is None else lambda spec, call: source.run(self, spec, call)

    def decider(self) -> Decider | None:
        """The decider, built on first use (the model loads once per worker process)."""
        with self._lock:
            if not self._decider_loaded:
                self._decider = self.decider_factory(self.settings)
                self._decider_loaded = True
                log.info("decider.loaded", available=self._decider is not None)
            return self._decider

    def tool_env(self, spec: ToolSpec) -> dict[str, str]:
        """Capabilities granted to a tool process: only networked tools get the ledger's address."""
        if not spec.networked:
            return {}
        url = os.environ.get("TOOLRAIL_LEDGER_URL") or _url_of(self.redis)
        env = {"TOOLRAIL_LEDGER_URL": url}
        if os.environ.get("TOOLRAIL_LEDGER_PREFIX"):
            env["TOOLRAIL_LEDGER_PREFIX"] = os.environ["TOOLRAIL_LEDGER_PREFIX"]
        return env


def _url_of(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    auth = f":{kw['password']}@" if kw.get("password") else ""
    return f"redis://{auth}{kw['host']}:{kw['port']}/{kw.get('db', 0)}"
