"""The inference-backend boundary: submit one request, stream back that request's output.

Two implementations plug in here: the embedded engine (in-process continuous
batching, ``decider/embedded.py``) and Triton + TensorRT-LLM (``decider/triton.py``).
The same JSON Schema drives both: the embedded engine compiles it with xgrammar,
Triton receives it as ``guided_decoding_guide`` with guide type ``json_schema``.
Every request and every chunk carries its ``request_id``; nothing is keyed by batch position.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["GenerationChunk", "GenerationRequest", "InferenceBackend"]


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    """One generation to run."""

    request_id: str
    #: The fully rendered prompt (chat template already applied).
    prompt: str
    #: The constraint as a JSON Schema string; None for unconstrained text.
    json_schema: str | None = None
    #: The same constraint compiled for this backend's tokenizer (xgrammar ``CompiledGrammar``),
    #: when the caller has it; backends that compile server-side ignore it.
    compiled_grammar: Any | None = None
    #: A constraint given as an EBNF grammar instead of ``json_schema`` (a native tool format's structural tag,
    #: compiled to EBNF once, for servers whose guided decoding takes no structural tag).
    ebnf_grammar: str | None = None
    #: Decode special tokens into the text (a tool format whose markers are special tokens: ``[TOOL_CALLS]``).
    keep_special_tokens: bool = False
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0
    stop: tuple[str, ...] = ()
    #: HF-style repetition penalty over this request's last generated tokens (1.0: none); backends
    #: that do not implement it ignore it.
    repetition_penalty: float = 1.0
    #: Attempt number within the request (re-asks); backends make wire ids unique with it.
    attempt: int = 0


@dataclass(frozen=True, kw_only=True)
class GenerationChunk:
    """A piece of one request's output."""

    request_id: str
    text: str
    token_ids: tuple[int, ...] = ()
    finished: bool = False
    #: ``stop`` (EOS or grammar complete), ``length``, ``cancelled`` when finished.
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    #: On the last chunk: the sum of the generated tokens' log-probabilities under the model's own
    #: distribution (before any grammar mask), when the backend computes it; else None.
    logprob: float | None = None


@runtime_checkable
class InferenceBackend(Protocol):
    """A text-generation service that streams each request's output separately."""

    name: str

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream the output of ``request``; the last chunk has ``finished=True``.

        Cancelling the consuming task (or closing the iterator) frees the request's
        slot and grammar matcher in the backend.
        """
        ...

    async def aclose(self) -> None:
        """Release the backend's resources."""
        ...
