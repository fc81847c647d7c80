"""Choosing the embedded engine's next tokens: the grammar's bitmask, the repetition penalty, greedy or seeded sampling.

A :class:`TokenSampler` owns one engine's scratch bitmask (row ``i`` is the ``i``-th sequence of the step being
picked) and its two JSON token masks.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import xgrammar as xgr

from decider.engine_sequence import REPETITION_WINDOW, EngineSequence

__all__ = ["TokenSampler", "allowed_count", "json_token_bitmask", "sample"]


def allowed_count(row: torch.Tensor) -> int:
    """How many tokens one row of an xgrammar bitmask allows (its set bits)."""
    return int(np.unpackbits(row.numpy().view(np.uint8)).sum())


def json_token_bitmask(info: xgr.TokenizerInfo, eos_token_ids: set[int], *, allow_whitespace: bool) -> torch.Tensor:
    """One bitmask row allowing every token without a raw control byte (but \t \n \r if asked).

    xgrammar 0.2.9's token mask lets tokens such as 0x10 or "\t\t" into JSON strings
    (``accept_string`` refuses them), which makes ``json.loads`` fail. Control bytes other
    than \t \n \r are never valid in JSON text; those three only as whitespace between
    tokens, which our own compiles (``any_whitespace=False``) never allow.
    """
    allowed = torch.ones(info.vocab_size, dtype=torch.bool)
    banned = set(range(0x20)) - ({0x09, 0x0A, 0x0D} if allow_whitespace else set())
    for token_id, raw in enumerate(info.decoded_vocab):
        if token_id not in eos_token_ids and any(byte in banned for byte in raw):
            allowed[token_id] = False
    words = (info.vocab_size + 31) // 32
    bits = np.zeros(words * 32, dtype=bool)
    bits[: allowed.numel()] = allowed.numpy()
    # Bit k of word w is token 32*w + k, as in xgrammar's bitmask (little-endian int32 words).
    packed = np.packbits(bits, bitorder="little").view("<i4")
    return torch.from_numpy(packed.astype(np.int32))


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """One token drawn from ``logits`` at ``temperature``, nucleus-cut at ``top_p``, with the request's own RNG."""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = (sorted_probs.cumsum(0) - sorted_probs) < top_p
        sorted_probs = sorted_probs * keep
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


class TokenSampler:
    """Picks each step's next token per sequence; masks only the rows whose pick the grammar forbids."""

    def __init__(self, info: xgr.TokenizerInfo, eos_token_ids: set[int], *, max_batch_size: int,
                 stats: dict[str, float]) -> None:
        self.bitmask = xgr.allocate_token_bitmask(max_batch_size, info.vocab_size)
        #: For JSON constraints: tokens free of raw control bytes, with (safe) or without (strict) \t \n \r.
        self.json_safe_tokens = json_token_bitmask(info, eos_token_ids, allow_whitespace=True)
        self.json_strict_tokens = json_token_bitmask(info, eos_token_ids, allow_whitespace=False)
        self.stats = stats

    def fill_mask(self, seq: EngineSequence, row: int) -> bool:
        """Fill ``row`` of the scratch bitmask for ``seq``; True if the row needs masking."""
        if seq.matcher is None:
            return False
        need = seq.matcher.fill_next_token_bitmask(self.bitmask, row)
        if seq.json_tokens is not None:
            self.bitmask[row] &= seq.json_tokens
            return True
        return need

    def fill_masks(self, batch: list[EngineSequence]) -> list[bool]:
        # Row i of the scratch bitmask belongs to batch[i] for this step only.
        return [self.fill_mask(seq, row) for row, seq in enumerate(batch)]

    def pick(self, batch: list[EngineSequence], logits: torch.Tensor, need_mask: list[bool]) -> list[int]:
        """Choose the next token per row; masks only the rows whose pick the grammar forbids."""
        logits = logits.cpu()
        normalizer = torch.logsumexp(logits, dim=-1)  # before the mask: the model's own distribution
        bitmask = self.bitmask
        for row, seq in enumerate(batch):
            penalty = seq.request.repetition_penalty
            if penalty == 1.0:
                continue
            seq.forced = need_mask[row] and allowed_count(bitmask[row]) == 1
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
                tokens[row] = sample(logits[row], seq.request.temperature, seq.request.top_p, seq.generator)
            seq.logprob += float(logits[row, tokens[row]] - normalizer[row])  # a chosen token is never masked
        return tokens
