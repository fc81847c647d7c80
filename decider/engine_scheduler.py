"""The embedded engine's scheduler: one thread, a slot-addressed KV cache, continuous batching.

Every iteration the scheduler

1. takes in new and cancelled requests,
2. admits waiting requests into free slots (copying any cached shared-prefix KV into the slot),
3. runs **one decode step for every running request at once**, while a grammar thread fills
   each constrained request's token bitmask for that step (the forward pass never waits on
   grammar work until the logits exist),
4. prefills at most ``prefill_chunk`` prompt tokens of admitted requests,

so requests join and leave the running batch at every decode step. A request ends at EOS, when its
matcher has terminated, at a stop string or at ``max_tokens``; its chunks (or an error) go to its sink.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import heapq
import logging
import threading
import time
import weakref

import torch

from decider.engine_sampling import TokenSampler
from decider.engine_sequence import EngineSequence
from decider.errors import BackendUnavailableError, DeciderError, InvalidRequestError, StreamInterruptedError
from decider.kv_runner import LlamaRunner, PrefixCache

__all__ = ["Scheduler"]

logger = logging.getLogger(__name__)

#: Schedulers still running at interpreter exit are closed first: a scheduler thread killed inside
#: native code at shutdown aborts the process ("terminate called without an active exception").
_OPEN_SCHEDULERS: weakref.WeakSet[Scheduler] = weakref.WeakSet()


@atexit.register
def _close_open_schedulers() -> None:
    for scheduler in list(_OPEN_SCHEDULERS):
        scheduler.close()


class Scheduler:
    """Runs every submitted :class:`EngineSequence` to its end on one background thread (started on first use)."""

    def __init__(self, runner: LlamaRunner, prefix_cache: PrefixCache, sampler: TokenSampler, *,
                 eos_token_ids: set[int], prefill_chunk: int, jump_forward: bool) -> None:
        self.runner = runner
        self._prefix_cache = prefix_cache
        self._sampler = sampler
        self._eos_token_ids = eos_token_ids
        self._prefill_chunk = max(1, prefill_chunk)
        self._jump_forward_on = jump_forward
        self.stats = sampler.stats
        #: KV slots no request holds, lowest first.
        self.free_slots = list(range(runner.num_slots))
        heapq.heapify(self.free_slots)
        self._lock = threading.Condition()
        self._inbox: list[EngineSequence] = []
        self._by_key: dict[str, EngineSequence] = {}
        self._waiting: list[EngineSequence] = []
        self._prefilling: list[EngineSequence] = []
        self._decoding: list[EngineSequence] = []
        self._grammar_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolrail-grammar")
        self._thread: threading.Thread | None = None
        self.closed = False
        _OPEN_SCHEDULERS.add(self)

    # ---------------------------------------------------------------- submission

    def submit(self, seq: EngineSequence) -> None:
        with self._lock:
            if self.closed:
                raise BackendUnavailableError("the embedded engine is closed")
            if seq.key in self._by_key:
                raise InvalidRequestError(f"request {seq.key!r} is already running")
            self._by_key[seq.key] = seq
            self._inbox.append(seq)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="toolrail-engine", daemon=True)
                self._thread.start()
            self._lock.notify()

    def cancel(self, key: str) -> bool:
        """Stop the request under ``key``; its slot and matcher are freed at the next iteration."""
        with self._lock:
            seq = self._by_key.get(key)
        if seq is not None:
            self.cancel_seq(seq)
        return seq is not None

    def cancel_seq(self, seq: EngineSequence) -> None:
        with self._lock:
            if not seq.finished:
                seq.cancel_requested = True
                self._lock.notify()

    @property
    def active_requests(self) -> int:
        with self._lock:
            return len(self._by_key)

    def close(self) -> None:
        """Cancel everything in flight and stop the scheduler thread."""
        with self._lock:
            self.closed = True
            self._lock.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=30)
        self._grammar_pool.shutdown(wait=False)

    # ---------------------------------------------------------------- the loop

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not self.closed and not (self._inbox or self._waiting or self._prefilling or self._decoding):
                        self._lock.wait()
                    if self.closed:
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
        while self._waiting and self.free_slots:
            seq = self._waiting.pop(0)
            seq.slot = heapq.heappop(self.free_slots)
            self._attach_prefix(seq)
            self._prefilling.append(seq)
        stepping = [seq for seq in self._decoding if len(seq.unfed()) == 1]
        if stepping:
            self._decode_step(stepping)
        for seq in [seq for seq in self._decoding if len(seq.unfed()) > 1]:
            self._extend_step(seq)
        budget = self._prefill_chunk
        while budget > 0 and self._prefilling:
            seq = self._prefilling[0]
            budget -= self._prefill_step(seq, budget)

    # ---------------------------------------------------------------- forward passes

    def _attach_prefix(self, seq: EngineSequence) -> None:
        # Keep at least one prompt token to compute: its logits give the first output token.
        blocks = self._prefix_cache.match(seq.prompt_ids, len(seq.prompt_ids) - 1)
        position = 0
        for block in blocks:
            self.runner.write_block(seq.slot, position, block.k, block.v)
            position += len(block.tokens)
        seq.cached_len = seq.prefix_hit_tokens = position
        self.stats["prefix_hit_tokens"] += position

    def _pick_one(self, seq: EngineSequence, logits: torch.Tensor) -> int:
        """The next token of ``seq`` alone, from the logits of a multi-token pass (its row 0 of the bitmask)."""
        return self._sampler.pick([seq], logits.view(1, -1), [self._sampler.fill_mask(seq, 0)])[0]

    def _prefill_step(self, seq: EngineSequence, budget: int) -> int:
        start = seq.cached_len
        tokens = seq.prompt_ids[start : start + budget]
        started = time.perf_counter()
        logits = self.runner.prefill(seq.slot, tokens, start)
        elapsed = time.perf_counter() - started
        self.stats["forward_s"] += elapsed
        self.stats["prefill_s"] += elapsed
        self.stats["prefill_tokens"] += len(tokens)
        seq.cached_len += len(tokens)
        if seq.prefilled:
            self._prefilling.remove(seq)
            self._prefix_cache.insert(seq.prompt_ids, len(seq.prompt_ids),
                                      lambda s, e: self.runner.read_block(seq.slot, s, e))
            if self.accept(seq, self._pick_one(seq, logits)):
                self._decoding.append(seq)
        return len(tokens)

    def _extend_step(self, seq: EngineSequence) -> None:
        """Feed a run of grammar-forced tokens in one forward pass (jump-forward decoding)."""
        feed = seq.unfed()
        started = time.perf_counter()
        logits = self.runner.prefill(seq.slot, feed, seq.cached_len)
        self.stats["forward_s"] += time.perf_counter() - started
        self.stats["extend_steps"] += 1
        seq.cached_len += len(feed)
        self.accept(seq, self._pick_one(seq, logits))

    def _decode_step(self, batch: list[EngineSequence]) -> None:
        constrained = any(seq.matcher is not None for seq in batch)
        cpu_started = time.process_time()
        masks = self._grammar_pool.submit(self._sampler.fill_masks, batch) if constrained else None
        started = time.perf_counter()
        logits = self.runner.decode(
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
        tokens = self._sampler.pick(batch, logits, need_mask)
        for seq, token in zip(batch, tokens):
            self.accept(seq, token)  # a finished request leaves the batch in _finish
        self.stats["decode_s"] += time.perf_counter() - started
        # CPU seconds of the whole process (model threads + grammar thread): the cost measure
        # that other tenants of a shared machine do not distort.
        self.stats["decode_cpu_s"] += time.process_time() - cpu_started

    # ---------------------------------------------------------------- a chosen token

    def _jump_forward(self, seq: EngineSequence) -> None:
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

    def accept(self, seq: EngineSequence, token: int) -> bool:
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
        is_eos = token in self._eos_token_ids
        if not is_eos:
            seq.pending_text += seq.detokenizer.push([token])
        if seq.cut_at_stop():
            self._finish(seq, "stop")
            return False
        if is_eos or (seq.matcher is not None and seq.matcher.is_terminated()):
            self._finish(seq, "stop")
            return False
        if self._jump_forward_on and seq.matcher is not None and len(seq.output_ids) < seq.max_new_tokens:
            self._jump_forward(seq)
            if seq.cut_at_stop():
                self._finish(seq, "stop")
                return False
        if len(seq.output_ids) >= seq.max_new_tokens:
            seq.pending_text += seq.detokenizer.flush()
            self._finish(seq, "length")
            return False
        seq.emit()
        return True

    def _finish(self, seq: EngineSequence, reason: str | None, *, error: DeciderError | None = None) -> None:
        """Free the slot and matcher, send the final chunk (or the error), forget the request."""
        if seq.finished:
            return
        seq.finished = True
        for group in (self._waiting, self._prefilling, self._decoding):
            if seq in group:
                group.remove(seq)
        if seq.slot >= 0:
            heapq.heappush(self.free_slots, seq.slot)
            seq.slot = -1
        seq.matcher = None
        with self._lock:
            if self._by_key.get(seq.key) is seq:
                del self._by_key[seq.key]
        if error is not None:
            seq.sink(error)
            return
        seq.emit_last(reason)
