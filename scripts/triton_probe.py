"""Probe a running Triton server the way the decider uses it; write the results as JSON.

    python scripts/triton_probe.py --url 127.0.0.1:8001 --model llmapi --tokenizer DIR --out probe.json

Checks, each recorded with what was seen:

1. ``start``: the decider's Triton backend connects and accepts the served configs (guided
   decoding on end to end, the client's tensors, input names of the served release).
2. ``guided_1`` / ``guided_16``: 1, then 16 concurrent guided requests, each with its own schema
   (its own enum of one marker); every output must parse and validate against *its* schema.
3. ``length``: a request with ``max_tokens=5`` must end with ``finish_reason == "length"``.
4. ``hangup``: a second client starts a long generation and closes its stream after the first
   text (a decide worker that dies mid-request); the server must go on answering the first
   client's guided requests (no batch slot or BLS instance left stuck).
5. ``qwen_format``: a tool call forced in the Hermes / Qwen2.5 syntax (``<tool_call>{json}</tool_call>``):
   the structural tag of one tool whose only field is an enum of one marker, sent as its EBNF
   (``guided_decoding_guide_type=ebnf_grammar``, what the decider sends for a native format); the
   output must hold exactly that call, read by the decider's own parser for the format. This is the
   check that proves TensorRT-LLM's xgrammar takes the EBNF that toolrail's xgrammar prints.
6. ``raw_stream``: one request sent on a raw gRPC stream without, then with,
   ``triton_enable_empty_final_response``: whether a response flagged
   ``triton_final_response`` arrives within ``--raw-timeout`` seconds. For the release's BLS,
   Triton forwards the closing empty response only with the opt-in (``expected_final_without_opt_in``
   is false); toolrail's LLM-API model flags its last data response final either way.

Exit status 0 when every required check passed, 1 otherwise. Used by ``scripts/gpu_check.sh``
and tested against the protocol double (``tests/decider/test_triton_probe.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import jsonschema  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402

from decider.backend import GenerationRequest  # noqa: E402
from decider.triton import TritonBackend  # noqa: E402
from decider.tool_formats import get_tool_format  # noqa: E402
from decider.triton_wire import ENABLE_EMPTY_FINAL, FINAL_RESPONSE  # noqa: E402

MARKERS = [f"m{index:02d}{chr(97 + index % 26)}" for index in range(16)]


def marker_schema(marker: str) -> dict[str, Any]:
    return {
        "type": "object", "additionalProperties": False, "required": ["marker"],
        "properties": {"marker": {"enum": [marker]}},
    }


def render(tokenizer: Any, text: str) -> str:
    if tokenizer is None:
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


async def _generate(backend: TritonBackend, request: GenerationRequest) -> tuple[str, str | None]:
    text, reason = "", None
    async for chunk in backend.generate(request):
        text += chunk.text
        if chunk.finished:
            reason = chunk.finish_reason
    return text, reason


def _valid(text: str, schema: dict[str, Any]) -> str | None:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        return str(exc).splitlines()[0]
    return None


async def _guided(backend: TritonBackend, tokenizer: Any, count: int, tag: str) -> dict[str, Any]:
    requests = [
        GenerationRequest(request_id=f"probe-{tag}-{i}", prompt=render(tokenizer, f"Reply with JSON. marker={MARKERS[i]}"),
                          json_schema=json.dumps(marker_schema(MARKERS[i])), max_tokens=48)
        for i in range(count)
    ]
    start = time.perf_counter()
    results = await asyncio.gather(*(_generate(backend, r) for r in requests), return_exceptions=True)
    seconds = time.perf_counter() - start
    rows = []
    for i, result in enumerate(results):
        if isinstance(result, BaseException):
            rows.append({"marker": MARKERS[i], "error": f"{type(result).__name__}: {result}"})
            continue
        text, reason = result
        rows.append({"marker": MARKERS[i], "text": text, "finish_reason": reason,
                     "schema_error": _valid(text, marker_schema(MARKERS[i]))})
    ok = all("error" not in row and row["schema_error"] is None for row in rows)
    return {"ok": ok, "seconds": round(seconds, 3), "requests": rows}


async def _hangup(backend: TritonBackend, tokenizer: Any, *, timeout: float) -> dict[str, Any]:
    """A client that hangs up mid-stream must not take the server's capacity with it."""
    leaving = TritonBackend(url=backend.url, model_name=backend.model_name, request_timeout_s=timeout)
    first_text = None
    try:
        await leaving.start()
        long_request = GenerationRequest(request_id="probe-hangup", max_tokens=512,
                                         prompt=render(tokenizer, "Write a very long story about the sea."))
        stream = leaving.generate(long_request)
        first = await asyncio.wait_for(stream.__anext__(), timeout=timeout)
        first_text = first.text
        await stream.aclose()
    except Exception as exc:  # noqa: BLE001 - recorded
        return {"ok": False, "error": f"before hang-up: {type(exc).__name__}: {exc}"}
    finally:
        await leaving.aclose()  # the hang-up: the whole stream and channel go away
    start = time.perf_counter()
    after = await _guided(backend, tokenizer, 4, "after-hangup")
    return {"ok": after["ok"], "first_text": first_text, "after_seconds": round(time.perf_counter() - start, 3),
            "after": after["requests"]}


async def _raw_final(backend: TritonBackend, *, opt_in: bool, timeout: float) -> dict[str, Any]:
    """Send one request on a raw stream; report whether a response flagged final arrived."""
    message = backend._encode(  # the exact request the decider sends, the opt-in toggled
        GenerationRequest(request_id=f"probe-raw-{int(opt_in)}", prompt="Say hi.", max_tokens=8), f"probe-raw-{int(opt_in)}:0"
    )
    if not opt_in:
        del message.parameters[ENABLE_EMPTY_FINAL]
    channel = grpc.aio.insecure_channel(backend.url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    done = asyncio.Event()

    async def requests():
        yield message
        await done.wait()  # keep the stream open until the reader is finished

    seen: list[dict[str, Any]] = []
    final = False
    call = stub.ModelStreamInfer(requests())

    async def read() -> None:
        nonlocal final
        async for response in call:
            params = response.infer_response.parameters
            flagged = FINAL_RESPONSE in params and params[FINAL_RESPONSE].bool_param
            seen.append({"outputs": [o.name for o in response.infer_response.outputs], "final": flagged,
                         "error": response.error_message or None})
            if flagged or response.error_message:
                final = flagged
                return

    try:
        await asyncio.wait_for(read(), timeout=timeout)
    except asyncio.TimeoutError:
        pass
    finally:
        done.set()
        call.cancel()
        await channel.close()
    return {"opt_in": opt_in, "final_seen": final, "responses": len(seen),
            "last": seen[-1] if seen else None}


async def _qwen_format(backend: TritonBackend, tokenizer: Any, marker: str = "q07x") -> dict[str, Any]:
    hermes = get_tool_format("hermes")
    ebnf = hermes.ebnf([("echo_marker", marker_schema(marker))], allow_text=False, max_calls=1, calls_schema={})
    request = GenerationRequest(request_id="probe-qwen", prompt=render(tokenizer, f"Call echo_marker. marker={marker}"),
                                ebnf_grammar=ebnf, max_tokens=64)
    try:
        text, reason = await _generate(backend, request)
    except Exception as exc:  # noqa: BLE001 - recorded
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    reader = hermes.parser("probe-qwen")
    reader.feed(text)
    calls = [(c.name, c.arguments) for c in reader.finish().tool_calls]
    return {"ok": calls == [("echo_marker", {"marker": marker})] and text.lstrip().startswith("<tool_call>"),
            "text": text, "finish_reason": reason, "calls": calls}


async def probe(url: str, model: str, *, tokenizer: Any = None, raw_timeout: float = 20.0,
                request_timeout: float = 120.0) -> dict[str, Any]:
    """Run every check against ``url``/``model``; returns the report."""
    report: dict[str, Any] = {"url": url, "model": model, "checks": {}}
    checks = report["checks"]
    backend = TritonBackend(url=url, model_name=model, request_timeout_s=request_timeout)
    try:
        try:
            await backend.start()
            profile = backend._profile
            checks["start"] = {"ok": True, "input_names": dict(profile.input_names),
                               "cumulative_text": profile.cumulative_text, "count_tokens": profile.count_tokens,
                               "finish_output": profile.finish_output}
        except Exception as exc:  # noqa: BLE001 - recorded; nothing else can run
            checks["start"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            report["ok"] = False
            return report
        checks["guided_1"] = await _guided(backend, tokenizer, 1, "one")
        checks["guided_16"] = await _guided(backend, tokenizer, 16, "sixteen")
        try:
            _text, reason = await _generate(backend, GenerationRequest(
                request_id="probe-length", prompt=render(tokenizer, "Write a long story about the sea."), max_tokens=5))
            checks["length"] = {"ok": reason == "length", "finish_reason": reason}
        except Exception as exc:  # noqa: BLE001
            checks["length"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        checks["qwen_format"] = await _qwen_format(backend, tokenizer)
        checks["hangup"] = await _hangup(backend, tokenizer, timeout=request_timeout)
        without = await _raw_final(backend, opt_in=False, timeout=raw_timeout)
        with_opt_in = await _raw_final(backend, opt_in=True, timeout=raw_timeout)
        bls = backend._profile.cumulative_text or backend._profile.count_tokens
        checks["raw_stream"] = {
            "ok": with_opt_in["final_seen"] and without["final_seen"] == (not bls),
            "without_opt_in": without, "with_opt_in": with_opt_in,
            "expected_final_without_opt_in": not bls,
        }
    finally:
        await backend.aclose()
    report["ok"] = all(check.get("ok") for check in checks.values())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--model", default="llmapi")
    parser.add_argument("--tokenizer", default=None, help="tokenizer dir to render prompts with its chat template")
    parser.add_argument("--raw-timeout", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    report = asyncio.run(probe(args.url, args.model, tokenizer=tokenizer, raw_timeout=args.raw_timeout))
    text = json.dumps(report, indent=2, ensure_ascii=False)
    if args.out:
        args.out.write_text(text + "\n")
    summary = {name: check.get("ok") for name, check in report["checks"].items()}
    print(json.dumps({"model": args.model, "ok": report["ok"], **summary}))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
