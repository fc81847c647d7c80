"""What one request owns inside the embedded engine: its sequence record, its text and chunks, its detokenizer.

Built fresh per request by the engine's ``_prepare``, never shared: the scheduler rebuilds each step's batch
from these objects, keyed by request id, never by batch position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import xgrammar as xgr

from decider.backend import GenerationChunk, GenerationRequest

__all__ = ["DETOKENIZER_CONTEXT", "EngineSequence", "IncrementalDetokenizer", "REPETITION_WINDOW"]

#: Prompt tokens given to the detokenizer as context (leading-space handling of SentencePiece vocabularies).
DETOKENIZER_CONTEXT = 4
#: Tokens the model chose itself that a repetition penalty looks back over.
REPETITION_WINDOW = 64


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without splitting UTF-8 characters.

    Byte-level BPE splits one Chinese character over several tokens; decoding them one by one
    yields U+FFFD. We decode a short window and only emit once the window's text no longer ends
    in a replacement character (the scheme vLLM and TGI use).
    """

    def __init__(self, decode: Callable[[list[int]], str], context: list[int]) -> None:
        self._decode = decode
        self._ids = list(context)
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def push(self, token_ids: list[int]) -> str:
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at a length stop)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""


@dataclass(eq=False, kw_only=True)
class EngineSequence:
    """Everything one request owns inside the engine."""

    key: str
    request: GenerationRequest
    prompt_ids: list[int]
    max_new_tokens: int
    matcher: xgr.GrammarMatcher | None
    #: For JSON constraints, a bitmask row of tokens free of raw control bytes, AND-ed into every mask.
    json_tokens: torch.Tensor | None
    generator: torch.Generator | None
    detokenizer: IncrementalDetokenizer
    sink: Callable[[GenerationChunk | BaseException], None]
    slot: int = -1
    #: Tokens whose KV is in the slot (prompt first, then generated tokens once fed back).
    cached_len: int = 0
    prefix_hit_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    #: How many of ``output_ids`` have been reported in a chunk's ``token_ids``.
    reported_ids: int = 0
    #: Text decoded but not yet sent (held back while it could be the start of a stop string).
    pending_text: str = ""
    text: str = ""
    cancel_requested: bool = False
    finished: bool = False
    #: Sum of the chosen tokens' log-probabilities under the model (before the grammar mask); tokens
    #: a jump-forward appends are not scored (the grammar left no choice).
    logprob: float = 0.0
    #: What a repetition penalty may touch: tokens the model chose itself (the grammar allowed more than one)
    #: that the prompt does not hold. Forced tokens (keys, quotes, brackets) and values copied from the
    #: conversation are never penalised: a penalty on them made the model avoid closing strings.
    penalizable: list[int] = field(default_factory=list)
    #: Token ids of the prompt (built only for a request with a penalty).
    prompt_tokens: frozenset[int] = frozenset()
    #: Whether the grammar left exactly one token at the step just picked.
    forced: bool = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prefilled(self) -> bool:
        return self.cached_len >= len(self.prompt_ids)

    def unfed(self) -> list[int]:
        """Generated tokens whose KV is not in the slot yet (one, or more after a jump-forward)."""
        return self.output_ids[self.cached_len - len(self.prompt_ids) :]

    def cut_at_stop(self) -> bool:
        """Whether the text so far holds a stop string; if so the pending text is cut just before it."""
        stops = self.request.stop
        if not stops or not self.pending_text:
            return False
        # Search the sent tail too: a stop string may straddle two chunks' boundary.
        tail = max(len(stop) for stop in stops)
        window_start = max(0, len(self.text) - tail)
        window = self.text[window_start:] + self.pending_text
        hits = [window.find(stop) for stop in stops if stop in window]
        if not hits:
            return False
        cut = window_start + min(hits)  # absolute offset in the full text
        full = self.text + self.pending_text
        self.pending_text = full[len(self.text) : max(cut, len(self.text))]
        return True

    def emit(self) -> None:
        """Send the pending text, less a suffix that could start a stop string, as a chunk."""
        text = self.pending_text
        if self.request.stop and text:
            hold = 0
            for stop in self.request.stop:
                for size in range(min(len(stop) - 1, len(text)), 0, -1):
                    if text.endswith(stop[:size]):
                        hold = max(hold, size)
                        break
            text = text[: len(text) - hold]
        if not text:
            return
        self.pending_text = self.pending_text[len(text) :]
        self.text += text
        self.sink(GenerationChunk(request_id=self.request_id, text=text, token_ids=self._take_ids()))

    def emit_last(self, reason: str | None) -> None:
        """Send the rest of the text as the final chunk, with the finish reason, usage and log-probability."""
        text, self.pending_text = self.pending_text, ""
        self.text += text
        self.sink(GenerationChunk(request_id=self.request_id, text=text, token_ids=self._take_ids(), finished=True,
                                  finish_reason=reason, usage=self.usage(), logprob=self.logprob))

    def _take_ids(self) -> tuple[int, ...]:
        """The output ids not yet reported in a chunk's ``token_ids``, now marked reported."""
        ids = tuple(self.output_ids[self.reported_ids :])
        self.reported_ids = len(self.output_ids)
        return ids

    def usage(self) -> dict[str, int]:
        prompt = len(self.prompt_ids)
        completion = len(self.output_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "cached_tokens": self.prefix_hit_tokens,
        }
