"""The embedded engine's model side: a Llama-family forward pass over a slot-addressed KV cache, and
the prefix cache of prompt KV blocks.

The engine's scheduler (:mod:`decider.engine_scheduler`) owns one :class:`LlamaRunner` and one
:class:`PrefixCache` per engine; nothing here knows about requests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from decider.errors import InvalidRequestError

__all__ = ["LlamaRunner", "PrefixBlock", "PrefixCache", "Weights"]


# --------------------------------------------------------------------------------------------
# Prefix cache
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class PrefixBlock:
    parent: int | None
    tokens: tuple[int, ...]
    k: torch.Tensor  # [layers, kv_heads, block, head_dim]
    v: torch.Tensor


class PrefixCache:
    """KV of prompt prefixes in fixed blocks, chained by hash, evicted LRU by bytes.

    A request whose prompt starts with blocks seen before (the system prompt, tool list and
    examples rendered identically) copies their KV into its slot instead of recomputing it.
    """

    def __init__(self, *, block: int, capacity_bytes: int) -> None:
        self.block = block
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._blocks: OrderedDict[int, PrefixBlock] = OrderedDict()

    def _chain(self, ids: list[int], limit: int) -> Iterator[tuple[int, int | None, tuple[int, ...]]]:
        parent: int | None = None
        for start in range(0, limit - self.block + 1, self.block):
            tokens = tuple(ids[start : start + self.block])
            key = hash((parent, tokens))
            yield key, parent, tokens
            parent = key

    def match(self, ids: list[int], limit: int) -> list[PrefixBlock]:
        """The longest run of cached blocks at the start of ``ids[:limit]``."""
        found: list[PrefixBlock] = []
        for key, parent, tokens in self._chain(ids, limit):
            block = self._blocks.get(key)
            if block is None or block.parent != parent or block.tokens != tokens:
                break
            self._blocks.move_to_end(key)
            found.append(block)
        return found

    def insert(self, ids: list[int], limit: int, read: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]) -> None:
        if self.capacity_bytes <= 0:
            return
        for index, (key, parent, tokens) in enumerate(self._chain(ids, limit)):
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            k, v = read(index * self.block, (index + 1) * self.block)
            self._blocks[key] = PrefixBlock(parent, tokens, k, v)
            self.size_bytes += k.numel() * k.element_size() * 2
        while self.size_bytes > self.capacity_bytes and self._blocks:
            _, evicted = self._blocks.popitem(last=False)
            self.size_bytes -= evicted.k.numel() * evicted.k.element_size() * 2


# --------------------------------------------------------------------------------------------
# The model runner: Llama-family forward over a slot-addressed KV cache
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Weights:
    """The modules of one copy of a HF Llama-family decoder that our forward pass calls."""

    embed: Any
    norm: Any
    rotary: Any
    lm_head: Any
    layers: list[Any]

    @classmethod
    def of(cls, model: Any) -> Weights:
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if inner is None or layers is None or not hasattr(layers[0], "self_attn") or not hasattr(model, "lm_head"):
            raise InvalidRequestError(f"{type(model).__name__} is not a Llama-family decoder the embedded engine can run")
        return cls(inner.embed_tokens, inner.norm, inner.rotary_emb, model.lm_head, list(layers))


class LlamaRunner:
    """Forward passes of a HF Llama-family decoder over a preallocated, slot-addressed KV cache.

    KV layout: ``[layers, slots, kv_heads, max_seq_len, head_dim]``. A decode step attends over
    the view ``[:, :highest_active_slot+1, :, :longest+1]`` (no gather, no concatenation);
    rows of idle slots compute garbage that is never read.
    """

    def __init__(self, model: Any, *, num_slots: int, max_seq_len: int, device: torch.device, dtype: torch.dtype,
                 decode_model: Any | None = None) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        config = model.config
        self._apply_rope = apply_rotary_pos_emb
        self.model = model
        #: Multi-token passes (prefill, jump-forward extends) run ``model``; single-token decode
        #: steps run ``decode_model`` (the same weights in another dtype) when one is given.
        self.full = Weights.of(model)
        self.step = Weights.of(decode_model) if decode_model is not None else self.full
        self.layers = self.full.layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.groups = self.num_heads // self.num_kv_heads
        self.scaling = getattr(self.layers[0].self_attn, "scaling", self.head_dim**-0.5)
        self.vocab_size = config.vocab_size
        self.device = device
        #: The KV cache's dtype, shared by both weight sets: their q/k/v are cast to it.
        self.dtype = dtype
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        shape = (len(self.layers), num_slots, self.num_kv_heads, max_seq_len, self.head_dim)
        # torch.empty: pages are only touched as slots fill up. Positions are zeroed lazily up
        # to each slot's high-water mark, because masked-out attention weights (exact zeros)
        # times uninitialised memory (possibly NaN) would still poison a row.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self._clean_upto = [0] * num_slots

    def _ensure_clean(self, slot: int, upto: int) -> None:
        start = self._clean_upto[slot]
        if upto > start:
            self.k[:, slot, :, start:upto].zero_()
            self.v[:, slot, :, start:upto].zero_()
            self._clean_upto[slot] = upto

    def _project(self, layer: Any, hidden: torch.Tensor, batch: int, length: int) -> tuple[torch.Tensor, ...]:
        attn = layer.self_attn
        q = attn.q_proj(hidden).view(batch, length, self.num_heads, self.head_dim)
        k = attn.k_proj(hidden).view(batch, length, self.num_kv_heads, self.head_dim)
        v = attn.v_proj(hidden).view(batch, length, self.num_kv_heads, self.head_dim)
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        if q_norm is not None:  # Qwen3-style per-head norms
            q = q_norm(q)
        if k_norm is not None:
            k = k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _finish_layer(self, layer: Any, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        hidden = hidden + layer.self_attn.o_proj(attn_out.to(hidden.dtype))
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    @staticmethod
    def _logits(weights: Weights, hidden: torch.Tensor) -> torch.Tensor:
        return weights.lm_head(weights.norm(hidden)).float()

    def decode(self, slots: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        """One token for each of ``len(slots)`` sequences; returns float logits ``[B, vocab]``."""
        batch = len(slots)
        device = self.device
        slot_t = torch.tensor(slots, device=device)
        pos_t = torch.tensor(positions, device=device)
        rows = max(slots) + 1
        span = max(positions) + 1
        for slot in slots:
            self._ensure_clean(slot, span)
        # Per-slot query positions for the view over slots [0, rows); idle rows attend to position 0.
        pos_rows = torch.zeros(rows, dtype=torch.long, device=device)
        pos_rows[slot_t] = pos_t
        key_pos = torch.arange(span, device=device)
        blocked = (key_pos.view(1, span) > pos_rows.view(rows, 1)).view(rows, 1, 1, span)

        weights = self.step
        hidden = weights.embed(torch.tensor(tokens, device=device).view(batch, 1))
        cos, sin = weights.rotary(hidden, pos_t.view(batch, 1))
        q_rows = torch.zeros(rows, self.num_kv_heads, self.groups, self.head_dim, dtype=self.dtype, device=device)
        for index, layer in enumerate(weights.layers):
            normed = layer.input_layernorm(hidden)
            q, k, v = self._project(layer, normed, batch, 1)
            q, k = self._apply_rope(q, k, cos, sin)
            self.k[index][slot_t, :, pos_t] = k[:, :, 0].to(self.dtype)
            self.v[index][slot_t, :, pos_t] = v[:, :, 0].to(self.dtype)
            keys = self.k[index, :rows, :, :span]  # views: [rows, kv, span, hd]
            values = self.v[index, :rows, :, :span]
            q_rows[slot_t] = q.view(batch, self.num_kv_heads, self.groups, self.head_dim).to(self.dtype)
            scores = torch.matmul(q_rows, keys.transpose(-1, -2)).float() * self.scaling  # [rows, kv, g, span]
            scores.masked_fill_(blocked, float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(values.dtype)
            out = torch.matmul(probs, values)[slot_t]  # [B, kv, g, hd]
            hidden = self._finish_layer(layer, hidden, out.reshape(batch, 1, self.num_heads * self.head_dim))
        return self._logits(weights, hidden[:, -1])

    def prefill(self, slot: int, tokens: list[int], start: int) -> torch.Tensor:
        """Write the KV of ``tokens`` at ``start..`` of ``slot``; returns float logits of the last token."""
        length = len(tokens)
        end = start + length
        device = self.device
        self._ensure_clean(slot, end)
        weights = self.full
        hidden = weights.embed(torch.tensor(tokens, device=device).view(1, length))
        positions = torch.arange(start, end, device=device).view(1, length)
        cos, sin = weights.rotary(hidden, positions)
        allowed = torch.arange(end, device=device).view(1, end) <= positions.view(length, 1)  # [T, end]
        for index, layer in enumerate(weights.layers):
            normed = layer.input_layernorm(hidden)
            q, k, v = self._project(layer, normed, 1, length)
            q, k = self._apply_rope(q, k, cos, sin)
            self.k[index, slot, :, start:end] = k[0]
            self.v[index, slot, :, start:end] = v[0]
            keys = self.k[index, slot : slot + 1, :, :end]
            values = self.v[index, slot : slot + 1, :, :end]
            out = torch.nn.functional.scaled_dot_product_attention(
                q.to(self.dtype), keys, values, attn_mask=allowed, scale=self.scaling, enable_gqa=self.groups > 1
            )
            hidden = self._finish_layer(layer, hidden, out.transpose(1, 2).reshape(1, length, self.num_heads * self.head_dim))
        return self._logits(weights, hidden[:, -1])[0]

    def read_block(self, slot: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[:, slot, :, start:end].clone(), self.v[:, slot, :, start:end].clone()

    def write_block(self, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[2]
        self.k[:, slot, :, start:end] = k
        self.v[:, slot, :, start:end] = v
        self._clean_upto[slot] = max(self._clean_upto[slot], end)
