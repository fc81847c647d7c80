"""One exception root: every error the platform raises on purpose is a ``toolrail.errors.ToolrailError`` carrying its
type, HTTP status, retryability and details, which the API maps in one handler."""

from __future__ import annotations

import pytest

from decider.errors import BackendUnavailableError, DeciderError
from engine_build.errors import EngineBuildError
from executor.api.bodies import ApiError
from executor.api.ratelimit import RateLimitedError
from executor.errors import CallCancelledError, ExecutorError, StoreUnavailableError
from mcpbridge.errors import McpServerRejectedError
from toolrail.errors import ToolrailError
from tools.errors import ToolError, UnknownToolError


@pytest.mark.parametrize("root", [ToolError, DeciderError, ExecutorError, ApiError, RateLimitedError, EngineBuildError,
                                  McpServerRejectedError])
def test_every_error_root_is_a_toolrail_error(root: type) -> None:
    assert issubclass(root, ToolrailError)


def test_the_root_carries_what_the_api_maps() -> None:
    assert StoreUnavailableError("down").retryable and StoreUnavailableError("down").status == 503
    assert CallCancelledError("stopped", stopped_after_s=1.0).to_dict() == {
        "type": "call_cancelled", "message": "stopped", "details": {"stopped_after_s": 1.0}}
    assert UnknownToolError("unknown tool 'x'", tool="x").to_dict()["type"] == "unknown_tool"
    api = ApiError(409, "already_decided", "decided", state="approved")
    assert (api.status, api.type, api.details) == (409, "already_decided", {"state": "approved"})
    assert DeciderError("x").to_dict() == {"type": "decider_error", "message": "x", "details": {}}
    assert BackendUnavailableError("backend down").retryable and BackendUnavailableError("down").status == 503
