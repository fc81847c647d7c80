"""A client that hangs up stops its decoding (issue 18, finding 2: 344 s of decoding for nobody).

The job API as deployed (its middlewares, tenancy and the mounted OpenAI router) runs under
uvicorn on loopback over the session's Redis; the decider is the embedded engine over a tiny
random model, which rarely stops on its own, so a request decodes until its ``max_tokens``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from executor.api.app import create_app
from tests.harness.serving import api_server
from toolrail.settings import Settings, get_settings

KEY = {"Authorization": "Bearer key-disconnect"}
LONG = {"messages": [{"role": "user", "content": "Tell me a very long story."}], "max_tokens": 512,  # the tiny model's context
        "tool_choice": "none"}


@pytest.fixture(scope="module")
def decoding_api(tmp_path_factory, runtime) -> Iterator[tuple[str, object]]:
    from decider.model import ModelError, resolve_model_path, tiny_random_model
    from decider.service import get_default_decider

    try:
        resolve_model_path(None, pull=False)
    except ModelError as exc:  # only the missing model skips: any other failure here is a regression
        pytest.skip(f"default model tokenizer not available: {exc}")
    model = tiny_random_model(tmp_path_factory.mktemp("tiny-decoder"))
    patch = pytest.MonkeyPatch()
    patch.setenv("TOOLRAIL_MODEL", str(model))  # the router's default decider reads the process settings
    patch.setenv("TOOLRAIL_DECIDER", "embedded")
    get_settings.cache_clear()
    decider = get_default_decider(get_settings())
    # a random model repeats itself: the loop guard would end the long attempts these tests need
    decider.config = dataclasses.replace(decider.config, loop_guard=False)
    settings = Settings(api_keys="key-disconnect:gamma", rate_limit_per_s=0, decider="embedded")
    try:
        with api_server(create_app(settings, runtime, enqueue=lambda job: None,
                                   ping_workers=lambda: 1, mount_openai=True)) as base:
            yield base, decider.backend
    finally:
        patch.undo()
        get_settings.cache_clear()


def _wait_active(engine: object, predicate, timeout_s: float) -> float:
    """Seconds until ``predicate(engine.active_requests)`` holds (raises after ``timeout_s``)."""
    started = time.monotonic()
    while not predicate(engine.active_requests):  # type: ignore[attr-defined]
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"active requests still {engine.active_requests} after {timeout_s} s")  # type: ignore[attr-defined]
        time.sleep(0.02)
    return time.monotonic() - started


def test_a_non_streaming_request_stops_decoding_when_its_client_hangs_up(decoding_api) -> None:
    base, engine = decoding_api
    _wait_active(engine, lambda n: n == 0, 30)
    with httpx.Client(base_url=base, timeout=httpx.Timeout(30, read=0.5)) as client:
        warm = client.post("/v1/chat/completions", headers=KEY, json={**LONG, "max_tokens": 4}, timeout=120)
        assert warm.status_code == 200, warm.text  # the model is loaded; now decode for real
        for _attempt in range(5):  # on a fast machine the random model may finish (or stop) within the read timeout
            _wait_active(engine, lambda n: n == 0, 30)
            try:
                client.post("/v1/chat/completions", headers=KEY, json=LONG)  # gives up after 0.5 s and hangs up
            except httpx.ReadTimeout:
                break
        else:
            pytest.fail("every request finished within the client's 0.5 s: nothing to hang up on")
        hung_up = time.monotonic()
    took = _wait_active(engine, lambda n: n == 0, 5)
    assert took < 1.5, f"decoding went on {took:.2f} s after the client left"
    assert time.monotonic() - hung_up < 5


def test_a_streaming_request_stops_decoding_when_its_client_hangs_up(decoding_api) -> None:
    base, engine = decoding_api
    for _attempt in range(5):  # the random model may stop on its own before we hang up: then ask again
        _wait_active(engine, lambda n: n == 0, 30)
        with (httpx.Client(base_url=base, timeout=30) as client,
              client.stream("POST", "/v1/chat/completions", headers=KEY, json={**LONG, "stream": True}) as response):
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    break  # tokens are flowing
            decoding = engine.active_requests >= 1
        if decoding:
            break
    assert decoding, "the model stopped on its own before the client hung up, five times"
    took = _wait_active(engine, lambda n: n == 0, 5)
    assert took < 1.5, f"decoding went on {took:.2f} s after the client left"


def test_a_tools_request_stops_its_re_asks_when_its_client_hangs_up(decoding_api) -> None:
    """Tools mode re-asks in a thread; each new attempt of the hung-up request is cancelled as it starts."""
    base, engine = decoding_api
    _wait_active(engine, lambda n: n == 0, 30)
    lines = {"type": "array", "minItems": 6, "items": {"type": "string", "minLength": 150}}
    tools = [{"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"lines": lines}, "required": ["lines"]}}}]
    ask = {**LONG, "tool_choice": "required", "tools": tools, "max_reasks": 5}  # up to six long attempts
    # hang up early: an attempt that reaches max_tokens now ends the decision at once (a typed
    # generation bound, no re-ask), so on a free machine the whole request can finish within 2 s
    with httpx.Client(base_url=base, timeout=httpx.Timeout(30, read=0.5)) as client, pytest.raises(httpx.ReadTimeout):
        client.post("/v1/chat/completions", headers=KEY, json=ask)
    assert engine.active_requests >= 1  # still decoding when the client left
    took = _wait_active(engine, lambda n: n == 0, 30)
    assert took < 5, f"decoding went on {took:.2f} s after the client left"


def test_the_first_completion_loads_the_model_off_the_event_loop(tmp_path, runtime, monkeypatch) -> None:
    from decider.model import tiny_random_model

    monkeypatch.setenv("TOOLRAIL_MODEL", str(tiny_random_model(tmp_path / "cold")))  # not loaded yet
    monkeypatch.setenv("TOOLRAIL_DECIDER", "embedded")
    get_settings.cache_clear()
    settings = Settings(api_keys="key-disconnect:gamma", rate_limit_per_s=0, decider="embedded")
    with api_server(create_app(settings, runtime, enqueue=lambda job: None,
                               ping_workers=lambda: 1, mount_openai=True)) as base:
        latencies: list[float] = []
        done = threading.Event()

        def probe() -> None:
            with httpx.Client(base_url=base, timeout=30) as client:
                while not done.is_set():
                    started = time.perf_counter()
                    client.get("/healthz")
                    latencies.append(time.perf_counter() - started)
                    time.sleep(0.02)

        prober = threading.Thread(target=probe, daemon=True)
        try:
            prober.start()
            first = httpx.post(f"{base}/v1/chat/completions", headers=KEY, timeout=300,
                               json={**LONG, "max_tokens": 4})
            assert first.status_code == 200, first.text
        finally:
            done.set()
            prober.join(timeout=30)
            get_settings.cache_clear()
    # Before: /healthz got no answer until the model had loaded (7-9 s here). The load still holds the GIL
    # in stretches (weights, torch set-up), so single answers may be slow, never the whole load long.
    # How many probes fit depends on how fast this machine loads the tiny model (18 on a quiet one): a few are enough
    # to show the loop kept answering; a blocked loop shows as one probe as long as the load.
    assert len(latencies) >= 5 and statistics.median(latencies) < 0.1 and max(latencies) < 3.0, (len(latencies),
                                                                                                 max(latencies))
