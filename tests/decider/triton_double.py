"""A test double of Triton's ``GRPCInferenceService`` wire protocol (not a Triton server).

It serves a model repository written by ``engine_build.triton_repo`` (its configs, parsed)
and answers ``ModelStreamInfer`` the way Triton server v2.62.0 (25.10) forwards what a
decoupled model sends — rules written from the server source, ``src/grpc/``:

- A request whose tensors do not match the served config exactly (names, datatypes, shapes,
  required inputs) fails before the model runs: one response with ``error_message`` and only
  the request id, no parameters (``stream_infer_handler.cc`` lines 380-402). So does a
  ``triton_enable_empty_final_response`` that is not a bool (``infer_handler.cc`` 361-370).
- Every forwarded model response carries ``triton_final_response`` = whether the model set the
  final flag (``stream_infer_handler.cc`` line 791); a model's error response keeps the request
  id and is forwarded like data (lines 728-734, 783-791).
- A flags-only (empty) final response is forwarded **only** when the request set
  ``triton_enable_empty_final_response=true`` (lines 763-767); otherwise the client sees
  nothing more for that request.

What the model sends depends on the entry model served:

- the release's BLS (a config with ``accumulate_tokens``): data responses without the final
  flag — the whole text so far when ``accumulate_tokens`` is on, else each chunk — then an
  empty final; on an error, an error response then the empty final
  (tensorrtllm_backend v0.19.0 ``tensorrt_llm_bls/1/model.py`` lines 216-237). With
  ``output_log_probs`` requested each data response carries one log prob per chunk (a chunk
  stands for a token: ``model_instance_state.cc`` lines 1176-1196 give [1, beams, new tokens]).
- toolrail's LLM-API model (``engine_build/llmapi_model.py``): deltas, then one last response
  with the rest of the text and ``finish_reason``, flagged final; an error is one error
  response flagged final.

Generation stops at ``max_tokens`` chunks. Responses of different requests are deliberately
emitted out of order (a seeded shuffle across requests; order within a request is kept).

Text comes from a ``produce(fields) -> AsyncIterator[str]`` callable: the embedded engine, or
a deterministic generator. Knobs: ``cut_after`` aborts the stream after that many responses;
``drop_guided_decoding`` serves the decoder config without guided decoding.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from decider.triton_wire import (
    ENABLE_EMPTY_FINAL,
    FINAL_RESPONSE,
    LOG_PROBS_OUTPUT,
    decoder_model_name,
    parameter,
)
from engine_build.config_check import load_repository, request_problems

Produce = Callable[[dict[str, Any]], AsyncIterator[str]]
_NUMPY = {"BOOL": np.bool_, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "INT64": np.int64}


def decode_inputs(request: service_pb2.ModelInferRequest) -> dict[str, Any]:
    """``{name: scalar or list}`` of a request's raw inputs (batch of one)."""
    fields: dict[str, Any] = {}
    for tensor, raw in zip(request.inputs, request.raw_input_contents):
        if tensor.datatype == "BYTES":
            values = [v.decode("utf-8") for v in deserialize_bytes_tensor(raw)]
        else:
            values = np.frombuffer(raw, dtype=_NUMPY[tensor.datatype]).tolist()
        fields[tensor.name] = values[0] if list(tensor.shape)[1:] == [1] else values
    return fields


@dataclass
class DoubleStats:
    requests: int = 0
    responses: int = 0
    rejected: list[tuple[str, list[str]]] = field(default_factory=list)
    duplicate_ids: list[str] = field(default_factory=list)
    seen_ids: list[str] = field(default_factory=list)
    #: Arrival order of (request id, response index) as emitted: proves the interleaving.
    emitted: list[tuple[str, int]] = field(default_factory=list)
    #: Requests whose empty final the server did not forward (no opt-in): their clients never see the end.
    swallowed_finals: list[str] = field(default_factory=list)


class TritonProtocolDouble(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The servicer; use :func:`serve_double` to run it on a port."""

    def __init__(self, repository: Path, produce: Produce, *, seed: int = 0, cut_after: int | None = None,
                 drop_guided_decoding: bool = False) -> None:
        self.configs: dict[str, mc.ModelConfig] = load_repository(repository)
        if drop_guided_decoding:
            for name, config in self.configs.items():
                if "guided_decoding_backend" in config.parameters:
                    del config.parameters["guided_decoding_backend"]
        self.produce = produce
        self.rng = random.Random(seed)
        self.cut_after = cut_after
        self.stats = DoubleStats()

    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=request.name in self.configs)

    async def ModelConfig(self, request, context):
        if request.name not in self.configs:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{request.name}' is not found")
        return service_pb2.ModelConfigResponse(config=self.configs[request.name])

    def _response(self, request, outputs: dict[str, np.ndarray] | None = None, *, final: bool | None,
                  error: str = "") -> service_pb2.ModelStreamInferResponse:
        """One forwarded response; ``final=None`` for a request that failed before the model (no parameters)."""
        infer = service_pb2.ModelInferResponse(id=request.id)
        if final is not None:
            infer.model_name = request.model_name
            infer.parameters[FINAL_RESPONSE].bool_param = final
        requested = {output.name for output in request.outputs}
        for name, array in (outputs or {}).items():
            if requested and name not in requested:
                continue  # Triton returns only the outputs a request names
            if array.dtype == np.object_:
                raw, datatype = serialize_byte_tensor(array).item(), "BYTES"
            else:
                raw, datatype = array.tobytes(), {np.float32: "FP32"}[array.dtype.type]
            infer.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
            infer.raw_output_contents.append(raw)
        return service_pb2.ModelStreamInferResponse(error_message=error, infer_response=infer)

    @staticmethod
    def _text(text: str) -> np.ndarray:
        return np.array([[text.encode("utf-8")]], dtype=np.object_)

    async def _run_request(self, request, lanes: dict[str, asyncio.Queue], wake: asyncio.Event) -> None:
        lane = lanes[request.id]
        try:
            config = self.configs.get(request.model_name)
            if config is None:
                lane.put_nowait(self._response(request, final=None, error=f"Request for unknown model: '{request.model_name}'"))
                return
            tensors = {t.name: (t.datatype, list(t.shape)) for t in request.inputs}
            problems = request_problems(config, tensors)
            if len(request.raw_input_contents) != len(request.inputs):
                problems.append("raw_input_contents do not match inputs")
            opt_in = request.parameters.get(ENABLE_EMPTY_FINAL)
            if opt_in is not None and opt_in.WhichOneof("parameter_choice") != "bool_param":
                problems.append(f"invalid value type for '{ENABLE_EMPTY_FINAL}' parameter, expected bool_param.")
            if problems:
                self.stats.rejected.append((request.id, problems))
                lane.put_nowait(self._response(request, final=None, error="; ".join(problems)))
                return
            fields = decode_inputs(request)
            decoder = self.configs.get(decoder_model_name(self.configs, request.model_name))
            guided = decoder is not None and "guided_decoding_backend" in decoder.parameters
            fields["_guided"] = guided and "guided_decoding_guide" in fields
            empty_final = opt_in is not None and opt_in.bool_param
            if parameter(config, "accumulate_tokens") is not None:
                await self._run_bls(request, config, fields, lane, wake, empty_final=empty_final)
            else:
                await self._run_llmapi(request, fields, lane, wake)
        finally:
            wake.set()

    async def _chunks(self, fields: dict[str, Any]) -> AsyncIterator[str]:
        limit = int(fields["max_tokens"])
        count = 0
        async for delta in self.produce(fields):
            if not delta:
                continue
            yield delta
            count += 1
            if count >= limit:
                return

    async def _run_bls(self, request, config, fields, lane, wake, *, empty_final: bool) -> None:
        accumulate = (parameter(config, "accumulate_tokens") or "").lower() in {"true", "yes", "1", "t"}
        log_probs = bool(fields.get("return_log_probs"))
        text = ""
        try:
            async for delta in self._chunks(fields):
                text += delta
                outputs = {"text_output": self._text(text if accumulate else delta)}
                if log_probs:
                    outputs[LOG_PROBS_OUTPUT] = np.full((1, 1, 1), -0.5, dtype=np.float32)
                lane.put_nowait(self._response(request, outputs, final=False))
                wake.set()
        except Exception as exc:  # noqa: BLE001 - the BLS turns it into an error response (its traceback)
            message = f"Traceback (most recent call last):\n  File \"model.py\", line 204, in execute\n{type(exc).__name__}: {exc}"
            lane.put_nowait(self._response(request, final=False, error=message))
        if empty_final:
            lane.put_nowait(self._response(request, final=True))
        else:
            self.stats.swallowed_finals.append(request.id)

    async def _run_llmapi(self, request, fields, lane, wake) -> None:
        text = ""
        try:
            count = 0
            async for delta in self._chunks(fields):
                text += delta
                count += 1
                lane.put_nowait(self._response(request, {"text_output": self._text(delta)}, final=False))
                wake.set()
            reason = "length" if count >= int(fields["max_tokens"]) else "stop"
            lane.put_nowait(self._response(request, {"text_output": self._text(""), "finish_reason": self._text(reason)},
                                           final=True))
        except Exception as exc:  # noqa: BLE001 - llmapi_model.py sends str(exc) with the final flag
            lane.put_nowait(self._response(request, final=True, error=str(exc)))

    async def ModelStreamInfer(self, request_iterator, context):
        lanes: dict[str, asyncio.Queue] = {}
        active: set[str] = set()
        wake = asyncio.Event()
        reading_done = False
        tasks: list[asyncio.Task] = []

        async def read() -> None:
            nonlocal reading_done
            async for request in request_iterator:
                self.stats.requests += 1
                self.stats.seen_ids.append(request.id)
                if request.id in active:
                    self.stats.duplicate_ids.append(request.id)
                active.add(request.id)
                lanes[request.id] = asyncio.Queue()
                tasks.append(asyncio.create_task(self._run_request(request, lanes, wake)))
            reading_done = True
            wake.set()

        reader = asyncio.create_task(read())
        counters: dict[str, int] = {}
        try:
            while True:
                ready = [rid for rid, q in lanes.items() if not q.empty()]
                if not ready:
                    if reading_done and all(t.done() for t in tasks) and not any(not q.empty() for q in lanes.values()):
                        return
                    wake.clear()
                    await wake.wait()
                    # Let more responses pile up so the shuffle has something to reorder.
                    await asyncio.sleep(0.001)
                    continue
                request_id = self.rng.choice(ready)
                response = lanes[request_id].get_nowait()
                index = counters.get(request_id, 0)
                counters[request_id] = index + 1
                self.stats.emitted.append((request_id, index))
                self.stats.responses += 1
                if self.cut_after is not None and self.stats.responses > self.cut_after:
                    self.cut_after = None  # one cut; the client's next stream is served normally
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset (test double cut the stream)")
                params = response.infer_response.parameters
                if (FINAL_RESPONSE in params and params[FINAL_RESPONSE].bool_param) or FINAL_RESPONSE not in params:
                    active.discard(request_id)
                    del lanes[request_id]
                yield response
        finally:
            reader.cancel()
            for task in tasks:
                task.cancel()


async def serve_double(servicer: TritonProtocolDouble) -> tuple[grpc.aio.Server, str]:
    """Start a gRPC server on a free loopback port; returns (server, "127.0.0.1:<port>")."""
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def marker_generator(*, chunk: int = 5, delay_s: float = 0.0005) -> Produce:
    """A deterministic generator: echoes the prompt's ``marker=<...>`` inside a JSON object, in small chunks."""

    async def produce(fields: dict[str, Any]) -> AsyncIterator[str]:
        prompt = fields["text_input"]
        marker = prompt.split("marker=", 1)[1].split()[0] if "marker=" in prompt else "none"
        text = '{"marker": "%s", "guided": %s}' % (marker, "true" if fields.get("_guided") else "false")
        for start in range(0, len(text), chunk):
            await asyncio.sleep(delay_s)
            yield text[start:start + chunk]

    return produce


def engine_generator(engine: Any) -> Produce:
    """Stream from the embedded engine: the schema (or EBNF grammar) is enforced by xgrammar exactly when guided
    decoding is on."""
    from decider.backend import GenerationRequest

    counter = iter(range(1 << 30))

    async def produce(fields: dict[str, Any]) -> AsyncIterator[str]:
        guide = fields.get("guided_decoding_guide") if fields.get("_guided") else None
        # the release's guide types: a json_schema or an ebnf_grammar (what a native tool format's tag travels as);
        # special tokens are skipped in the text, as the release's detokenizer does by default
        ebnf = fields.get("guided_decoding_guide_type") == "ebnf_grammar"
        request = GenerationRequest(
            request_id=f"double-{next(counter)}", prompt=fields["text_input"], json_schema=None if ebnf else guide,
            ebnf_grammar=guide if ebnf else None,
            max_tokens=int(fields["max_tokens"]), temperature=float(fields.get("temperature", 0.0)),
            top_p=float(fields.get("top_p", 1.0)), seed=fields.get("seed", fields.get("random_seed")),
        )
        async for chunk in engine.generate(request):
            yield chunk.text

    return produce
