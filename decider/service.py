"""The decider: conversation + tool specs → schema-valid tool calls bound to their request.

:class:`BackendDecider` implements :class:`decider.protocol.Decider` over any
:class:`~decider.backend.InferenceBackend`. One decision is

1. **plan** (:meth:`BackendDecider.plan`, cheap and synchronous): check the request, ground the
   tools in the conversation (per-request narrowed schemas, tools without evidence dropped),
   build the tool-call schema, compile it (base grammars come from the cache, narrowed ones
   are compiled per request and timed), render the prompt and check it fits the context;
2. **generate** on the backend, streaming that request's text;
3. **parse** with a per-request parser, **normalize** aliases, and (for structured output and the
   API's re-ask loop) **validate** against the caller's schemas.

The executor calls :meth:`decide` from Celery worker threads; the backend is async, so the
decider runs it on its own event-loop thread and blocks on the result. Async callers (the
OpenAI-compatible API) use :meth:`adecide` / :meth:`astream`, which hop onto the same loop.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import structlog

from decider.backend import GenerationRequest, InferenceBackend
from decider.errors import (
    BackendUnavailableError,
    DeciderError,
    DeciderPermanentError,
    InvalidRequestError,
    OutputValidationError,
    PromptTooLongError,
    StreamInterruptedError,
)
from decider.grammar import CompiledConstraint, GrammarCache
from decider.grounding import GroundingResult, call_count, ground_tools
from decider.normalize import normalize_arguments
from decider.parser import ParsedOutput, ToolCallDelta, ToolCallStreamParser
from decider.prompt import PromptRenderer, reask_messages
from decider.protocol import DecideRequest, Decision
from decider.schema import DEFAULT_MAX_CALLS, Postcheck, PreparedSchema, canonical_json, prepare_schema, prepare_tool, tool_calls_schema
from tools.calls import ToolCall
from tools.spec import ToolSpec

__all__ = [
    "BackendDecider",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DeciderConfig",
    "DecisionPlan",
    "EmbeddedDecider",
    "StreamEvent",
    "TECHNIQUES",
    "call_errors",
    "get_default_decider",
]

logger = structlog.get_logger(__name__)

DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_TEXT_MAX_CHARS = 80

#: Named rungs of the decision-quality ladder (``python -m bench.quality --technique a,b``), as
#: :class:`DeciderConfig` overrides; each adds one mechanism to the one before it.
TECHNIQUES: dict[str, dict[str, Any]] = {
    "grammar": {"grounding": False, "count_calls": False, "dedupe_calls": False},
    "grounded": {"grounding": True, "ground_all": False, "count_calls": False, "dedupe_calls": False, "relevance": False},
    "grounded-all": {"grounding": True, "ground_all": True, "count_calls": False, "dedupe_calls": False, "relevance": False},
    "count-bounds": {"grounding": True, "ground_all": True, "count_calls": True, "exact_count": False, "dedupe_calls": True,
                     "relevance": False},
    "counted": {"grounding": True, "ground_all": True, "count_calls": True, "exact_count": True, "dedupe_calls": True,
                "relevance": False},
    "relevance": {"grounding": True, "ground_all": True, "count_calls": True, "exact_count": True, "dedupe_calls": True,
                  "relevance": True},
    "scored-count": {"grounding": True, "ground_all": True, "count_calls": True, "exact_count": True, "dedupe_calls": True,
                     "relevance": True, "score_count": True},
    "no-text": {"grounding": True, "allow_text": False},
}


@dataclass(frozen=True, kw_only=True)
class DeciderConfig:
    """How decisions are made (keyword-only; defaults are the embedded defaults)."""

    #: Upper bound on parallel calls in one decision when the request sets none.
    max_calls: int = DEFAULT_MAX_CALLS
    #: Narrow grounded fields (``x-grounded``, ``x-enum-aliases``) to the conversation.
    grounding: bool = True
    #: Treat every string/number field as grounded unless it says ``"x-grounded": false`` (typed
    #: candidates: shaped strings take matching spans, numbers take numbers, names take names).
    ground_all: bool = True
    #: Let tools compete for the request: a tool yields to one the request names (``x-cues``, the
    #: words only its name has) or says more of, and a quantity no field accepts makes no call.
    relevance: bool = True
    #: With ``tool_choice=auto``, also offer a text answer when some tool keeps its evidence. Off by
    #: default: a small model then declines calls it should make (SmolLM2 answered 北京明天天气 in
    #: text); grounding already leaves text as the only option when no tool has evidence.
    allow_text: bool = False
    #: Bound the number of calls from the evidence (one call per distinct evidence set, see
    #: :func:`decider.grounding.call_count`) instead of leaving the count to the model.
    count_calls: bool = True
    #: Make exactly the counted number of calls (the upper bound) rather than letting the model
    #: stop anywhere between the bounds (SmolLM2 stops after the first call when it may).
    exact_count: bool = True
    #: Choose the number of calls between the evidence bounds by log-likelihood: one decision per
    #: count, batched, the likeliest kept (needs a backend that reports ``logprob``; else the upper bound).
    score_count: bool = False
    #: Drop exact repeats of a call within one decision (a small model loops on one call).
    dedupe_calls: bool = True
    #: Longest text answer when the model may answer instead of calling (None: the schema's 400).
    text_max_chars: int | None = DEFAULT_TEXT_MAX_CHARS
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    system_prompt: str | None = None


@dataclass
class DecisionPlan:
    """Everything decided before decoding, for one request."""

    request_id: str
    attempt: int
    mode: str  # "tools" | "text" | "json"
    prompt: str
    prompt_tokens: int
    max_tokens: int
    grammar_json: str | None = None
    compiled: CompiledConstraint | None = None
    #: Tools offered in this request by name (the caller's specs, for validation and normalization).
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    postchecks: tuple[Postcheck, ...] = ()
    json_schema: PreparedSchema | None = None
    grounding_s: float = 0.0
    compile_s: float = 0.0
    narrowed: bool = False
    #: ``(lower, upper)`` bounds on the number of calls read from the evidence, when counted.
    call_count: tuple[int, int] | None = None
    #: Drop exact repeats of a call (the decider's ``dedupe_calls``).
    dedupe_calls: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0

    def usage(self) -> dict[str, int]:
        """Timing figures merged into a decision's usage (integers, microseconds)."""
        return {"grounding_us": int(self.grounding_s * 1e6), "grammar_compile_us": int(self.compile_s * 1e6)}


@dataclass(frozen=True)
class StreamEvent:
    """One event of a streamed decision: tool-call deltas, text, or the final decision."""

    deltas: tuple[ToolCallDelta, ...] = ()
    content: str | None = None
    decision: Decision | None = None
    finish_reason: str | None = None


def call_errors(call: ToolCall, spec: ToolSpec | None) -> list[str]:
    """Validation errors of one call against its tool's (caller's) schema."""
    from decider.schema import validation_errors

    if spec is None:
        return [f"unknown tool {call.name!r}"]
    if call.arguments is None:
        return [f"{call.name}: arguments are not a complete JSON object"]
    return [f"{call.name}{error}" for error in validation_errors(spec.parameters, call.arguments)]


def _without_repeats(calls: list[ToolCall]) -> list[ToolCall]:
    """The calls with exact repeats (same name, same arguments) dropped, first one kept."""
    seen: set[str] = set()
    kept = []
    for call in calls:
        key = call.name + "\x00" + json.dumps(call.arguments, sort_keys=True, ensure_ascii=False, default=str)
        if key not in seen:
            seen.add(key)
            kept.append(call)
    return kept


class _LoopThread:
    """A private event loop on a daemon thread: the sync facade's way to drive async backends."""

    def __init__(self, name: str) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._name = name
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop = loop
            return self._loop

    def submit(self, coro: Any) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        with self._lock:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


class BackendDecider:
    """A :class:`~decider.protocol.Decider` over any inference backend.

    ``grammar_cache`` is given for backends that take a compiled grammar (the embedded
    engine); backends that compile server-side (Triton) get the grammar schema as JSON only.
    ``context_length`` bounds prompt + output; ``None`` leaves the check to the backend.
    """

    def __init__(self, backend: InferenceBackend, *, tokenizer: Any, grammar_cache: GrammarCache | None = None,
                 context_length: int | None = None, config: DeciderConfig | None = None) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.grammar_cache = grammar_cache
        self.context_length = context_length
        self.config = config or DeciderConfig()
        kwargs = {"system_prompt": self.config.system_prompt} if self.config.system_prompt else {}
        self.renderer = PromptRenderer(tokenizer, **kwargs)
        self._loop = _LoopThread(f"toolrail-decider-{getattr(backend, 'name', 'backend')}")
        self._prepared: dict[str, PreparedSchema] = {}
        self._prepared_lock = threading.Lock()

    @property
    def name(self) -> str:
        return getattr(self.backend, "name", type(self.backend).__name__)

    # ------------------------------------------------------------------ planning

    def _prepare_cached(self, spec: ToolSpec, parameters: Mapping[str, Any] | None = None) -> PreparedSchema:
        """Prepare a tool's (possibly narrowed) parameter schema; base schemas are cached by hash."""
        if parameters is None or parameters is spec.parameters:
            key = f"{spec.name}:{spec.schema_hash}"
            with self._prepared_lock:
                hit = self._prepared.get(key)
            if hit is None:
                hit = prepare_tool(spec)
                with self._prepared_lock:
                    self._prepared[key] = hit
            return hit
        return prepare_schema(parameters)

    def _count_tokens(self, text: str) -> int:
        encode = getattr(self.backend, "encode", None)
        if callable(encode):
            return len(encode(text))
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _finish_plan(self, plan: DecisionPlan, schema: dict[str, Any] | None) -> DecisionPlan:
        if schema is not None:
            plan.grammar_json = canonical_json(schema)
            if self.grammar_cache is not None:
                plan.compiled = self.grammar_cache.compile(plan.grammar_json)
                plan.compile_s = plan.compiled.compile_s
        plan.prompt_tokens = self._count_tokens(plan.prompt)
        if self.context_length is not None:
            if plan.prompt_tokens >= self.context_length:
                raise PromptTooLongError(plan.prompt_tokens, self.context_length)
            plan.max_tokens = min(plan.max_tokens, self.context_length - plan.prompt_tokens)
        return plan

    def plan(self, request: DecideRequest, *, min_calls: int | None = None, calls: int | None = None) -> DecisionPlan:
        """Check, ground, build the schema, compile and render one tool-call decision.

        ``calls`` fixes the number of calls within the bounds the evidence gives (a candidate of
        ``score_count``); ``min_calls`` is a caller's own lower bound and turns counting off.
        """
        tools = list(request.tools)
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise InvalidRequestError(f"duplicate tool names in {names}")
        choice = request.tool_choice
        forced: str | None = None
        if isinstance(choice, Mapping):
            forced = (choice.get("function") or {}).get("name") or choice.get("name")
            if not forced:
                raise InvalidRequestError("tool_choice object needs function.name")
            if forced not in names:
                raise InvalidRequestError(f"tool_choice names {forced!r}, which is not among the tools {names}")
            tools = [t for t in tools if t.name == forced]
            choice = "required"
        elif choice not in ("auto", "required", "none"):
            raise InvalidRequestError(f"tool_choice must be auto, required, none or a named function, got {choice!r}")
        if choice == "required" and not tools:
            raise InvalidRequestError("tool_choice='required' needs at least one tool")
        base = DecisionPlan(request_id=request.request_id, attempt=request.attempt, mode="tools", prompt="",
                            prompt_tokens=0, max_tokens=request.max_tokens, seed=request.seed)
        if choice == "none" or not tools:
            base.mode = "text"
            base.prompt = self.renderer.render_plain(request.messages).text
            return self._finish_plan(base, None)

        prepared = {t.name: self._prepare_cached(t) for t in tools}  # refuse unsupported features up front
        started = time.perf_counter()
        grounding: GroundingResult | None = None
        parameters: dict[str, Mapping[str, Any]] = {t.name: t.parameters for t in tools}
        if self.config.grounding:
            grounding = ground_tools(tools, request.messages, ground_all=self.config.ground_all,
                                     relevance=self.config.relevance,
                                     allow_drop=choice == "auto")
            parameters = grounding.parameters
            base.dropped = dict(grounding.dropped)
            base.narrowed = grounding.narrowed
        offered = [t for t in tools if t.name in parameters]
        spec_by_name = {t.name: t for t in offered}
        grammar_params = []
        postchecks: list[Postcheck] = []
        for spec in offered:
            narrowed = parameters[spec.name]
            prep = prepared[spec.name] if narrowed is spec.parameters else self._prepare_cached(spec, narrowed)
            grammar_params.append((spec.name, prep.grammar_schema))
            postchecks += prepared[spec.name].postchecks
        base.grounding_s = time.perf_counter() - started
        max_calls = request.max_calls or self.config.max_calls
        if not request.parallel_tool_calls:
            max_calls = 1
        lower = max(1, min(min_calls or 1, max_calls))
        # A caller's explicit max_calls is its own decision on the count; left open, the evidence decides.
        counted = grounding is not None and offered and min_calls is None and request.max_calls is None
        positions = None
        if self.config.count_calls and counted:
            count = call_count(offered, parameters, request.messages, max_calls=max_calls)
            max_calls = min(max_calls, count.upper)
            lower = max(lower, count.upper if self.config.exact_count else count.lower)
            if calls is not None:
                lower = max_calls = max(count.lower, min(calls, count.upper))
            base.call_count = (count.lower, count.upper)
            positions = [[(name, self._prepare_cached(spec_by_name[name], schema).grammar_schema)
                          for name, schema in branches] for branches in count.positions(parameters)] or None
        allow_text = choice == "auto" and (self.config.allow_text or not offered)
        schema = tool_calls_schema(grammar_params, min_calls=lower, max_calls=max_calls, allow_text=allow_text,
                                   text_max_chars=self.config.text_max_chars, positions=positions)
        base.tools = {t.name: t for t in tools}
        base.dedupe_calls = self.config.dedupe_calls and request.max_calls is None
        base.postchecks = tuple(postchecks)
        base.prompt = self.renderer.render_tools(request.messages, offered, parameters=dict(parameters),
                                                 allow_text=allow_text, max_calls=max_calls).text
        if grounding is not None and grounding.dropped:
            logger.debug("decider.grounding", request_id=request.request_id, dropped=sorted(grounding.dropped))
        return self._finish_plan(base, schema)

    def plan_json(self, request_id: str, messages: Sequence[Mapping[str, Any]], schema: Mapping[str, Any], *,
                  max_tokens: int = 256, attempt: int = 0, seed: int | None = 0, temperature: float = 0.0,
                  top_p: float = 1.0) -> DecisionPlan:
        """Plan structured output constrained by any supported JSON Schema."""
        prepared = prepare_schema(schema)
        plan = DecisionPlan(request_id=request_id, attempt=attempt, mode="json",
                            prompt=self.renderer.render_json(messages, prepared.schema).text, prompt_tokens=0,
                            max_tokens=max_tokens, json_schema=prepared, postchecks=prepared.postchecks,
                            seed=seed, temperature=temperature, top_p=top_p)
        return self._finish_plan(plan, prepared.grammar_schema)

    # ------------------------------------------------------------------ decoding

    def _generation(self, plan: DecisionPlan) -> GenerationRequest:
        return GenerationRequest(
            request_id=plan.request_id, prompt=plan.prompt, json_schema=plan.grammar_json,
            compiled_grammar=plan.compiled.grammar if plan.compiled is not None else None,
            max_tokens=plan.max_tokens, temperature=plan.temperature, top_p=plan.top_p, seed=plan.seed,
            attempt=plan.attempt,
        )

    async def _events(self, plan: DecisionPlan) -> AsyncIterator[StreamEvent]:
        """Generate on the backend and turn the text into events (runs on the decider's loop)."""
        parser = ToolCallStreamParser(plan.request_id, attempt=plan.attempt)
        finish_reason, usage, logprob = None, {}, None
        try:
            async for chunk in self.backend.generate(self._generation(plan)):
                if chunk.request_id != plan.request_id:
                    raise StreamInterruptedError(f"backend returned output of {chunk.request_id!r} for {plan.request_id!r}")
                if chunk.text:
                    deltas = parser.feed(chunk.text)
                    if plan.mode == "tools" and deltas:
                        yield StreamEvent(deltas=tuple(deltas))
                    elif plan.mode != "tools":
                        yield StreamEvent(content=chunk.text)
                if chunk.finished:
                    finish_reason, usage, logprob = chunk.finish_reason, dict(chunk.usage), chunk.logprob
                    break
        except DeciderError:
            raise
        except (ConnectionError, OSError) as exc:
            raise BackendUnavailableError(f"backend {self.name}: {exc}") from exc
        if finish_reason is None:
            raise StreamInterruptedError(f"the backend's stream for {plan.request_id} ended without a final chunk")
        decision = self._decision(plan, parser, finish_reason, usage)
        if logprob is not None:
            decision = decision.model_copy(update={"logprob": logprob})
        yield StreamEvent(decision=decision, finish_reason=finish_reason)

    def _decision(self, plan: DecisionPlan, parser: ToolCallStreamParser, finish_reason: str,
                  usage: dict[str, int]) -> Decision:
        text = parser.text
        usage = {**usage, **plan.usage()}
        usage.setdefault("prompt_tokens", plan.prompt_tokens)
        if plan.mode == "text":
            return Decision(request_id=plan.request_id, raw_output=text, content=text, backend=self.name, usage=usage)
        if plan.mode == "json":
            return Decision(request_id=plan.request_id, raw_output=text, content=text, backend=self.name, usage=usage)
        parsed: ParsedOutput = parser.finish()
        calls = []
        for call in parsed.tool_calls:
            spec = plan.tools.get(call.name)
            if spec is not None and call.arguments is not None:
                call = call.model_copy(update={"arguments": normalize_arguments(call.arguments, spec.parameters)})
            calls.append(call)
        if plan.dedupe_calls:
            calls = _without_repeats(calls)
        content = parsed.content if not calls else None
        if parsed.problem and finish_reason == "length":
            logger.warning("decider.truncated", request_id=plan.request_id, problem=parsed.problem)
        return Decision(request_id=plan.request_id, raw_output=text, tool_calls=calls, content=content,
                        backend=self.name, usage=usage)

    async def _run(self, plan: DecisionPlan) -> Decision:
        async for event in self._events(plan):
            if event.decision is not None:
                return event.decision
        raise StreamInterruptedError(f"no decision for {plan.request_id}")  # pragma: no cover

    # ------------------------------------------------------------------ public API

    def _candidates(self, request: DecideRequest, plan: DecisionPlan) -> list[DecisionPlan]:
        """The plans to score: one per call count between the evidence bounds (``score_count``)."""
        if not self.config.score_count or plan.call_count is None or plan.call_count[0] >= plan.call_count[1]:
            return [plan]
        lower, upper = plan.call_count
        # each candidate is its own backend request: "<id>~<k>" (call ids are given back the request's own)
        others = [self.plan(request.model_copy(update={"request_id": f"{request.request_id}~{k}"}), calls=k)
                  for k in range(lower, upper)]
        return [plan, *others]

    async def _run_scored(self, plans: list[DecisionPlan]) -> Decision:
        """Run candidate plans side by side (one batch on the backend) and keep the likeliest."""
        if len(plans) == 1:
            return await self._run(plans[0])
        decisions = await asyncio.gather(*(self._run(plan) for plan in plans))
        scored = [d for d in decisions if d.logprob is not None]
        best = max(scored, key=lambda d: d.logprob) if len(scored) == len(decisions) else decisions[0]
        usage = {**best.usage, "count_candidates": len(plans),
                 "completion_tokens": sum(d.usage.get("completion_tokens", 0) for d in decisions)}
        logger.debug("decider.scored_count", request_id=plans[0].request_id,
                     logprobs=[None if d.logprob is None else round(d.logprob, 2) for d in decisions])
        return best.model_copy(update={"request_id": plans[0].request_id, "usage": usage, "tool_calls": [
            call.model_copy(update={"id": call.id.replace(best.request_id, plans[0].request_id)}) for call in best.tool_calls]})

    def decide(self, request: DecideRequest) -> Decision:
        """Decide one request (blocking; safe from any thread, never from the decider's own loop)."""
        plan = self.plan(request)
        future = self._loop.submit(self._run_scored(self._candidates(request, plan)))
        try:
            return future.result(timeout=self.config.request_timeout_s)
        except TimeoutError:
            future.cancel()
            raise StreamInterruptedError(f"no decision for {request.request_id} within {self.config.request_timeout_s}s") from None

    async def adecide(self, request: DecideRequest, *, min_calls: int | None = None) -> Decision:
        """Decide from async code (any event loop)."""
        plan = await asyncio.to_thread(self.plan, request, min_calls=min_calls)
        plans = await asyncio.to_thread(self._candidates, request, plan)
        return await asyncio.wrap_future(self._loop.submit(self._run_scored(plans)))

    async def arun(self, plan: DecisionPlan) -> Decision:
        """Run a plan to its decision from any event loop."""
        return await asyncio.wrap_future(self._loop.submit(self._run(plan)))

    async def astream(self, plan: DecisionPlan) -> AsyncIterator[StreamEvent]:
        """Stream a plan's events into the caller's loop; closing the iterator cancels the request."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for event in self._events(plan):
                    loop.call_soon_threadsafe(queue.put_nowait, event)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            else:
                loop.call_soon_threadsafe(queue.put_nowait, done)

        future = self._loop.submit(pump())
        try:
            while True:
                item = await queue.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            future.cancel()

    def validate(self, plan: DecisionPlan, decision: Decision) -> list[str]:
        """Errors of a decision against the caller's schemas (empty when valid)."""
        if plan.mode == "json":
            try:
                value = json.loads(decision.raw_output)
            except ValueError as exc:
                return [f"/: output is not complete JSON ({exc})"]
            return plan.json_schema.errors(value) if plan.json_schema else []
        if plan.mode == "text":
            return []
        errors = []
        for call in decision.tool_calls:
            errors += call_errors(call, plan.tools.get(call.name))
        parsed_problem = None if decision.tool_calls or decision.content is not None else "no tool call was produced"
        return errors + ([parsed_problem] if parsed_problem else [])

    async def adecide_validated(self, request: DecideRequest, *, max_reasks: int = 2,
                                min_calls: int | None = None) -> Decision:
        """Decide, validate, and re-ask with the errors (bounded); raise OutputValidationError at the end."""
        messages = list(request.messages)
        decision: Decision | None = None
        errors: list[str] = []
        for attempt in range(request.attempt, request.attempt + max_reasks + 1):
            current = request.model_copy(update={"messages": messages, "attempt": attempt})
            plan = await asyncio.to_thread(self.plan, current, min_calls=min_calls)
            decision = await self.arun(plan)
            errors = self.validate(plan, decision)
            if not errors:
                return decision
            messages = reask_messages(messages, output=decision.raw_output, errors=errors)
        raise OutputValidationError(errors, attempts=max_reasks + 1, last_output=decision.raw_output if decision else "")

    async def agenerate_json(self, schema: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], *,
                             request_id: str, max_tokens: int = 256, max_reasks: int = 2, seed: int | None = 0,
                             temperature: float = 0.0, top_p: float = 1.0) -> tuple[Any, Decision]:
        """Structured output: JSON valid against ``schema`` (post-decoding checks re-asked, bounded)."""
        current = list(messages)
        errors: list[str] = []
        decision: Decision | None = None
        for attempt in range(max_reasks + 1):
            plan = await asyncio.to_thread(self.plan_json, request_id, current, schema, max_tokens=max_tokens,
                                           attempt=attempt, seed=seed, temperature=temperature, top_p=top_p)
            decision = await self.arun(plan)
            errors = self.validate(plan, decision)
            if not errors:
                return json.loads(decision.raw_output), decision
            current = reask_messages(current, output=decision.raw_output, errors=errors)
        raise OutputValidationError(errors, attempts=max_reasks + 1, last_output=decision.raw_output if decision else "")

    def generate_json(self, schema: Mapping[str, Any], prompt: str | Sequence[Mapping[str, Any]], *,
                      request_id: str, **options: Any) -> tuple[Any, Decision]:
        """Blocking :meth:`agenerate_json`; ``prompt`` is a user message or a message list."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        future = self._loop.submit(self.agenerate_json(schema, messages, request_id=request_id, **options))
        return future.result(timeout=self.config.request_timeout_s)

    def close(self) -> None:
        """Stop the decider's loop thread and close the backend."""
        loop = self._loop.loop
        try:
            asyncio.run_coroutine_threadsafe(self.backend.aclose(), loop).result(timeout=30)
        except Exception:  # noqa: BLE001 - closing is best effort
            logger.warning("decider.close_failed", backend=self.name)
        self._loop.close()


class EmbeddedDecider(BackendDecider):
    """The default decider: the embedded engine in this process."""

    @classmethod
    def load(cls, model_path: str | None = None, *, config: DeciderConfig | None = None, **engine_options: Any) -> "EmbeddedDecider":
        """Load the embedded engine (default model unless ``model_path``) and wrap it."""
        from decider.embedded import EmbeddedEngine

        engine = EmbeddedEngine.load(model_path, **engine_options)
        return cls.from_engine(engine, config=config)

    @classmethod
    def from_engine(cls, engine: Any, *, config: DeciderConfig | None = None) -> "EmbeddedDecider":
        """Wrap an already loaded engine, sharing its compiler and tokenizer info."""
        cache = GrammarCache(engine.compiler, engine.tokenizer_info)
        return cls(engine, tokenizer=engine.tokenizer, grammar_cache=cache,
                   context_length=getattr(engine, "context_length", None), config=config)


_DEFAULT_LOCK = threading.Lock()
_DEFAULT: dict[tuple[str, str | None], BackendDecider] = {}


def get_default_decider(settings: Any) -> BackendDecider:
    """The process-wide decider for ``settings.decider`` (``embedded`` or ``triton``), built once."""
    kind = getattr(settings, "decider", "embedded")
    model = getattr(settings, "model", None)
    key = (kind, model)
    with _DEFAULT_LOCK:
        if key in _DEFAULT:
            return _DEFAULT[key]
        if kind == "embedded":
            decider: BackendDecider = EmbeddedDecider.load(model)
        elif kind == "triton":
            decider = _triton_decider(settings)
        else:
            raise DeciderPermanentError(f"no decider configured (TOOLRAIL_DECIDER={kind!r})")
        _DEFAULT[key] = decider
        return decider


def _triton_decider(settings: Any) -> BackendDecider:
    """A decider over the Triton backend; the prompt is rendered here with the model's tokenizer."""
    from transformers import AutoTokenizer

    from decider import triton as triton_module  # type: ignore[attr-defined]
    from decider.model import resolve_model_path

    backend_cls = getattr(triton_module, "TritonBackend")
    factory = getattr(backend_cls, "from_settings", None)
    backend = factory(settings) if callable(factory) else backend_cls(url=settings.triton_url, model_name=settings.triton_model)
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(settings.model)), local_files_only=True)
    return BackendDecider(backend, tokenizer=tokenizer, context_length=getattr(backend, "context_length", None))
