"""Typed settings, read from the environment (prefix ``TOOLRAIL_``) at entry points only."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULT_CACHE_DIR", "Settings", "get_settings"]

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "toolrail"


class Settings(BaseSettings):
    """Process-wide configuration. Build it at an entry point and pass it down."""

    model_config = SettingsConfigDict(env_prefix="TOOLRAIL_", extra="ignore")

    #: Redis URL for broker, results and job records. ``REDIS_URL`` (unprefixed) is honoured too.
    redis_url: str | None = Field(default=None, validation_alias="REDIS_URL")
    cache_dir: Path = DEFAULT_CACHE_DIR
    #: ``key:tenant`` pairs, comma separated. Empty: no auth, loopback only.
    api_keys: str = ""
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 1_000_000
    max_json_depth: int = 32
    default_max_reasks: int = 2
    max_reasks_limit: int = 5
    max_steps: int = 4
    job_ttl_s: int = 7 * 24 * 3600
    idempotency_ttl_s: int = 24 * 3600
    #: Decider backend for the decide task: ``embedded``, ``triton`` or ``none``.
    decider: str = "embedded"
    model: str | None = None
    triton_url: str = "127.0.0.1:8001"
    triton_model: str = "tensorrt_llm_bls"
    visibility_timeout_s: int = 3600
    #: Hard time limit of a Celery task; None: derived from ``visibility_timeout_s`` (kept below it).
    task_time_limit_s: int | None = None
    #: Seconds between reconciler sweeps in the API process (0: off). A job whose status has not
    #: changed for longer than visibility timeout + task time limit gets its work queued again.
    reconcile_interval_s: float = 30.0
    #: Per-tenant token bucket on the API: sustained requests/s and burst; 0 turns it off.
    rate_limit_per_s: float = 1000.0
    rate_limit_burst: int = 2000
    #: Circuit breaker per tool: consecutive failures that open it, seconds before a half-open probe.
    breaker_failures: int = 5
    breaker_cooldown_s: float = 30.0
    #: Adaptive concurrency per tool queue (gradient limiter shared through Redis).
    concurrency_initial: int = 16
    concurrency_min: int = 4
    concurrency_max: int = 256
    #: How long a call waits for a concurrency slot before it is retried later.
    concurrency_wait_s: float = 5.0
    sandbox_network: bool = False

    def tenants_by_key(self) -> dict[str, str]:
        """Parse ``api_keys`` into ``{key: tenant}``."""
        pairs: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in self.api_keys.split(","))):
            key, _, tenant = item.partition(":")
            pairs[key] = tenant or key
        return pairs


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, cached per process."""
    return Settings()
