"""MCP fixtures: the executor's real Redis, workers and API (the session's stack, ``tests.harness``),
an API with two tenants' keys, and small SDK-written MCP servers over streamable HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.mcpbridge.mcp_servers import KEYS


@pytest.fixture(scope="session", autouse=True)
def _executor_env(executor_env: None) -> Iterator[None]:
    """MCP's tests run with the executor's workers, tools and settings (the session's stack: ``tests.harness``)."""
    yield


@pytest.fixture(scope="session")
def keyed_api(runtime, worker) -> Iterator[str]:
    """A second API over the same Redis and workers, with API keys for tenants alpha and beta."""
    from executor.api.app import create_app
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    from tests.harness.fixtures import MCP_TEST_SERVERS, mcp_environment

    settings = Settings(api_keys=",".join(f"{k}:{t}" for t, k in KEYS.items()), decider="none")
    with mcp_environment(allow_stdio=True, stdio_read_roots=MCP_TEST_SERVERS, allow_private_urls=True):
        app = create_app(settings, runtime, mount_openai=False)
    with api_server(app) as base:
        yield base


@pytest.fixture(scope="session")
def http_server() -> Iterator[str]:
    """The ``good`` test server on stateless streamable HTTP."""
    from tests.mcpbridge.mcp_servers import serve_http

    url, stop = serve_http("good")
    yield url
    stop()


def tenant_client(base: str, tenant: str) -> httpx.Client:
    return httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {KEYS[tenant]}"})
