"""Compile grammar schemas with xgrammar, cached by (schema hash, tokenizer hash): the one grammar cache.

A compiled grammar is the expensive, shareable object (xgrammar's own advice: compile once,
match per request); the per-request :class:`xgrammar.GrammarMatcher` is the backend's business.
Base tool-call grammars hit the cache; per-request narrowed grammars (grounding) are compiled
on demand and their compile time is measured and reported. The embedded engine owns one
:class:`GrammarCache` (its deciders and its own ``json_schema`` requests share it, compiled with
the same options); xgrammar's internal cache is off beneath it, so :meth:`GrammarCache.stats`
counts every compile.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import xgrammar as xgr

from decider.errors import UnsupportedSchemaError

__all__ = ["CompiledConstraint", "DEFAULT_CACHE_SIZE", "DEFAULT_SEPARATORS", "GrammarCache", "schema_rules", "tokenizer_hash"]

#: Compiled grammars kept per cache (LRU).
DEFAULT_CACHE_SIZE = 256
#: Compact JSON with the separators ``json.dumps`` uses; a small model has seen this layout most.
DEFAULT_SEPARATORS = (", ", ": ")


@dataclass(frozen=True)
class CompiledConstraint:
    """A compiled grammar plus how it was obtained."""

    grammar: xgr.CompiledGrammar
    key: tuple[str, str]
    compile_s: float
    cache_hit: bool


_RULE_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::=", re.MULTILINE)
_OPEN_REPEAT = re.compile(r"\{(\d+), -1\}")


def _rename_outside_literals(text: str, names: set[str], prefix: str) -> str:
    """``text`` with every rule name in ``names`` prefixed, string literals and character classes left alone."""
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char in "\"[":
            close = '"' if char == '"' else "]"
            j = i + 1
            while j < len(text) and text[j] != close:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif char.isalpha() or char == "_":
            j = i
            while j < len(text) and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            out.append(prefix + word if word in names else word)
            i = j
        else:
            out.append(char)
            i += 1
    return "".join(out)


def schema_rules(schema_json: str, prefix: str, *, separators: tuple[str, str] = DEFAULT_SEPARATORS) -> tuple[str, str]:
    """A JSON Schema's grammar as EBNF rules named ``<prefix>...`` (to sit beside other rules in one grammar), in
    the syntax older xgrammar releases parse too (TensorRT-LLM 1.0 pins 0.1.21, which reads no ``{n, -1}``): the
    rules' text and the name of their root rule."""
    try:
        text = str(xgr.Grammar.from_json_schema(schema_json, any_whitespace=False, separators=separators, strict_mode=True))
    except (RuntimeError, ValueError) as exc:
        raise UnsupportedSchemaError("schema", "", f"the constraint engine cannot compile this schema: {exc}") from None
    text = _OPEN_REPEAT.sub(r"{\1,}", text)
    return _rename_outside_literals(text, set(_RULE_NAME.findall(text)), prefix), prefix + "root"


def tokenizer_hash(tokenizer_info: xgr.TokenizerInfo) -> str:
    """A stable hash of an xgrammar tokenizer description (vocabulary and metadata)."""
    digest = hashlib.sha256(tokenizer_info.dump_metadata().encode())
    for token in tokenizer_info.decoded_vocab:
        digest.update(len(token).to_bytes(4, "little"))
        digest.update(token)
    return digest.hexdigest()[:16]


class GrammarCache:
    """Compiles JSON-Schema grammars for one tokenizer and keeps the last ``maxsize`` of them.

    Thread-safe: the decider's event loop thread and API threads may compile concurrently.
    """

    def __init__(self, compiler: xgr.GrammarCompiler, tokenizer_info: xgr.TokenizerInfo, *,
                 maxsize: int = DEFAULT_CACHE_SIZE, any_whitespace: bool = False,
                 separators: tuple[str, str] = DEFAULT_SEPARATORS) -> None:
        self.compiler = compiler
        self.tokenizer_hash = tokenizer_hash(tokenizer_info)
        self.maxsize = maxsize
        self.any_whitespace = any_whitespace
        self.separators = separators
        self._cache: OrderedDict[tuple[str, str], xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.compile_seconds: list[float] = []

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, **options: Any) -> "GrammarCache":
        """A cache with its own compiler for a Hugging Face tokenizer."""
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=getattr(tokenizer, "vocab_size_padded", None) or len(tokenizer))
        return cls(xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False), info, **options)

    def compile(self, schema_json: str) -> CompiledConstraint:
        """The compiled grammar of ``schema_json`` (a grammar schema as canonical JSON text)."""
        return self._compile(schema_json, lambda: self.compiler.compile_json_schema(
            schema_json, any_whitespace=self.any_whitespace, separators=self.separators, strict_mode=True))

    def _compile(self, text: str, build: Any) -> CompiledConstraint:
        key = (hashlib.sha256(text.encode()).hexdigest()[:16], self.tokenizer_hash)
        with self._lock:
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return CompiledConstraint(grammar=grammar, key=key, compile_s=0.0, cache_hit=True)
        start = time.perf_counter()
        try:
            grammar = build()
        except (RuntimeError, ValueError) as exc:
            raise UnsupportedSchemaError("schema", "", f"the constraint engine cannot compile this schema: {exc}") from None
        elapsed = time.perf_counter() - start
        with self._lock:
            self.misses += 1
            self.compile_seconds.append(elapsed)
            del self.compile_seconds[:-1000]
            self._cache[key] = grammar
            while len(self._cache) > self.maxsize:
                self._cache.popitem(last=False)
        return CompiledConstraint(grammar=grammar, key=key, compile_s=elapsed, cache_hit=False)

    def compile_structural_tag(self, tag_json: str) -> CompiledConstraint:
        """The compiled grammar of an xgrammar structural tag (a native tool format's constraint), cached
        like schemas (its key is the tag text's hash)."""
        return self._compile(tag_json, lambda: self.compiler.compile_structural_tag(tag_json))

    def stats(self) -> dict[str, Any]:
        """Grammars held, hits, misses and compile seconds (median and slowest of the last 1,000 compiles)."""
        with self._lock:
            seconds = sorted(self.compile_seconds)
            return {"size": len(self._cache), "maxsize": self.maxsize, "hits": self.hits, "misses": self.misses,
                    "compile_s_p50": seconds[len(seconds) // 2] if seconds else 0.0,
                    "compile_s_max": seconds[-1] if seconds else 0.0}

    def __len__(self) -> int:
        return len(self._cache)
