"""The Responses API in the job API: a response is a job of its tenant, and a conversation chains by its id.

The job API as deployed (its tenancy, the mounted routers) on loopback over the session's Redis, the official
openai SDK as the client; the decider is the embedded engine over a tiny random model with SmolLM2's tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from executor.api.app import create_app
from tests.harness.serving import api_server
from toolrail.settings import Settings, get_settings

NOTE = {"type": "function", "name": "save_note", "description": "save a short note", "strict": True, "parameters": {
    "type": "object", "properties": {"title": {"type": "string", "maxLength": 12}}, "required": ["title"],
    "additionalProperties": False}}


@pytest.fixture(scope="module")
def api(tmp_path_factory, runtime) -> Iterator[str]:
    from decider.model import ModelError, resolve_model_path, tiny_random_model

    try:
        resolve_model_path(None, pull=False)
    except ModelError as exc:  # only the missing model skips: any other failure here is a regression
        pytest.skip(f"default model tokenizer not available: {exc}")
    patch = pytest.MonkeyPatch()
    patch.setenv("TOOLRAIL_MODEL", str(tiny_random_model(tmp_path_factory.mktemp("tiny-responses"))))
    patch.setenv("TOOLRAIL_DECIDER", "embedded")  # the routers' default decider reads the process settings
    get_settings.cache_clear()
    settings = Settings(api_keys="key-resp-a:resp-alpha,key-resp-b:resp-beta", rate_limit_per_s=0, decider="embedded")
    try:
        with api_server(create_app(settings, runtime, enqueue=lambda job: None,
                                   ping_workers=lambda: 1, mount_openai=True)) as base:
            yield base
    finally:
        patch.undo()
        get_settings.cache_clear()


def _client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)


def test_a_response_is_a_job_of_its_tenant_and_chains_by_id(api: str) -> None:
    alpha, beta = _client(api, "key-resp-a"), _client(api, "key-resp-b")
    first = alpha.responses.create(model="toolrail", input="Save a note titled milk.", tools=[NOTE],
                                   tool_choice="required", max_output_tokens=40)
    (call,) = first.output
    job = httpx.get(f"{api}/v1/jobs/{first.id}", headers={"Authorization": "Bearer key-resp-a"}, timeout=10).json()
    assert job["job_id"] == first.id and job["status"] == "succeeded" and job["tenant"] == "resp-alpha"
    assert [c["id"] for c in job["calls"]] == [call.call_id] and job["calls"][0]["status"] == "validated"
    assert alpha.responses.retrieve(first.id).output[0].call_id == call.call_id
    with pytest.raises(openai.NotFoundError):  # another tenant's response is nobody's
        beta.responses.retrieve(first.id)
    answer = [{"type": "function_call_output", "call_id": call.call_id, "output": "saved"}]
    with pytest.raises(openai.BadRequestError) as info:  # nor can another tenant continue it
        beta.responses.create(model="toolrail", previous_response_id=first.id, input=answer, max_output_tokens=4)
    assert info.value.param == "previous_response_id"
    second = alpha.responses.create(model="toolrail", previous_response_id=first.id, input=answer, tools=[NOTE],
                                    tool_choice="none", max_output_tokens=4)
    assert second.previous_response_id == first.id and second.output[0].type == "message"
    assert second.status == "incomplete" and second.incomplete_details.reason == "max_output_tokens"
    stored = httpx.get(f"{api}/v1/jobs/{second.id}", headers={"Authorization": "Bearer key-resp-a"}, timeout=10).json()
    assert [m["role"] for m in stored["messages"]] == ["user", "assistant", "tool", "assistant"]
    with pytest.raises(openai.AuthenticationError):
        _client(api, "wrong").responses.create(model="toolrail", input="hi", max_output_tokens=4)


async def test_an_agents_sdk_run_against_the_job_api(api: str) -> None:
    """What ``toolrail serve`` serves: the OpenAI Agents SDK, unchanged, completes a run with one function tool."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # traces would go to api.openai.com
    client = openai.AsyncOpenAI(base_url=f"{api}/v1", api_key="key-resp-a", max_retries=0, timeout=120)
    ran = []

    @agents.function_tool
    def office_hours() -> str:
        """The office's opening hours."""
        ran.append(1)
        return "9 to 5"

    agent = agents.Agent(name="clerk", instructions="Answer with the office hours.", tools=[office_hours],
                         model=agents.OpenAIResponsesModel(model="toolrail", openai_client=client),
                         model_settings=agents.ModelSettings(tool_choice="required", max_tokens=480))  # the tiny context
    result = await agents.Runner.run(agent, "When is the office open?", max_turns=4)
    assert ran and isinstance(result.final_output, str) and len(result.raw_responses) >= 2
    job = httpx.get(f"{api}/v1/jobs/{result.last_response_id}", headers={"Authorization": "Bearer key-resp-a"},
                    timeout=10).json()
    assert job["tenant"] == "resp-alpha" and job["messages"][-1]["role"] == "assistant"
