"""The Triton + TensorRT-LLM inference backend: one gRPC bidirectional stream, responses routed by id.

Every generation is one Triton request with id ``<request_id>:<attempt>`` sent on a shared
``ModelStreamInfer`` stream; every response carries that id back and is routed to its
request's queue by id, never by arrival order (TensorRT-LLM interleaves requests under
in-flight batching). The server's id map overwrites duplicates, so a second in-flight request
with the same id is refused here before anything is sent.

The constraint is the request's JSON Schema as ``guided_decoding_guide`` with
``guided_decoding_guide_type=json_schema`` (a native tool format's constraint goes as EBNF,
``ebnf_grammar``). TensorRT-LLM decodes *without* it, silently,
when the repository is not configured for guided decoding; so before the first request this
backend reads the served model configs and raises
:class:`~decider.errors.GuidedDecodingNotConfiguredError` unless guided decoding is on end to
end. The wire contract — tensor names per release, the stream's end, the checks — is
``decider/triton_wire.py``; the served entry's config decides the names sent
(``random_seed`` up to tensorrtllm_backend v0.19.0, ``seed`` after) and how text arrives.

End of a stream: the BLS sends its text without the final flag and then an empty final
response, which Triton forwards only to requests that set
``triton_enable_empty_final_response=true`` — every request here does (without it the client
would wait until its timeout on every BLS request). With ``accumulate_tokens`` on (the
generator sets it) each BLS response is the whole text so far, decoded from all tokens, so a
character split across tokens never arrives as U+FFFD; the client turns it into deltas.
``finish_reason``: the LLM-API model says it; for the BLS the client counts the generated
tokens from the per-step ``output_log_probs`` and reports ``length`` when they reach
``max_tokens``.

Transport: tritonclient's generated service stubs (``service_pb2_grpc``) over ``grpc.aio``,
with tritonclient's tensor serialization and ``InferResult``. (The ``stream_infer`` wrapper of
``tritonclient.grpc.aio`` drops the request id from error responses, which would make per-request
error routing impossible.)

Errors: a cut stream → :class:`StreamInterruptedError` (retryable) for every request in flight,
none of whose partial text is ever returned as final; an unreachable or unready server →
:class:`BackendUnavailableError`; a server-side error naming the request → permanent
:class:`InvalidRequestError` when its summary line (a BLS error is a whole traceback) blames
the request, retryable otherwise (``triton_wire.blames_request``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc
from tritonclient.utils import serialize_byte_tensor

from decider.backend import GenerationChunk, GenerationRequest
from toolrail import tracing
from decider.errors import (
    BackendUnavailableError,
    DeciderPermanentError,
    GuidedDecodingNotConfiguredError,
    InvalidRequestError,
    StreamInterruptedError,
)
from decider.triton_wire import (
    CLIENT_INPUTS,
    ENABLE_EMPTY_FINAL,
    FINAL_RESPONSE,
    GUIDE_TYPE_EBNF,
    GUIDE_TYPE_JSON_SCHEMA,
    LOG_PROBS_OUTPUT,
    WireProfile,
    blames_request,
    decoder_model_name,
    entry_problems,
    guided_decoding_problems,
    resolve_profile,
)

__all__ = ["DEFAULT_MODEL", "DEFAULT_REQUEST_TIMEOUT_S", "DEFAULT_URL", "TritonBackend", "triton_request_id"]

logger = logging.getLogger(__name__)

DEFAULT_URL = "127.0.0.1:8001"
DEFAULT_MODEL = "tensorrt_llm_bls"
DEFAULT_REQUEST_TIMEOUT_S = 120.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
_NUMPY = {"BOOL": np.bool_, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32}
#: gRPC codes after which the same request may succeed on a new stream.
_RETRYABLE_CODES = {
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
}


def triton_request_id(request: GenerationRequest) -> str:
    """The wire id of one attempt: unique per attempt, so a re-ask never collides with its original."""
    return f"{request.request_id}:{request.attempt}"


@dataclass(eq=False)
class _Pending:
    """One request in flight: its response queue (filled by the reader, by id)."""

    triton_id: str
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class _StreamCut(Exception):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class TritonBackend:
    """``InferenceBackend`` over Triton Inference Server (TensorRT-LLM backend), streaming over gRPC."""

    name = "triton"

    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        model_name: str = DEFAULT_MODEL,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        context_length: int | None = None,
    ) -> None:
        self.url = url
        self.model_name = model_name
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.context_length = context_length
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._checked = False
        self._profile = WireProfile()
        self._start_lock: asyncio.Lock | None = None
        self._pending: dict[str, _Pending] = {}
        self._outbox: asyncio.Queue | None = None
        self._reader: asyncio.Task | None = None
        #: Responses that arrived for ids no longer in flight (cancelled, timed out): dropped, counted.
        self.orphan_responses = 0

    @classmethod
    def from_settings(cls, settings: Any) -> TritonBackend:
        return cls(url=settings.triton_url, model_name=settings.triton_model)

    # ------------------------------------------------------------------ connection and startup check

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # A new event loop (e.g. a fresh asyncio.run): channels and queues belong to one loop.
            self._loop = loop
            self._channel = None
            self._stub = None
            self._outbox = None
            self._reader = None
            self._pending = {}
            self._start_lock = asyncio.Lock()

    async def start(self) -> None:
        """Connect, check the server is ready, and verify the served config (guided decoding on)."""
        self._bind_loop()
        assert self._start_lock is not None
        async with self._start_lock:
            if self._channel is None:
                self._channel = grpc.aio.insecure_channel(self.url)
                self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
            if self._checked:
                return
            stub = self._stub
            assert stub is not None
            try:
                ready = await stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=self.connect_timeout_s)
                if not ready.ready:
                    raise BackendUnavailableError(f"Triton at {self.url} is not ready")
                model_ready = await stub.ModelReady(
                    service_pb2.ModelReadyRequest(name=self.model_name), timeout=self.connect_timeout_s
                )
                if not model_ready.ready:
                    raise BackendUnavailableError(f"model {self.model_name!r} is not ready on {self.url}")
                configs = {self.model_name: await self._config(self.model_name)}
                entry = configs[self.model_name]
                names = {decoder_model_name(configs, self.model_name)}
                names |= {step.model_name for step in entry.ensemble_scheduling.step}
                for name in names - configs.keys():
                    with contextlib.suppress(grpc.RpcError):
                        configs[name] = await self._config(name)
            except grpc.RpcError as exc:
                raise BackendUnavailableError(f"Triton at {self.url}: {exc.code().name} {exc.details()}") from exc
            guided = guided_decoding_problems(configs, self.model_name)
            if guided:
                raise GuidedDecodingNotConfiguredError(
                    f"{self.model_name} on {self.url} would decode without the schema: " + "; ".join(guided)
                )
            mismatch = entry_problems(entry)
            if mismatch:
                raise DeciderPermanentError(
                    f"{self.model_name} on {self.url} does not take the client's tensors: " + "; ".join(mismatch)
                )
            self._profile = resolve_profile(entry)
            self._checked = True

    async def _config(self, name: str) -> Any:
        assert self._stub is not None
        response = await self._stub.ModelConfig(service_pb2.ModelConfigRequest(name=name), timeout=self.connect_timeout_s)
        return response.config

    def _ensure_stream(self) -> None:
        if self._reader is None or self._reader.done():
            self._outbox = asyncio.Queue()
            self._reader = asyncio.get_running_loop().create_task(self._read(self._outbox), name="triton-stream-reader")

    async def _requests(self, outbox: asyncio.Queue) -> AsyncIterator[service_pb2.ModelInferRequest]:
        while True:
            item = await outbox.get()
            if item is None:
                return
            yield item

    async def _read(self, outbox: asyncio.Queue) -> None:
        """Own the stream: route every response to its request by id; on a cut, fail everything in flight."""
        assert self._stub is not None
        # gRPC metadata is per stream: it names the trace of the request that opened it (each request's own
        # context travels in its parameters, see ``_encode``)
        call = self._stub.ModelStreamInfer(self._requests(outbox), metadata=tuple(tracing.current_context().items()))
        try:
            async for response in call:
                self._route(response)
            detail = "stream closed by the server"
        except grpc.RpcError as exc:
            detail = f"{exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            call.cancel()
            detail = "stream closed by the client"
        finally:
            if self._outbox is outbox:
                self._reader = None
        for pending in list(self._pending.values()):
            pending.queue.put_nowait(_StreamCut(detail))

    def _route(self, response: service_pb2.ModelStreamInferResponse) -> None:
        triton_id = response.infer_response.id
        pending = self._pending.get(triton_id)
        if pending is None:
            if not triton_id and response.error_message:
                # An error the server could not attribute: every request in flight is in doubt.
                for other in list(self._pending.values()):
                    other.queue.put_nowait(BackendUnavailableError(f"Triton error: {response.error_message}"))
                return
            self.orphan_responses += 1
            logger.debug("dropping response for %r (not in flight)", triton_id)
            return
        if response.error_message:
            pending.queue.put_nowait(self._classify(response.error_message))
        else:
            pending.queue.put_nowait(response.infer_response)

    @staticmethod
    def _classify(message: str) -> Exception:
        if blames_request(message):
            return InvalidRequestError(f"Triton rejected the request: {message}")
        return BackendUnavailableError(f"Triton error: {message}")

    # ------------------------------------------------------------------ requests

    def _encode(self, request: GenerationRequest, triton_id: str) -> service_pb2.ModelInferRequest:
        profile = self._profile
        values: dict[str, Any] = {
            "text_input": [request.prompt],
            "max_tokens": [request.max_tokens],
            "stream": [True],
            "exclude_input_in_output": [True],
            "temperature": [request.temperature],
            "top_p": [request.top_p],
        }
        if request.seed is not None:
            values["seed"] = [request.seed]
        if request.stop:
            values["stop_words"] = list(request.stop)
        if request.json_schema is not None:
            values["guided_decoding_guide_type"] = [GUIDE_TYPE_JSON_SCHEMA]
            values["guided_decoding_guide"] = [request.json_schema]
        elif request.ebnf_grammar is not None:
            # A native tool format's constraint as EBNF (ToolFormat.ebnf): the C++ backend's guide types (json,
            # json_schema, regex, ebnf_grammar) have no structural tag in any release (inflight_batcher_llm/src/
            # utils.cc, getGuidedDecodingParamsFromTensors; tensorrtllm_backend v0.19.0 lines 816-823).
            values["guided_decoding_guide_type"] = [GUIDE_TYPE_EBNF]
            values["guided_decoding_guide"] = [request.ebnf_grammar]
        if profile.count_tokens:
            values["return_log_probs"] = [True]
        message = service_pb2.ModelInferRequest(model_name=self.model_name, id=triton_id)
        message.parameters[ENABLE_EMPTY_FINAL].bool_param = True
        for key, value in tracing.current_context().items():  # per request: one stream carries many requests' traces
            message.parameters[key].string_param = value
        for spec in CLIENT_INPUTS:
            if spec.name not in values:
                continue
            items = values[spec.name]
            if spec.wire == "BYTES":
                array = np.array([[item.encode("utf-8") for item in items]], dtype=np.object_)
                raw = serialize_byte_tensor(array).item()
            else:
                array = np.array([items], dtype=_NUMPY[spec.wire])
                raw = array.tobytes()
            name = profile.input_names.get(spec.name, spec.name)
            message.inputs.add(name=name, datatype=spec.wire, shape=list(array.shape))
            message.raw_input_contents.append(raw)
        message.outputs.add(name="text_output")
        if profile.count_tokens:
            message.outputs.add(name=LOG_PROBS_OUTPUT)
        if profile.finish_output:
            message.outputs.add(name=profile.finish_output)
        return message

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream ``request``'s text; the last chunk has ``finished=True``."""
        if not self._checked or self._loop is not asyncio.get_running_loop():
            await self.start()
        triton_id = triton_request_id(request)
        if triton_id in self._pending:
            raise InvalidRequestError(f"request id {triton_id!r} is already in flight (Triton would overwrite it)")
        pending = _Pending(triton_id)
        self._pending[triton_id] = pending
        try:
            self._ensure_stream()
            assert self._outbox is not None
            self._outbox.put_nowait(self._encode(request, triton_id))
            deadline = time.monotonic() + self.request_timeout_s
            stream = _TextStream(cumulative=self._profile.cumulative_text)
            tokens = 0
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BackendUnavailableError(f"no final response for {triton_id} within {self.request_timeout_s}s")
                try:
                    item = await asyncio.wait_for(pending.queue.get(), timeout=remaining)
                except asyncio.TimeoutError:
                    continue
                if isinstance(item, _StreamCut):
                    raise StreamInterruptedError(f"{triton_id}: {item.detail}; {stream.responses} partial responses discarded")
                if isinstance(item, Exception):
                    raise item
                result = InferResult(item)
                if result.get_response().id != triton_id:  # routing invariant; never trust arrival order
                    raise StreamInterruptedError(f"response for {result.get_response().id!r} reached {triton_id!r}")
                final = FINAL_RESPONSE in item.parameters and item.parameters[FINAL_RESPONSE].bool_param
                tokens += _token_count(result)
                delta = stream.feed(_text(result), final=final)
                if not final:
                    if delta:
                        yield GenerationChunk(request_id=request.request_id, text=delta)
                    continue
                reason = _finish_reason(result) if self._profile.finish_output else None
                if reason is None:
                    reason = "length" if self._profile.count_tokens and tokens >= request.max_tokens else "stop"
                yield GenerationChunk(request_id=request.request_id, text=delta, finished=True, finish_reason=reason)
                return
        finally:
            self._pending.pop(triton_id, None)

    async def aclose(self) -> None:
        """Close the stream and the channel; requests in flight end with StreamInterruptedError."""
        if self._outbox is not None:
            self._outbox.put_nowait(None)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = self._reader = self._outbox = None
        self._checked = False


class _TextStream:
    """Turns a request's ``text_output`` responses into deltas.

    Deltas as they come, or — when every response is the whole text so far (the BLS with
    ``accumulate_tokens``) — the new tail of it. A cumulative text that ends inside a
    multi-byte character ends in U+FFFD until the next token completes it: that tail is held
    back, never streamed.
    """

    def __init__(self, *, cumulative: bool) -> None:
        self.cumulative = cumulative
        self.sent = ""
        self.responses = 0

    def feed(self, text: str, *, final: bool) -> str:
        self.responses += 1
        if not self.cumulative:
            self.sent += text
            return text
        if not text:
            return ""  # the empty final response carries no text
        stable = text if final else text.rstrip("\ufffd")
        if not stable.startswith(self.sent):
            # Detokenizing more tokens changed text already streamed: keep what was sent, log it.
            logger.warning("cumulative text changed behind the stream: %r -> %r", self.sent, stable)
            common = len(_common_prefix(self.sent, stable))
            stable = self.sent + stable[common:]
        delta = stable[len(self.sent):]
        self.sent = stable
        return delta


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _token_count(result: InferResult) -> int:
    """Tokens generated in this step: the last dim of ``output_log_probs`` ([1, beams, new tokens])."""
    if not any(output.name == LOG_PROBS_OUTPUT for output in result.get_response().outputs):
        return 0
    array = result.as_numpy(LOG_PROBS_OUTPUT)
    return int(array.shape[-1]) if array is not None and array.ndim else 0


def _text(result: InferResult) -> str:
    array = result.as_numpy("text_output")
    if array is None or array.size == 0:
        return ""
    return "".join(v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1))


def _finish_reason(result: InferResult) -> str | None:
    response = result.get_response()
    if any(output.name == "finish_reason" for output in response.outputs):
        array = result.as_numpy("finish_reason")
        if array is not None and array.size:
            value = array.reshape(-1)[0]
            reason = value.decode("utf-8") if isinstance(value, bytes) else str(value)
            if reason:
                return reason
    return None
