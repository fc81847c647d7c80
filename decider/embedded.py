"""The embedded engine: in-process continuous batching with torch and xgrammar.

One background scheduler thread owns the model and a preallocated KV cache of
``max_batch_size`` slots. Every iteration it

1. takes in new and cancelled requests,
2. admits waiting requests into free slots (copying any cached shared-prefix KV into the slot),
3. runs **one decode step for every running request at once**, while a grammar thread fills
   each constrained request's token bitmask for that step (the forward pass never waits on
   grammar work until the logits exist),
4. prefills at most ``prefill_chunk`` prompt tokens of admitted requests,

so requests join and leave the running batch at every decode step. Everything a request owns
lives in one ``_Sequence`` keyed by its request id: its KV slot, its ``GrammarMatcher``, its
sampling parameters and RNG, its incremental detokenizer and its output sink. The batch order
of a step is rebuilt from those objects every step; no state is kept by batch position.

Greedy is the default and deterministic; sampling is deterministic per ``seed``. Generation
stops at EOS, when the request's matcher has terminated, at a stop string or at ``max_tokens``.

Attention is written out in :mod:`decider.kv_runner` (not through ``model.forward``) for Llama-family decoders
(Llama, SmolLM, Mistral, Qwen2/3): the HF module's weights, norms, MLP and rotary embedding are
reused; only the KV cache and the batched masked attention over ragged lengths are ours. Prefill
and decode steps may run different copies of the weights (fp32 and bf16: the ``"hybrid"`` dtype
mode, the default on CPUs without native bf16) over the one KV cache.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import copy
import heapq
import logging
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from decider.backend import GenerationChunk, GenerationRequest
from decider.engine_sequence import DETOKENIZER_CONTEXT, REPETITION_WINDOW, IncrementalDetokenizer
from decider.engine_sequence import EngineSequence as _Sequence
from decider.kv_runner import LlamaRunner, PrefixCache
from decider.errors import (
    BackendUnavailableError,
    DeciderError,
    InvalidRequestError,
    PromptTooLongError,
    StreamInterruptedError,
    UnsupportedSchemaError,
)
from decider.grammar import GrammarCache

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MAX_SEQ_LEN",
    "DEFAULT_PREFILL_CHUNK",
    "DEFAULT_PREFIX_BLOCK",
    "DEFAULT_PREFIX_CACHE_BYTES",
    "DTYPE_MODES",
    "EmbeddedEngine",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 32
#: Upper bound on the context; the model's own ``max_position_embeddings`` may lower it.
DEFAULT_MAX_SEQ_LEN = 4096
#: Prompt tokens prefilled per scheduler iteration (between two decode steps).
DEFAULT_PREFILL_CHUNK = 256
#: Prefix-cache granularity in tokens.
DEFAULT_PREFIX_BLOCK = 32
DEFAULT_PREFIX_CACHE_BYTES = 256 * 1024 * 1024


#: Engines still open at interpreter exit are closed first: a scheduler thread killed inside
#: native code at shutdown aborts the process ("terminate called without an active exception").
_OPEN_ENGINES: weakref.WeakSet[EmbeddedEngine] = weakref.WeakSet()


@atexit.register
def _close_open_engines() -> None:
    for engine in list(_OPEN_ENGINES):
        engine.close()


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


def _allowed_count(row: torch.Tensor) -> int:
    """How many tokens one row of an xgrammar bitmask allows (its set bits)."""
    return int(np.unpackbits(row.numpy().view(np.uint8)).sum())


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


#: ``dtype`` names :meth:`EmbeddedEngine.load` accepts, as (weights dtype, decode-step dtype).
DTYPE_MODES: dict[str, tuple[torch.dtype, torch.dtype]] = {
    "float32": (torch.float32, torch.float32),
    "fp32": (torch.float32, torch.float32),
    "bfloat16": (torch.bfloat16, torch.bfloat16),
    "bf16": (torch.bfloat16, torch.bfloat16),
    "float16": (torch.float16, torch.float16),
    "fp16": (torch.float16, torch.float16),
    "hybrid": (torch.float32, torch.bfloat16),
    # Experimental, CPU only: decode steps on Linear layers dynamically quantized to int8
    # (~25 % faster decode than "hybrid"); logits shift. With jump-forward it kept dev-split exact
    # calls at 96.8 % for a 1.10 s vs 1.13 s median decision: too little to make it the default.
    "hybrid-int8": (torch.float32, torch.qint8),
}


def _native_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls run natively (GPUs; CPUs with AVX512-BF16 or AMX), not emulated."""
    if device.type != "cpu":
        return True
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def _resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """``(weights dtype, decode-step dtype)`` for a ``dtype`` argument of :meth:`EmbeddedEngine.load`.

    ``None``/``"auto"``: bf16 where it is native; elsewhere (AVX2 CPUs) ``"hybrid"``, because
    emulated bf16 makes multi-token matmuls (prefill) ~6x slower than fp32 while single-token
    decode steps, bound by memory bandwidth, still gain ~20 % from half-size weights.
    """
    if isinstance(dtype, torch.dtype):
        return dtype, dtype
    if dtype is None or dtype == "auto":
        return DTYPE_MODES["bfloat16"] if _native_bf16(device) else DTYPE_MODES["hybrid"]
    try:
        return DTYPE_MODES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; use auto, {', '.join(DTYPE_MODES)}") from None


class EmbeddedEngine:
    """In-process continuous-batching engine implementing ``InferenceBackend``.

    Build it once with :meth:`load` (model, tokenizer, ``TokenizerInfo`` and the
    ``GrammarCompiler`` are the expensive, shared objects); submit any number of concurrent
    requests through :meth:`generate` (async) or :meth:`generate_sync` / :meth:`stream_sync`
    (threads).

    Precision: ``model``'s dtype runs multi-token passes (prefill, jump-forward extends);
    ``decode_dtype``, when it differs, runs single-token decode steps on a second copy of the
    weights. One KV cache (the wider of the two dtypes) serves both, q/k/v cast to it. This is
    the ``"hybrid"`` mode :meth:`load` picks on CPUs without native bf16 (AVX2 only): there
    emulated bf16 makes prefill ~6x slower than fp32 (200 tokens: 5.1 s vs 0.8 s at one thread),
    while a decode step, bound by memory bandwidth, is still ~20 % faster with half-size weights
    (66 vs 81 ms/token). Dev-split decisions were identical to all-bf16 ones, greedy tokens
    matched fp32 in the tests;
    the price is a second copy of the weights (+270 MB for SmolLM2-135M).

    ``jump_forward`` (on by default) appends the tokens a grammar forces without a decode step each
    and feeds them in one multi-token pass (see :meth:`_jump_forward`): on the quality set's dev
    split (158 rows) it left exact tool calls at 96.8 % and cut the median decision from 4.5 s to
    1.1 s on 2 CPU cores.
    """

    name = "embedded"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: torch.device | str | None = None,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        prefix_block: int = DEFAULT_PREFIX_BLOCK,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
        jump_forward: bool = True,
        decode_dtype: torch.dtype | None = None,
        model_path: Path | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.decode_dtype = decode_dtype or self.dtype
        self.model = model.eval()
        self.model_path = model_path
        self.tokenizer = tokenizer
        config = model.config
        self.context_length = min(max_seq_len, getattr(config, "max_position_embeddings", max_seq_len) or max_seq_len)
        self.max_batch_size = max_batch_size
        self.prefill_chunk = max(1, prefill_chunk)
        self.jump_forward = jump_forward
        self.eos_token_ids = self._eos_ids(model, tokenizer)
        self.vocab_size = config.vocab_size
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=config.vocab_size, stop_token_ids=sorted(self.eos_token_ids)
        )
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=2, cache_enabled=False)
        #: The one grammar cache of this engine: its deciders and its own json_schema requests share it.
        self.grammar_cache = GrammarCache(self.compiler, self.tokenizer_info)
        self._fast_tokenizer = getattr(tokenizer, "_tokenizer", None)

        decode_model = None
        cache_dtype = self.dtype
        if self.decode_dtype == torch.qint8:
            # Linear layers dynamically quantized to int8 (fp32 activations, CPU only).
            decode_model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear},
                                                                  dtype=torch.qint8).eval()
        elif self.decode_dtype != self.dtype:
            # A second copy of the weights for decode steps; deepcopy keeps tied embeddings tied.
            decode_model = copy.deepcopy(model).to(self.decode_dtype).eval()
            cache_dtype = torch.promote_types(self.dtype, self.decode_dtype)
        self._runner = LlamaRunner(model, num_slots=max_batch_size, max_seq_len=self.context_length,
                                    device=self.device, dtype=cache_dtype, decode_model=decode_model)
        self._prefix_cache = PrefixCache(block=prefix_block, capacity_bytes=prefix_cache_bytes)
        self._bitmask = xgr.allocate_token_bitmask(max_batch_size, self.tokenizer_info.vocab_size)
        self._json_safe_tokens = self._json_token_bitmask(allow_whitespace=True)
        self._json_strict_tokens = self._json_token_bitmask(allow_whitespace=False)
        self._free_slots = list(range(max_batch_size))
        heapq.heapify(self._free_slots)

        self._lock = threading.Condition()
        self._inbox: list[_Sequence] = []
        self._by_key: dict[str, _Sequence] = {}
        self._waiting: list[_Sequence] = []
        self._prefilling: list[_Sequence] = []
        self._decoding: list[_Sequence] = []
        self._grammar_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolrail-grammar")
        self._thread: threading.Thread | None = None
        self._closed = False
        _OPEN_ENGINES.add(self)
        self.stats: dict[str, float] = {
            "decode_steps": 0, "decode_tokens": 0, "prefill_tokens": 0, "prefix_hit_tokens": 0,
            "forward_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0, "decode_cpu_s": 0.0, "grammar_wait_s": 0.0, "mask_apply_s": 0.0, "grammar_accept_s": 0.0,
            "mask_apply_rows": 0, "max_batch_seen": 0,
            "forced_tokens": 0, "extend_steps": 0,
        }

    # ---------------------------------------------------------------- construction

    @classmethod
    def load(
        cls,
        model_path: str | Path | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        *,
        num_threads: int | None = None,
        **options: Any,
    ) -> EmbeddedEngine:
        """Load a local HF model directory (default: the converted SmolLM2, pulled if missing).

        ``dtype``: ``None``/``"auto"`` (default) is bf16 on GPUs and on CPUs with native bf16
        (AVX512-BF16 or AMX), and ``"hybrid"`` (fp32 weights and KV cache, a bf16 copy of the
        weights for single-token decode steps) on other CPUs; ``"float32"``, ``"bfloat16"``,
        ``"float16"`` and ``"hybrid"`` are honoured as given (see :class:`EmbeddedEngine`).

        ``num_threads`` sets torch's CPU threads for the process; on a CPU shared with other
        busy processes use 1 (spinning OpenMP workers made decoding ~8x slower at 2 threads
        on a loaded 2-core machine). ``options`` go to the constructor (``max_batch_size``,
        ``max_seq_len``, ``prefill_chunk``, ``prefix_cache_bytes``, ``jump_forward``; a
        ``decode_dtype`` given there overrides the one ``dtype`` implies).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from decider.model import resolve_model_path

        if num_threads:
            torch.set_num_threads(num_threads)

        path = resolve_model_path(model_path)
        torch_device = torch.device(device) if device is not None else _default_device()
        torch_dtype, decode_dtype = _resolve_dtype(dtype, torch_device)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        from transformers.utils import logging as hf_logging

        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # its "Loading weights" bar, on every process start
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        model = model.to(torch_device).eval()
        options.setdefault("decode_dtype", decode_dtype)
        return cls(model, tokenizer, device=torch_device, model_path=path, **options)

    @staticmethod
    def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
        ids: set[int] = set()
        candidates = [getattr(model.config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)]
        generation_config = getattr(model, "generation_config", None)
        if generation_config is not None:
            candidates.append(getattr(generation_config, "eos_token_id", None))
        for value in candidates:
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(item) for item in value)
        return ids

    # ---------------------------------------------------------------- grammar

    def _json_token_bitmask(self, *, allow_whitespace: bool) -> torch.Tensor:
        """One bitmask row allowing every token without a raw control byte (but \t \n \r if asked).

        xgrammar 0.2.9's token mask lets tokens such as 0x10 or "\t\t" into JSON strings
        (``accept_string`` refuses them), which makes ``json.loads`` fail. Control bytes other
        than \t \n \r are never valid in JSON text; those three only as whitespace between
        tokens, which our own compiles (``any_whitespace=False``) never allow.
        """
        allowed = torch.ones(self.tokenizer_info.vocab_size, dtype=torch.bool)
        banned = set(range(0x20)) - ({0x09, 0x0A, 0x0D} if allow_whitespace else set())
        for token_id, raw in enumerate(self.tokenizer_info.decoded_vocab):
            if token_id not in self.eos_token_ids and any(byte in banned for byte in raw):
                allowed[token_id] = False
        words = (self.tokenizer_info.vocab_size + 31) // 32
        bits = np.zeros(words * 32, dtype=bool)
        bits[: allowed.numel()] = allowed.numpy()
        # Bit k of word w is token 32*w + k, as in xgrammar's bitmask (little-endian int32 words).
        packed = np.packbits(bits, bitorder="little").view("<i4")
        return torch.from_numpy(packed.astype(np.int32))

    def _fill_mask(self, seq: _Sequence, row: int) -> bool:
        """Fill ``row`` of the scratch bitmask for ``seq``; True if the row needs masking."""
        need = seq.matcher.fill_next_token_bitmask(self._bitmask, row)
        if seq.json_tokens is not None:
            self._bitmask[row] &= seq.json_tokens
            return True
        return need

    def compile_json_schema(self, schema: str) -> xgr.CompiledGrammar:
        """Compile (or fetch from :attr:`grammar_cache`) a JSON Schema against this engine's tokenizer."""
        try:
            return self.grammar_cache.compile(schema).grammar
        except UnsupportedSchemaError as exc:
            raise InvalidRequestError(f"JSON Schema does not compile: {exc}") from exc

    # ---------------------------------------------------------------- submission

    def _decode_ids(self, ids: list[int]) -> str:
        if self._fast_tokenizer is not None:
            return self._fast_tokenizer.decode(ids, skip_special_tokens=True)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _decode_with_special(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        """Token ids of an already rendered prompt (the chat template supplies special tokens)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def score_continuations(self, prompt: str, continuations: Sequence[str]) -> list[float]:
        """``log P(continuation | prompt)`` under the model for each continuation (teacher-forced).

        One forward pass over the prompt, its KV repeated for a batched pass over the
        continuations (right-padded); the sum of the continuation tokens' log-probabilities, no
        grammar mask. Read-only on the weights, so it
        runs beside the scheduler. The decider uses it to let the model itself choose between
        calling a tool and answering in text (:class:`decider.service.DeciderConfig.call_bias`).
        """
        prompt_ids = self.encode(prompt)
        conts = [self.encode(text) for text in continuations]
        width = max(len(c) for c in conts)
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([prompt_ids], device=self.device), use_cache=True)
            first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            scores = [float(first[c[0]]) for c in conts]
            if width > 1:  # the prompt's KV once, repeated for every continuation
                # transformers 5 renamed `past_key_values` to `cache` (the old name warns on every call):
                # the output's own key says which name this version takes back
                cache_arg = "cache" if "cache" in out else "past_key_values"
                cache = out[cache_arg]
                cache.batch_repeat_interleave(len(conts))
                ids = torch.tensor([c + [0] * (width - len(c)) for c in conts], device=self.device)
                mask = torch.tensor([[1] * len(prompt_ids) + [1] * len(c) + [0] * (width - len(c)) for c in conts],
                                    device=self.device)
                logits = torch.log_softmax(self.model(input_ids=ids, attention_mask=mask, use_cache=False,
                                                      **{cache_arg: cache}).logits.float(), dim=-1)
                for row, c in enumerate(conts):
                    scores[row] += float(sum(logits[row, i - 1, c[i]] for i in range(1, len(c))))
        return scores

    @staticmethod
    def _key(request: GenerationRequest) -> str:
        return request.request_id if request.attempt == 0 else f"{request.request_id}#{request.attempt}"

    def _prepare(self, request: GenerationRequest, sink: Callable[[GenerationChunk | BaseException], None]) -> _Sequence:
        """Validate, tokenize and compile on the caller's thread; the scheduler only decodes."""
        if self._closed:
            raise BackendUnavailableError("the embedded engine is closed")
        if request.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be at least 1, got {request.max_tokens}")
        if request.temperature < 0 or not 0 < request.top_p <= 1:
            raise InvalidRequestError("temperature must be >= 0 and top_p in (0, 1]")
        prompt_ids = self.encode(request.prompt)
        if not prompt_ids:
            raise InvalidRequestError("empty prompt")
        if len(prompt_ids) >= self.context_length:
            raise PromptTooLongError(len(prompt_ids), self.context_length)
        compiled = request.compiled_grammar
        json_tokens = None
        if compiled is None and request.json_schema is not None:
            compiled = self.compile_json_schema(request.json_schema)
            json_tokens = self._json_strict_tokens  # compiled without free whitespace: no control byte is legal
        elif compiled is None and request.ebnf_grammar is not None:
            try:
                compiled = self.compiler.compile_grammar(request.ebnf_grammar)
            except (RuntimeError, ValueError) as exc:
                raise InvalidRequestError(f"EBNF grammar does not compile: {exc}") from exc
        if json_tokens is None and compiled is not None and (request.json_schema or request.ebnf_grammar
                                                             or request.keep_special_tokens):
            json_tokens = self._json_safe_tokens  # the caller may allow \t \n \r as whitespace
        if compiled is not None:
            info = getattr(compiled, "tokenizer_info", None)
            if info is not None and info.vocab_size != self.tokenizer_info.vocab_size:
                raise InvalidRequestError("compiled_grammar was compiled for a different tokenizer")
        matcher = xgr.GrammarMatcher(compiled) if compiled is not None else None
        generator = None
        if request.temperature > 0:
            generator = torch.Generator(device="cpu")
            if request.seed is None:
                generator.seed()  # non-deterministic, and leaves torch's global RNG alone
            else:
                generator.manual_seed(request.seed)
        return _Sequence(
            key=self._key(request),
            request=request,
            prompt_ids=prompt_ids,
            max_new_tokens=min(request.max_tokens, self.context_length - len(prompt_ids)),
            matcher=matcher,
            json_tokens=json_tokens,
            generator=generator,
            detokenizer=IncrementalDetokenizer(self._decode_with_special if request.keep_special_tokens else self._decode_ids,
                                                prompt_ids[-DETOKENIZER_CONTEXT:]),
            sink=sink,
            prompt_tokens=frozenset(prompt_ids) if request.repetition_penalty != 1.0 else frozenset(),
        )

    def _enqueue(self, seq: _Sequence) -> None:
        with self._lock:
            if self._closed:
                raise BackendUnavailableError("the embedded engine is closed")
            if seq.key in self._by_key:
                raise InvalidRequestError(f"request {seq.key!r} is already running")
            self._by_key[seq.key] = seq
            self._inbox.append(seq)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="toolrail-engine", daemon=True)
                self._thread.start()
            self._lock.notify()

    def cancel(self, request_id: str, attempt: int = 0) -> bool:
        """Stop a request; its slot and matcher are freed at the next scheduler iteration."""
        key = request_id if attempt == 0 else f"{request_id}#{attempt}"
        with self._lock:
            seq = self._by_key.get(key)
            if seq is None:
                return False
            seq.cancel_requested = True
            self._lock.notify()
            return True

    def _cancel_seq(self, seq: _Sequence) -> None:
        with self._lock:
            if not seq.finished:
                seq.cancel_requested = True
                self._lock.notify()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream ``request``'s output; closing the iterator or cancelling the task cancels it."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[GenerationChunk | BaseException] = asyncio.Queue()

        def sink(item: GenerationChunk | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(chunks.put_nowait, item)
            except RuntimeError:  # the consumer's loop is gone: nobody will read this request
                self._cancel_seq(seq)

        seq = await asyncio.to_thread(self._prepare, request, sink)
        self._enqueue(seq)
        try:
            while True:
                item = await chunks.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            self._cancel_seq(seq)

    def stream_sync(self, request: GenerationRequest, *, timeout: float | None = None) -> Iterator[GenerationChunk]:
        """Blocking variant of :meth:`generate` for callers in threads."""
        chunks: queue.Queue[GenerationChunk | BaseException] = queue.Queue()
        seq = self._prepare(request, chunks.put)
        self._enqueue(seq)
        try:
            while True:
                try:
                    item = chunks.get(timeout=timeout)
                except queue.Empty:
                    raise StreamInterruptedError(f"no output for {timeout}s from request {request.request_id}") from None
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            self._cancel_seq(seq)

    def generate_sync(self, request: GenerationRequest, *, timeout: float | None = None) -> tuple[str, str, dict[str, int]]:
        """Run ``request`` to the end: ``(text, finish_reason, usage)``."""
        parts: list[str] = []
        finish_reason, usage = "stop", {}
        for chunk in self.stream_sync(request, timeout=timeout):
            parts.append(chunk.text)
            if chunk.finished:
                finish_reason, usage = chunk.finish_reason or "stop", chunk.usage
        return "".join(parts), finish_reason, usage

    # ---------------------------------------------------------------- lifecycle

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Cancel everything in flight and stop the scheduler thread."""
        with self._lock:
            self._closed = True
            self._lock.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=30)
        self._grammar_pool.shutdown(wait=False)

    def __enter__(self) -> EmbeddedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def active_requests(self) -> int:
        with self._lock:
            return len(self._by_key)

    # ---------------------------------------------------------------- scheduler

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not self._closed and not (self._inbox or self._waiting or self._prefilling or self._decoding):
                        self._lock.wait()
                    if self._closed:
                        break
                    self._waiting.extend(self._inbox)
                    self._inbox.clear()
                try:
                    self._iteration()
                except Exception as exc:  # a failed step fails the requests in it, not the process
                    logger.exception("embedded engine step failed")
                    error = BackendUnavailableError(f"embedded engine step failed: {exc}")
                    error.__cause__ = exc
                    for seq in self._prefilling + self._decoding:
                        self._finish(seq, None, error=error)
        shutdown = StreamInterruptedError("the embedded engine was closed")
        with self._lock:
            self._waiting.extend(self._inbox)
            self._inbox.clear()
        for seq in self._waiting + self._prefilling + self._decoding:
            self._finish(seq, None, error=shutdown)

    def _iteration(self) -> None:
        # Cancellations: free slot + matcher right away.
        for group in (self._waiting, self._prefilling, self._decoding):
            for seq in [s for s in group if s.cancel_requested]:
                self._finish(seq, "cancelled")
        # Admission into free slots, reusing cached prefix KV.
        while self._waiting and self._free_slots:
            seq = self._waiting.pop(0)
            seq.slot = heapq.heappop(self._free_slots)
            self._attach_prefix(seq)
            self._prefilling.append(seq)
        stepping = [seq for seq in self._decoding if len(seq.unfed()) == 1]
        if stepping:
            self._decode_step(stepping)
        for seq in [seq for seq in self._decoding if len(seq.unfed()) > 1]:
            self._extend_step(seq)
        budget = self.prefill_chunk
        while budget > 0 and self._prefilling:
            seq = self._prefilling[0]
            budget -= self._prefill_step(seq, budget)

    def _attach_prefix(self, seq: _Sequence) -> None:
        # Keep at least one prompt token to compute: its logits give the first output token.
        blocks = self._prefix_cache.match(seq.prompt_ids, len(seq.prompt_ids) - 1)
        position = 0
        for block in blocks:
            self._runner.write_block(seq.slot, position, block.k, block.v)
            position += len(block.tokens)
        seq.cached_len = seq.prefix_hit_tokens = position
        self.stats["prefix_hit_tokens"] += position

    def _prefill_step(self, seq: _Sequence, budget: int) -> int:
        start = seq.cached_len
        tokens = seq.prompt_ids[start : start + budget]
        started = time.perf_counter()
        logits = self._runner.prefill(seq.slot, tokens, start)
        elapsed = time.perf_counter() - started
        self.stats["forward_s"] += elapsed
        self.stats["prefill_s"] += elapsed
        self.stats["prefill_tokens"] += len(tokens)
        seq.cached_len += len(tokens)
        if seq.prefilled:
            self._prefilling.remove(seq)
            self._prefix_cache.insert(seq.prompt_ids, len(seq.prompt_ids),
                                      lambda s, e: self._runner.read_block(seq.slot, s, e))
            if seq.matcher is not None:
                need_mask = self._fill_mask(seq, 0)
                token = self._pick([seq], logits.view(1, -1), [need_mask])[0]
            else:
                token = self._pick([seq], logits.view(1, -1), [False])[0]
            if self._accept(seq, token):
                self._decoding.append(seq)
        return len(tokens)

    def _extend_step(self, seq: _Sequence) -> None:
        """Feed a run of grammar-forced tokens in one forward pass (jump-forward decoding)."""
        feed = seq.unfed()
        started = time.perf_counter()
        logits = self._runner.prefill(seq.slot, feed, seq.cached_len)
        self.stats["forward_s"] += time.perf_counter() - started
        self.stats["extend_steps"] += 1
        seq.cached_len += len(feed)
        need_mask = self._fill_mask(seq, 0) if seq.matcher is not None else False
        self._accept(seq, self._pick([seq], logits.view(1, -1), [need_mask])[0])

    def _jump_forward(self, seq: _Sequence) -> None:
        """Append the tokens the grammar forces next, without one decode step each.

        Most of a tool call's characters (keys, punctuation, const names) are forced. xgrammar
        tokenizes the forced string greedily (holding back a last token that could still grow),
        which may differ from the split the model would have chosen, so outputs can differ
        from plain decoding (2 of 158 dev decisions did, one better, one worse); pass
        ``jump_forward=False`` for token-exact plain decoding.
        """
        room = seq.max_new_tokens - len(seq.output_ids)
        accepted = []
        for token in seq.matcher.find_jump_forward_tokens()[:room]:
            if not seq.matcher.accept_token(token):
                break
            accepted.append(token)
        if accepted:
            seq.output_ids.extend(accepted)
            self.stats["forced_tokens"] += len(accepted)
            seq.pending_text += seq.detokenizer.push(accepted)

    def _fill_masks(self, batch: list[_Sequence]) -> list[bool]:
        # Row i of the scratch bitmask belongs to batch[i] for this step only.
        return [self._fill_mask(seq, row) if seq.matcher is not None else False for row, seq in enumerate(batch)]

    def _decode_step(self, batch: list[_Sequence]) -> None:
        constrained = any(seq.matcher is not None for seq in batch)
        cpu_started = time.process_time()
        masks = self._grammar_pool.submit(self._fill_masks, batch) if constrained else None
        started = time.perf_counter()
        logits = self._runner.decode(
            [seq.slot for seq in batch],
            [seq.output_ids[-1] for seq in batch],
            [seq.cached_len for seq in batch],
        )
        waited = time.perf_counter()
        need_mask = masks.result() if masks is not None else [False] * len(batch)
        self.stats["grammar_wait_s"] += time.perf_counter() - waited
        self.stats["forward_s"] += waited - started
        self.stats["decode_steps"] += 1
        self.stats["decode_tokens"] += len(batch)
        self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], len(batch))
        for seq in batch:
            seq.cached_len += 1  # the fed-back token's KV is now in the slot
        tokens = self._pick(batch, logits, need_mask)
        for seq, token in zip(batch, tokens):
            self._accept(seq, token)  # a finished request leaves the batch in _finish
        self.stats["decode_s"] += time.perf_counter() - started
        # CPU seconds of the whole process (model threads + grammar thread): the cost measure
        # that other tenants of a shared machine do not distort.
        self.stats["decode_cpu_s"] += time.process_time() - cpu_started

    def _pick(self, batch: list[_Sequence], logits: torch.Tensor, need_mask: list[bool]) -> list[int]:
        """Choose the next token per row; masks only the rows whose pick the grammar forbids."""
        logits = logits.cpu()
        normalizer = torch.logsumexp(logits, dim=-1)  # before the mask: the model's own distribution
        bitmask = self._bitmask
        for row, seq in enumerate(batch):
            penalty = seq.request.repetition_penalty
            if penalty == 1.0:
                continue
            seq.forced = need_mask[row] and _allowed_count(bitmask[row]) == 1
            if seq.penalizable and not seq.forced:
                seen = torch.tensor(sorted(set(seq.penalizable[-REPETITION_WINDOW:])), dtype=torch.long)
                scores = logits[row, seen]
                logits[row, seen] = torch.where(scores > 0, scores / penalty, scores * penalty)
        tokens = logits.argmax(dim=-1).tolist()
        mask_rows = []
        for row, seq in enumerate(batch):
            if not need_mask[row]:
                continue
            if seq.generator is None:
                token = tokens[row]
                word = int(bitmask[row, token >> 5]) & 0xFFFFFFFF
                if (word >> (token & 31)) & 1:
                    continue  # the unmasked argmax is allowed, so it is the masked argmax too
            mask_rows.append(row)
        if mask_rows:
            started = time.perf_counter()
            self.stats["mask_apply_rows"] += len(mask_rows)
            xgr.apply_token_bitmask_inplace(logits, bitmask[: len(batch)], indices=mask_rows)
            for row in mask_rows:
                tokens[row] = int(logits[row].argmax())
            self.stats["mask_apply_s"] += time.perf_counter() - started
        for row, seq in enumerate(batch):
            if seq.generator is not None:
                tokens[row] = self._sample(logits[row], seq.request.temperature, seq.request.top_p, seq.generator)
            seq.logprob += float(logits[row, tokens[row]] - normalizer[row])  # a chosen token is never masked
        return tokens

    @staticmethod
    def _sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
        probs = torch.softmax(logits / temperature, dim=-1)
        if top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = (sorted_probs.cumsum(0) - sorted_probs) < top_p
            sorted_probs = sorted_probs * keep
            choice = torch.multinomial(sorted_probs, 1, generator=generator)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=generator))

    def _accept(self, seq: _Sequence, token: int) -> bool:
        """Record ``token`` for ``seq``, stream its text, finish it if done. True if it keeps running."""
        if seq.cancel_requested:
            self._finish(seq, "cancelled")
            return False
        seq.output_ids.append(token)
        if seq.request.repetition_penalty != 1.0 and not seq.forced and token not in seq.prompt_tokens:
            seq.penalizable.append(token)
        if seq.matcher is not None:
            started = time.perf_counter()
            accepted = seq.matcher.accept_token(token)
            self.stats["grammar_accept_s"] += time.perf_counter() - started
            if not accepted:
                self._finish(seq, None, error=StreamInterruptedError(
                    f"grammar rejected token {token} for request {seq.request_id}"))
                return False
        is_eos = token in self.eos_token_ids
        if not is_eos:
            seq.pending_text += seq.detokenizer.push([token])
        if self._check_stop_strings(seq):
            self._finish(seq, "stop")
            return False
        if is_eos or (seq.matcher is not None and seq.matcher.is_terminated()):
            self._finish(seq, "stop")
            return False
        if self.jump_forward and seq.matcher is not None and len(seq.output_ids) < seq.max_new_tokens:
            self._jump_forward(seq)
            if self._check_stop_strings(seq):
                self._finish(seq, "stop")
                return False
        if len(seq.output_ids) >= seq.max_new_tokens:
            seq.pending_text += seq.detokenizer.flush()
            self._finish(seq, "length")
            return False
        self._emit(seq)
        return True

    def _check_stop_strings(self, seq: _Sequence) -> bool:
        stops = seq.request.stop
        if not stops or not seq.pending_text:
            return False
        # Search the sent tail too: a stop string may straddle two chunks' boundary.
        tail = max(len(stop) for stop in stops)
        window_start = max(0, len(seq.text) - tail)
        window = seq.text[window_start:] + seq.pending_text
        hits = [window.find(stop) for stop in stops if stop in window]
        if not hits:
            return False
        cut = window_start + min(hits)  # absolute offset in the full text
        full = seq.text + seq.pending_text
        seq.pending_text = full[len(seq.text) : max(cut, len(seq.text))]
        return True

    def _emit(self, seq: _Sequence) -> None:
        text = seq.pending_text
        if seq.request.stop and text:
            # Hold back a suffix that could start a stop string.
            hold = 0
            for stop in seq.request.stop:
                for size in range(min(len(stop) - 1, len(text)), 0, -1):
                    if text.endswith(stop[:size]):
                        hold = max(hold, size)
                        break
            text = text[: len(text) - hold]
        if not text:
            return
        seq.pending_text = seq.pending_text[len(text) :]
        seq.text += text
        seq.sink(GenerationChunk(request_id=seq.request_id, text=text, token_ids=self._take_ids(seq)))

    @staticmethod
    def _take_ids(seq: _Sequence) -> tuple[int, ...]:
        ids = tuple(seq.output_ids[seq.reported_ids :])
        seq.reported_ids = len(seq.output_ids)
        return ids

    def _finish(self, seq: _Sequence, reason: str | None, *, error: DeciderError | None = None) -> None:
        """Free the slot and matcher, send the final chunk (or the error), forget the request."""
        if seq.finished:
            return
        seq.finished = True
        for group in (self._waiting, self._prefilling, self._decoding):
            if seq in group:
                group.remove(seq)
        if seq.slot >= 0:
            heapq.heappush(self._free_slots, seq.slot)
            seq.slot = -1
        seq.matcher = None
        with self._lock:
            if self._by_key.get(seq.key) is seq:
                del self._by_key[seq.key]
        if error is not None:
            seq.sink(error)
            return
        text = seq.pending_text
        seq.text += text
        seq.pending_text = ""
        seq.sink(GenerationChunk(request_id=seq.request_id, text=text, token_ids=self._take_ids(seq), finished=True,
                                 finish_reason=reason, usage=seq.usage(), logprob=seq.logprob))
