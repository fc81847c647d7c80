"""Planning a decision: everything decided before decoding, cheap and synchronous.

:class:`Planner` checks a request, grounds the tools in the conversation (per-request narrowed
schemas), builds the tool-call schema, compiles it (base grammars come from the cache, narrowed ones
are compiled per request and timed), renders the prompt and checks it fits the context; the result is a
:class:`DecisionPlan`. :class:`~decider.service.BackendDecider` is a planner that also decodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from decider.candidates import narrow_tools
from decider.errors import InvalidRequestError, PromptTooLongError
from decider.grammar import CompiledConstraint, GrammarCache
from decider.prompt import PromptRenderer
from decider.protocol import DecideRequest
from decider.schema import (
    DEFAULT_MAX_CALLS,
    Postcheck,
    PreparedSchema,
    bound_free_text,
    canonical_json,
    prepare_schema,
    prepare_tool,
    schema_hash,
    tool_calls_schema,
)
from decider.tool_formats import ToolFormat, resolve_tool_format
from tools.spec import ToolSpec

__all__ = [
    "DEFAULT_CALL_BIAS",
    "DEFAULT_CALL_BIAS_WITHOUT_EVIDENCE",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DeciderConfig",
    "DecisionPlan",
    "Planner",
]

DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_TEXT_MAX_CHARS = 200
#: Calls-side offsets of the calibrated call-or-answer choice: one when the conversation holds typed values
#: for an offered tool's fields (the typed candidates narrowed at least one field: a city of an enum, a number
#: the schema takes), one when it holds none. Decided on BFCL tuning rows (seed 1: 25 rows each of simple,
#: multiple, live_simple, irrelevance, live_irrelevance; ``python -m bench.calibrate --bfcl-seed 1``) by the
#: score they give, not by how many rows they classify: a call on a row that needs one is right only as often
#: as the call itself is (6-8 of 25), an answer on a row that needs none is right. One offset for all rows
#: peaked at 0 or -2 (45.6 %, 46.4 %) and answered the platform's own demo requests (the weather of Beijing
#: tomorrow, with get_weather offered) in text; 6.74 with evidence and -1 without scored 46.4 % and calls
#: there; the best pair tried (2, -2: 48.0 %) answers the demo in text. The former single 6.74 (fitted for
#: classification on 80 dev rows) called on nearly every first turn: 26.4 % on the same rows.
DEFAULT_CALL_BIAS = 6.74
DEFAULT_CALL_BIAS_WITHOUT_EVIDENCE = -1.0
DEFAULT_STRING_MAX_CHARS = 200
DEFAULT_ARRAY_MAX_ITEMS = 8


@dataclass(frozen=True, kw_only=True)
class DeciderConfig:
    """How decisions are made (keyword-only; defaults are the embedded defaults).

    The model decides whether to call, which tools and how many; nothing here decides for it.
    """

    #: Upper bound on parallel calls in one decision when the request sets none.
    max_calls: int = DEFAULT_MAX_CALLS
    #: Typed candidates: narrow declared-shape fields (pattern, format, enum, numbers) to the values
    #: the conversation holds (:mod:`decider.candidates`); fields without candidates stay open.
    candidates: bool = True
    #: Platform bound on free strings / arrays the schema leaves unbounded (grammar only).
    string_max_chars: int | None = DEFAULT_STRING_MAX_CHARS
    array_max_items: int | None = DEFAULT_ARRAY_MAX_ITEMS
    #: Longest text answer under ``tool_choice=auto`` (None: the schema's 400).
    text_max_chars: int | None = DEFAULT_TEXT_MAX_CHARS
    #: The model's own call-or-answer choice under ``tool_choice=auto``, calibrated: on backends that
    #: score continuations, each branch's opening (``[{"name": "<tool>", "arguments": {"`` per tool,
    #: ``{"content": "``) is scored after the prompt and after the same prompt with a content-free
    #: user turn; the branch whose log-probability the request raises most wins, with this offset
    #: added to the calls side (contextual calibration; the offset is fitted on the dev split, see
    #: :data:`DEFAULT_CALL_BIAS`). None: the grammar's first token decides (strong models).
    call_bias: float | None = None
    #: The offset when no offered tool's typed field found a value in the conversation (None: ``call_bias``);
    #: needs ``candidates`` (the narrowing is the evidence).
    call_bias_without_evidence: float | None = None
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    system_prompt: str | None = None
    #: How tools are shown to a model whose chat template has no tools (``decider.prompt.TOOL_FORMATS``).
    tool_format: str = "compact"
    #: The tool-call syntax (``decider.tool_formats.TOOL_FORMATS``: ``hermes``, ``llama3_json``, ``mistral``,
    #: ``json_array``); None: the model manifest's ``tool_call_format``, else detected from the chat template.
    call_format: str | None = None
    #: Repetition penalty of tool-call decoding (1.0: none): a standard decoding setting, passed to
    #: backends that implement it; small models otherwise loop inside free strings.
    repetition_penalty: float = 1.0
    #: Cut a decision whose output ends in a repeated unit (``GenerationBoundError("loop")``).
    loop_guard: bool = True
    #: Read the number of calls as the model's own preference, on backends that score continuations: after
    #: each complete call but the last, ``log P("]")`` against ``log P(", {")`` (no grammar mask);
    #: the calls end at the first boundary where closing wins (recorded as ``call_count_read``). Greedy
    #: decoding compares first tokens only, and a model that writes ``,`` to go on inside the arguments is
    #: made by the grammar to open a new call. Not applied when the caller bounds the count itself.
    read_call_count: bool = False
    #: How much more likely closing must be than another call for the read to end the calls there (log units,
    #: fitted on tuning rows by ``bench.bfcl``'s call-count report; a large value reads every boundary, cuts none).
    call_count_margin: float = 0.0


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
    #: A native format's constraint: the structural tag (JSON text) and, for servers that take no tag, its EBNF.
    structural_tag: str | None = None
    ebnf: str | None = None
    #: Most calls a native format's decision keeps (its syntax cannot bound the count; the rest are cut).
    max_calls: int | None = None
    #: Tools offered in this request by name (the caller's specs, for validation and normalization).
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    postchecks: tuple[Postcheck, ...] = ()
    json_schema: PreparedSchema | None = None
    candidates_s: float = 0.0
    compile_s: float = 0.0
    #: What the platform did to this decision, shown on the attempt: the constraint's hash, fields
    #: narrowed and to what, bounds added, whether text was allowed, the call-count range.
    platform: dict[str, Any] = field(default_factory=dict)
    #: With ``call_bias``: the two branches the model chooses between, ``{"calls"|"text": (grammar json, compiled)}``.
    branches: dict[str, tuple[str, CompiledConstraint | None]] = field(default_factory=dict)
    #: The prompt with a content-free user turn, scored once per tool set as the choice's baseline.
    choice_baseline: str = ""
    #: Cut the calls at the first exact repeat (when the caller set no call-count bounds of its own).
    cut_repeats: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0

    def usage(self) -> dict[str, int]:
        """Timing figures merged into a decision's usage (integers, microseconds)."""
        return {"candidates_us": int(self.candidates_s * 1e6), "grammar_compile_us": int(self.compile_s * 1e6)}


class Planner:
    """Plans decisions for one model: its tokenizer, prompt rendering, tool-call syntax and grammar cache.

    ``grammar_cache`` is given for backends that take a compiled grammar (the embedded
    engine); backends that compile server-side (Triton) get the grammar schema as JSON only.
    ``context_length`` bounds prompt + output; ``None`` leaves the check to the backend.
    """

    def __init__(self, backend: Any, *, tokenizer: Any, grammar_cache: GrammarCache | None = None,
                 context_length: int | None = None, config: DeciderConfig | None = None) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.grammar_cache = grammar_cache
        self.context_length = context_length
        self.config = config or DeciderConfig()
        kwargs = {"system_prompt": self.config.system_prompt} if self.config.system_prompt else {}
        #: The model's tool-call syntax (its own family's, or the platform's JSON array).
        self.call_format: ToolFormat = resolve_tool_format(tokenizer, override=self.config.call_format)
        self.renderer = PromptRenderer(tokenizer, tool_format=self.config.tool_format, call_format=self.call_format, **kwargs)
        self._ebnf: dict[str, str] = {}
        self._prepared: dict[str, tuple[PreparedSchema, dict[str, Any], list[str]]] = {}
        self._prepared_lock = threading.Lock()

    def _bounded(self, grammar: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        return bound_free_text(grammar, string_max=self.config.string_max_chars, array_max=self.config.array_max_items)

    def _tool_grammar(self, spec: ToolSpec, parameters: Mapping[str, Any] | None = None) -> tuple[PreparedSchema, dict[str, Any], list[str]]:
        """A tool's prepared schema and bounded grammar; the base (un-narrowed) one is cached by hash."""
        if parameters is None or parameters is spec.parameters:
            key = f"{spec.name}:{spec.schema_hash}"
            with self._prepared_lock:
                hit = self._prepared.get(key)
            if hit is None:
                prepared = prepare_tool(spec)
                hit = (prepared, *self._bounded(prepared.grammar_schema))
                with self._prepared_lock:
                    self._prepared[key] = hit
            return hit
        prepared = prepare_schema(parameters)
        return (prepared, *self._bounded(prepared.grammar_schema))

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

    def plan(self, request: DecideRequest, *, min_calls: int | None = None) -> DecisionPlan:
        """Check the request, narrow typed fields to their candidates, build and compile the constraint.

        The constraint is the request's own tool-call schema: under ``tool_choice=auto`` a text
        answer or 1..``max_calls`` calls of any offered tool, as the model chooses. ``min_calls``
        is a caller's own lower bound (the OpenAI endpoint's ``min_tool_calls``).
        """
        tools = list(request.tools)
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise InvalidRequestError(f"duplicate tool names in {names}")
        choice = request.tool_choice
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
                            prompt_tokens=0, max_tokens=request.max_tokens, seed=request.seed,
                            temperature=request.temperature, top_p=request.top_p)
        min_calls = min_calls if min_calls is not None else request.min_calls
        if choice == "none" or not tools:
            base.mode = "text"
            base.prompt = self.renderer.render_plain(request.messages).text
            return self._finish_plan(base, None)

        grammars = {t.name: self._tool_grammar(t) for t in tools}  # refuses unsupported features up front
        started = time.perf_counter()
        parameters: dict[str, Mapping[str, Any]] = {t.name: t.parameters for t in tools}
        narrowed: dict[str, dict[str, list[Any]]] = {}
        if self.config.candidates:
            narrowing = narrow_tools(tools, request.messages)
            parameters, narrowed = narrowing.parameters, narrowing.narrowed
        grammar_params, postchecks, bounds = [], [], {}
        for spec in tools:
            prepared, grammar, bounded = grammars[spec.name]
            if parameters[spec.name] is not spec.parameters:
                _, grammar, bounded = self._tool_grammar(spec, parameters[spec.name])
            grammar_params.append((spec.name, grammar))
            postchecks += prepared.postchecks
            if bounded:
                bounds[spec.name] = bounded
        base.candidates_s = time.perf_counter() - started
        max_calls = request.max_calls or self.config.max_calls
        if not request.parallel_tool_calls:
            max_calls = 1
        lower = max(1, min(min_calls or 1, max_calls))
        allow_text = choice == "auto"
        schema = tool_calls_schema(grammar_params, min_calls=lower, max_calls=max_calls, allow_text=allow_text,
                                   text_max_chars=self.config.text_max_chars)
        # The scored choice applies on a user turn (a re-ask's feedback is one): its offset was fitted
        # on dev rows, which end with a user message; after a tool result the grammar's first token
        # decides, as for any model.
        last_role = request.messages[-1].get("role") if request.messages else None
        if allow_text and last_role == "user" and self.config.call_bias is not None and not self.call_format.native \
                and callable(getattr(self.backend, "score_continuations", None)):
            # the same rendering with a content-free user turn: the calibration baseline
            base.choice_baseline = self.renderer.render_tools([{"role": "user", "content": ""}], tools,
                                                              parameters=dict(parameters), allow_text=True,
                                                              max_calls=max_calls).text
            calls_only = tool_calls_schema(grammar_params, min_calls=lower, max_calls=max_calls)
            text_only = tool_calls_schema([], allow_text=True, text_max_chars=self.config.text_max_chars)
            for branch, branch_schema in (("calls", calls_only), ("text", text_only)):
                text = canonical_json(branch_schema)
                compiled = self.grammar_cache.compile(text) if self.grammar_cache is not None else None
                base.branches[branch] = (text, compiled)
        base.tools = {t.name: t for t in tools}
        base.cut_repeats = request.max_calls is None and min_calls is None
        base.postchecks = tuple(postchecks)
        base.prompt = self.renderer.render_tools(request.messages, tools, parameters=dict(parameters),
                                                 allow_text=allow_text, max_calls=max_calls).text
        base.platform = {"constraint": schema_hash(schema), "tools_offered": names if choice != "required" or
                         len(tools) == len(names) else [t.name for t in tools],
                         "tools_dropped": [], "text_allowed": allow_text, "calls": [0 if allow_text else lower, max_calls],
                         "narrowed": narrowed, "bounds": bounds}
        if self.call_format.native:
            return self._native_constraint(base, grammar_params, schema, allow_text=allow_text, max_calls=max_calls)
        return self._finish_plan(base, schema)

    def _native_constraint(self, plan: DecisionPlan, grammar_params: list[tuple[str, Any]], calls_schema: dict[str, Any],
                           *, allow_text: bool, max_calls: int) -> DecisionPlan:
        """Constrain a native format: its structural tag (compiled here for the embedded engine), or for servers whose
        guided decoding takes no structural tag the same constraint as portable EBNF, built once per tag."""
        calls_only = tool_calls_schema(grammar_params, max_calls=max_calls)
        tag = self.call_format.structural_tag(grammar_params, allow_text=allow_text, max_calls=max_calls,
                                              calls_schema=calls_only)
        plan.structural_tag, plan.max_calls = canonical_json(tag), max_calls
        plan.platform = {**plan.platform, "tool_format": self.call_format.name, "constraint": schema_hash(tag)}
        if self.grammar_cache is not None:
            plan.compiled = self.grammar_cache.compile_structural_tag(plan.structural_tag)
            plan.compile_s = plan.compiled.compile_s
        else:
            with self._prepared_lock:
                plan.ebnf = self._ebnf.get(plan.structural_tag)
            if plan.ebnf is None:
                plan.ebnf = self.call_format.ebnf(grammar_params, allow_text=allow_text, max_calls=max_calls,
                                                  calls_schema=calls_only)
                with self._prepared_lock:
                    self._ebnf[plan.structural_tag] = plan.ebnf
        return self._finish_plan(plan, None)

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
