"""OpenAI's shapes through the real job API, real Redis and real workers: tool calls, whole
conversations, ``GET /v1/models`` with the openai SDK, and one request id per request."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from tests.harness.jobs import wait_terminal

#: The values of the calls are stated here: the check grounds a call's values in the conversation.
ASK = {"role": "user", "content": "What's the weather in Beijing tomorrow, and in Paris today?"}
WEATHER_CALL = {"id": "call_abc", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Beijing", "date": "tomorrow"})}}


def _submit(client: httpx.Client, body: dict, **headers: str) -> dict:
    response = client.post("/v1/jobs", json=body, headers=headers)
    assert response.status_code == 202, response.text
    return response.json()


def test_openai_shaped_tool_calls_run(client: httpx.Client) -> None:
    broken = {"id": "call_def", "type": "function",
              "function": {"name": "get_weather", "arguments": "{'city': 'Paris', 'date': 'today',}"}}  # broken JSON: the check repairs it
    created = _submit(client, {"messages": [ASK], "tools": ["get_weather"], "tool_calls": [WEATHER_CALL, broken]})
    job = wait_terminal(client, created["job_id"])
    assert job["status"] == "succeeded", job
    by_index = {call["index"]: call for call in job["calls"]}
    assert by_index[0]["arguments"]["city"] == "Beijing" and by_index[0]["result"]["date"] == "tomorrow"
    assert by_index[1]["arguments"] == {"city": "Paris", "date": "today", "unit": "celsius"}
    assert all(call["status"] == "succeeded" for call in job["calls"])


def test_flat_and_openai_shapes_mix(client: httpx.Client) -> None:
    created = _submit(client, {"messages": [ASK], "tools": ["get_weather"], "tool_calls": [
        WEATHER_CALL, {"name": "get_weather", "arguments": {"city": "Paris", "date": "today"}}]})
    job = wait_terminal(client, created["job_id"])
    assert job["status"] == "succeeded", job
    assert sorted(c["arguments"]["city"] for c in job["calls"]) == ["Beijing", "Paris"]


def test_full_openai_conversation_is_accepted_and_normalized(client: httpx.Client) -> None:
    # what an openai SDK user sends back: the SDK's reply message dumped as is, then the tool result
    conversation = [
        {"role": "developer", "content": "You answer with tools."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Beijing tomorrow, "},
                                     {"type": "text", "text": "then in Paris today?"}]},
        {"role": "assistant", "content": None, "refusal": None, "annotations": [], "audio": None, "function_call": None,
         "tool_calls": [WEATHER_CALL]},
        {"role": "tool", "tool_call_id": "call_abc", "content": json.dumps({"temperature": 21})},
    ]
    next_call = {"id": "call_ghi", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "date": "today"})}}
    created = _submit(client, {"messages": conversation, "tools": ["get_weather"], "tool_calls": [next_call]})
    job = wait_terminal(client, created["job_id"])
    assert job["status"] == "succeeded", job
    assert job["calls"][0]["arguments"]["city"] == "Paris"
    stored = job["messages"]
    assert [m["role"] for m in stored] == ["system", "user", "assistant", "tool"]
    assert stored[1]["content"] == "Weather in Beijing tomorrow, then in Paris today?"
    assert stored[2]["tool_calls"] == [WEATHER_CALL] and "refusal" not in stored[2]
    assert stored[3]["tool_call_id"] == "call_abc"


def test_assistant_calls_with_object_arguments_are_stored_as_openai_strings(client: httpx.Client) -> None:
    conversation = [{"role": "user", "content": "Paris?"},
                    {"role": "assistant", "tool_calls": [{"id": "c1", "name": "get_weather",
                                                          "arguments": {"city": "Paris", "date": "today"}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    created = _submit(client, {"messages": conversation, "tools": ["get_weather"], "tool_calls": []})
    job = client.get(f"/v1/jobs/{created['job_id']}").json()
    call = job["messages"][1]["tool_calls"][0]
    assert call == {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments":
                                                                   '{"city": "Paris", "date": "today"}'}}


@pytest.mark.parametrize(("messages", "status", "error_type"), [
    ([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "nope", "content": "x"}], 422, "unknown_tool_call_id"),
    ([{"role": "assistant", "tool_calls": [WEATHER_CALL]}, {"role": "tool", "tool_call_id": "call_abc", "content": "a"},
      {"role": "tool", "tool_call_id": "call_abc", "content": "b"}], 422, "duplicate_tool_result"),
    ([{"role": "tool", "content": "no id"}], 422, "validation_error"),
    ([{"role": "user", "content": "x", "tool_calls": [WEATHER_CALL]}], 422, "validation_error"),
    ([{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather"}}]}], 422, "validation_error"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}], 422, "validation_error"),
])
def test_bad_conversations_are_typed_4xx(client: httpx.Client, messages: list, status: int, error_type: str) -> None:
    response = client.post("/v1/jobs", json={"messages": messages, "tools": ["get_weather"], "tool_calls": []})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == error_type and error["message"] and isinstance(error["details"], dict)


def test_bad_openai_call_names_its_own_shape(client: httpx.Client) -> None:
    response = client.post("/v1/jobs", json={"tool_calls": [{"type": "function", "function": {"nam": "x"}}]})
    assert response.status_code == 422
    locations = [e["loc"] for e in response.json()["error"]["details"]["errors"]]
    assert all("flat" not in loc for loc in locations), locations  # only the OpenAI shape's errors
    assert ["body", "tool_calls", 0, "openai", "function", "name"] in locations


# ----------------------------------------------------------------- /v1/models, /v1/tools and keys


@pytest.fixture(scope="module")
def keyed_api(runtime) -> Iterator[str]:
    """The API with keys configured and the embedded decider named (the model is not loaded for listing)."""
    from executor.api.app import create_app
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    settings = Settings(api_keys="key-a:acme", decider="embedded", model="my-org/my-model")
    with api_server(create_app(settings, runtime, enqueue=lambda job: None,
                               ping_workers=lambda: 1, mount_openai=False)) as base:
        yield base


def test_openai_sdk_lists_the_served_model(keyed_api: str) -> None:
    client = openai.OpenAI(base_url=f"{keyed_api}/v1", api_key="key-a", max_retries=0, timeout=10)
    models = client.models.list()
    assert [m.id for m in models.data] == ["my-org/my-model"]
    assert models.data[0].object == "model" and models.data[0].owned_by == "toolrail"
    assert client.models.retrieve("my-org/my-model").id == "my-org/my-model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_models_and_tools_need_a_key_when_keys_are_set(keyed_api: str) -> None:
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed_api}/v1", api_key="wrong", max_retries=0, timeout=10).models.list()
    for path in ("/v1/tools", "/v1/models"):
        anonymous = httpx.get(f"{keyed_api}{path}", timeout=10)
        assert anonymous.status_code == 401, (path, anonymous.text)
        assert anonymous.json()["error"]["type"] == "unauthorized"
        keyed = httpx.get(f"{keyed_api}{path}", headers={"Authorization": "Bearer key-a"}, timeout=10)
        assert keyed.status_code == 200, (path, keyed.text)
        if path == "/v1/tools":
            assert "get_weather" in {t["name"] for t in keyed.json()["tools"]}


def test_models_lists_nothing_without_a_decider(client: httpx.Client) -> None:
    # the session API runs with TOOLRAIL_DECIDER=none: nothing is served
    assert client.get("/v1/models").json() == {"object": "list", "data": []}
    assert client.get("/v1/tools").status_code == 200  # no keys configured: open on loopback


# ----------------------------------------------------------------- one request id


@pytest.fixture(scope="module")
def completions_api(runtime, tmp_path_factory) -> Iterator[str]:
    """The job API with the OpenAI route over a tiny random model (real engine, real tokenizer)."""
    from decider.embedded import EmbeddedEngine
    from decider.model import ModelError, resolve_model_path, tiny_random_model
    from decider.openai_api import create_router
    from decider.service import EmbeddedDecider
    from executor.api.app import create_app
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    try:
        resolve_model_path(None, pull=False)
    except ModelError as exc:  # only the missing model skips: any other failure here is a regression
        pytest.skip(f"default model tokenizer not available: {exc}")
    engine = EmbeddedEngine.load(tiny_random_model(tmp_path_factory.mktemp("tiny")), max_batch_size=4)
    decider = EmbeddedDecider.from_engine(engine)
    app = create_app(Settings(decider="embedded"), runtime, enqueue=lambda job: None, ping_workers=lambda: 1,
                     mount_openai=False)
    app.include_router(create_router(lambda: decider), prefix="/v1")
    with api_server(app) as base:
        yield base
    engine.close()


def test_completion_id_header_and_logs_share_one_id(completions_api: str) -> None:
    import structlog
    from structlog.testing import LogCapture

    from toolrail.logging import configure_logging

    capture = LogCapture()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, capture])

    def request_lines() -> list[dict]:
        return [e for e in capture.entries if e.get("event") == "http.request" and e.get("path") == "/v1/chat/completions"]

    try:
        client = openai.OpenAI(base_url=f"{completions_api}/v1", api_key="unused", max_retries=0, timeout=120)
        raw = client.chat.completions.with_raw_response.create(
            model="toolrail", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        completion = raw.parse()
        deadline = time.monotonic() + 5  # the access line is written once the response is sent: it may follow it
        while not request_lines() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        configure_logging(force=True)
    request_id = raw.headers["x-request-id"]
    assert completion.id == f"chatcmpl-{request_id}"
    lines = request_lines()
    assert lines and {e["request_id"] for e in lines} == {request_id}
    # the route of an included router is labelled with its full template, not its own suffix
    metrics = httpx.get(f"{completions_api}/metrics", timeout=10).text
    assert 'route="/v1/chat/completions"' in metrics and 'route="/chat/completions"' not in metrics


def test_route_label_is_the_template(client: httpx.Client) -> None:
    created = _submit(client, {"messages": [ASK], "tools": ["get_weather"], "tool_calls": [WEATHER_CALL]})
    client.get(f"/v1/jobs/{created['job_id']}")
    client.get("/v1/no/such/path")
    text = client.get("/metrics").text
    assert 'route="/v1/jobs/{job_id}"' in text
    assert created["job_id"] not in text
    assert 'route="unmatched"' in text
