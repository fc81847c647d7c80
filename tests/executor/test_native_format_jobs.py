"""Native tool formats through ``/v1/jobs`` (issue 38), per family: the family's tiny random model renders with its
own template and decodes under its format's constraint (the embedded decider), and the text it wrote — in the
family's syntax — goes to the job API as ``raw_output``, where the family's parser reads it, the registry's schema
validates it and a worker runs the call."""

from __future__ import annotations

import httpx
import pytest
from tests.decider.native_fixtures import FAMILIES, build_family_model
from tests.harness.jobs import wait_terminal

from decider.protocol import DecideRequest
from tools.spec import ToolSpec

#: The demo get_weather's arguments, the city narrowed to two values the demo knows (a subset of its schema).
WEATHER = ToolSpec.from_openai({"name": "get_weather", "description": "weather forecast of a city", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "date"],
    "properties": {"city": {"type": "string", "enum": ["Paris", "Beijing"]},
                   "date": {"type": "string", "enum": ["today", "tomorrow"]}}}})


@pytest.fixture(scope="module")
def family_outputs(tmp_path_factory):
    from decider.embedded import EmbeddedEngine
    from decider.service import DeciderConfig, EmbeddedDecider

    outputs = {}
    for name in FAMILIES:
        engine = EmbeddedEngine.load(build_family_model(name, tmp_path_factory.mktemp(name)), dtype="float32",
                                     max_batch_size=2, max_seq_len=2048)
        try:
            decider = EmbeddedDecider.from_engine(engine, config=DeciderConfig())
            decision = decider.decide(DecideRequest(
                request_id=f"job-{name}", messages=[{"role": "user", "content": "Weather in Paris tomorrow?"}],
                tools=[WEATHER], tool_choice="required", max_tokens=256, max_calls=1))
        finally:
            engine.close()
        outputs[name] = decision
    return outputs


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_familys_native_output_is_parsed_validated_and_run_by_the_job_api(name, family_outputs, client: httpx.Client):
    decision = family_outputs[name]
    assert decision.platform["tool_format"] == FAMILIES[name].tool_format
    (decided,) = decision.tool_calls
    response = client.post("/v1/jobs", json={"raw_output": decision.raw_output, "tools": ["get_weather"]})
    assert response.status_code in (200, 202), response.text
    job = wait_terminal(client, response.json()["job_id"])
    assert job["status"] == "succeeded", job
    (call,) = job["calls"]
    assert call["name"] == "get_weather" and call["status"] == "succeeded"
    assert {k: call["arguments"][k] for k in ("city", "date")} == decided.arguments
    assert call["result"]["city"] == decided.arguments["city"]
