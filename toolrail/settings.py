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
