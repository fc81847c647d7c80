"""Grounded arguments: narrow each request's grammar to values the conversation gives evidence for.

A small model chooses far better among candidates than it invents values. For fields that opt
in (``"x-grounded": true`` on the field, on the tool's parameter schema, or ``ground_all`` for
the whole decider; ``"x-grounded": false`` opts a field out):

- a string field may only take a span of the conversation (word n-grams; for Chinese, substrings
  of CJK runs that do not start or end on a particle), a quoted string, or its alias vocabulary;
  candidates are filtered by the field's own constraints (pattern, length, format);
- a number field may only take a number written in the conversation (digits, ``1,000``,
  Chinese numerals such as 三百五十 or 1.5万), within the field's bounds;
- an enum field (grounded, or declaring ``x-enum-aliases`` cues) may only take values whose
  value, alias or cue word appears in the conversation;
- a field with no evidence is removed when optional, forced to its declared ``default`` when it
  has one, and otherwise drops its tool from the request's grammar (the model may then answer in
  text, or call another tool).

The narrowing is expressed as a narrowed JSON Schema (``enum`` lists), so the Triton backend
enforces exactly the same constraint as the embedded engine. Evidence comes from user and tool
messages only: the system prompt lists every enum value and would count as evidence for all.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from decider.schema import validation_errors
from tools.spec import ToolSpec

__all__ = [
    "DEFAULT_EVIDENCE_ROLES",
    "Evidence",
    "GroundingResult",
    "collect_evidence",
    "ground_tools",
    "is_grounded_tool",
    "message_text",
    "narrow_schema",
    "parse_chinese_number",
    "tool_vocabulary",
]

DEFAULT_EVIDENCE_ROLES = ("user", "tool")
#: Longest candidate span: words for Latin text, characters for CJK runs.
MAX_SPAN_WORDS = 4
MAX_CJK_SPAN = 8
MAX_CANDIDATES = 200

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|[A-Za-z0-9\u00c0-\u024f][A-Za-z0-9\u00c0-\u024f_.@+\-'/]*")
_QUOTED = re.compile(r"\"([^\"\n]{1,80})\"|'([^'\n]{1,80})'|“([^”\n]{1,80})”|‘([^’\n]{1,80})’|「([^」\n]{1,80})」|《([^》\n]{1,80})》")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])(-?\d+(?:,\d{3})*(?:\.\d+)?)(?![0-9])\s*([万千百亿kK])?")
_CN_NUMBER = re.compile("[零〇一二两三四五六七八九十百千万亿点]+")
#: Chinese function words: a candidate span never crosses one (longest first when splitting).
CJK_FUNCTION_WORDS = (
    "怎么样", "查一下", "的话", "一下", "帮我", "给我", "请问", "查询", "可以", "怎么", "什么", "多少", "哪里", "然后",
    "还有", "同时", "以及", "并且", "或者", "看看", "的", "了", "吗", "呢", "吧", "啊", "呀", "嘛", "在", "给", "把",
    "和", "与", "及", "跟", "从", "向", "到", "是", "我", "你", "他", "她", "它", "们", "请", "帮", "查", "问", "看",
    "要", "想", "能", "会", "转", "发", "几", "哪", "这", "那", "个", "也", "都", "还", "再", "就", "用", "为", "对", "被", "让",
)
_CJK_NUMERAL_CHARS = set("零〇一二两三四五六七八九十百千万亿点")
#: Measure words that make a single Chinese numeral a number (三个, 五元) rather than part of a name (张三).
_CJK_MEASURE = set("元块个次张本件位天号岁斤米份条台人间晚")
_CJK_QUANTITY = re.compile("^[零〇一二两三四五六七八九十百千万亿点]+[元块个次张本件位天号岁斤米份条台人间晚]?$")
_EN_STOP = {
    "a", "an", "the", "to", "of", "in", "on", "at", "for", "from", "and", "or", "with", "by", "is", "are", "be",
    "what", "what's", "whats", "how", "please", "my", "me", "i", "you", "your", "it", "its", "this", "that", "can",
    "could", "would", "will", "do", "does", "tell", "show", "check", "get", "send", "give", "like", "weather",
    "today", "tomorrow", "also", "then", "as", "into", "about", "there", "here", "some", "any", "want",
}


#: ``name`` of the user-role message that carries validation errors in a re-ask.
FEEDBACK_NAME = "validator"


def message_text(message: Mapping[str, Any]) -> str:
    """The text of one chat message (string content or text parts)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return ""


def parse_chinese_number(text: str) -> float | None:
    """Parse a Chinese numeral (三百五十, 两千, 一万五千, 三点五, 十五); None if it is not one."""
    digits = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
    units = {"十": 10, "百": 100, "千": 1000}
    big = {"万": 10_000, "亿": 100_000_000}
    integer_part, _, fraction_part = text.partition("点")
    if not integer_part and not fraction_part:
        return None
    total = section = 0
    current: int | None = None
    for char in integer_part:
        if char in digits:
            current = digits[char]
        elif char in units:
            section += (1 if current is None else current) * units[char]
            current = None
        elif char in big:
            section += current or 0
            total += (section or 1) * big[char]
            section, current = 0, None
        else:
            return None
    value: float = total + section + (current or 0)
    if fraction_part:
        if not all(ch in digits for ch in fraction_part):
            return None
        value += float("0." + "".join(str(digits[ch]) for ch in fraction_part))
    return value


@dataclass(frozen=True)
class Evidence:
    """What the conversation offers as values: its text, candidate spans and numbers."""

    text: str
    spans: tuple[str, ...] = ()
    numbers: tuple[float, ...] = ()
    _folded: str = field(default="", repr=False)

    def mentions(self, word: str) -> bool:
        """Whether ``word`` appears in the text (case-insensitive; whole word for Latin words)."""
        if not word:
            return False
        folded = word.casefold()
        haystack = self._folded or self.text.casefold()
        if re.fullmatch(r"[\w .\-']+", folded, flags=re.ASCII):
            return re.search(rf"(?<![A-Za-z0-9]){re.escape(folded)}(?![A-Za-z0-9])", haystack) is not None
        return folded in haystack


def _latin_spans(text: str) -> list[str]:
    spans: list[str] = []
    words = list(_WORD.finditer(text))
    for start in range(len(words)):
        for end in range(start, min(start + MAX_SPAN_WORDS, len(words))):
            first, last = words[start].group().casefold(), words[end].group().casefold()
            if first in _EN_STOP or last in _EN_STOP:
                continue
            gap = text[words[start].end():words[end].start()] if end > start else ""
            if "\n" in gap or any(ch in gap for ch in ",;:!?()，。；：！？") or _CJK_RUN.search(gap):
                break
            spans.append(text[words[start].start():words[end].end()].rstrip(".'"))
    return spans


def _cjk_spans(text: str, boundary_words: Sequence[str]) -> list[str]:
    """Substrings of CJK runs, never crossing a function word, a tool's own vocabulary or a numeral."""
    words = sorted({w for w in (*CJK_FUNCTION_WORDS, *boundary_words) if w and _CJK_RUN.fullmatch(w)}, key=len, reverse=True)
    splitter = re.compile("|".join(map(re.escape, words))) if words else None
    spans: list[str] = []
    for run in _CJK_RUN.finditer(text):
        segments = splitter.split(run.group()) if splitter else [run.group()]
        for chars in segments:
            for length in range(min(MAX_CJK_SPAN, len(chars)), 1, -1):
                for start in range(0, len(chars) - length + 1):
                    span = chars[start:start + length]
                    if _CJK_QUANTITY.match(span):
                        continue  # a number (五百元), offered to numeric fields instead
                    spans.append(span)
    return spans


def _numbers(text: str) -> list[float]:
    found: list[float] = []
    multipliers = {"万": 10_000, "千": 1000, "百": 100, "亿": 100_000_000, "k": 1000, "K": 1000}
    for match in _NUMBER.finditer(text):
        value = float(match.group(1).replace(",", ""))
        found.append(value)
        if match.group(2):
            found.append(value * multipliers[match.group(2)])
    for match in _CN_NUMBER.finditer(text):
        numeral, after = match.group(), text[match.end():match.end() + 1]
        before = text[match.start() - 1:match.start()] if match.start() else ""
        if len(numeral) == 1 and after not in _CJK_MEASURE and _CJK_RUN.match(before or "a"):
            continue  # 张三: a name, not the number 3
        if not set(numeral) & set("零〇一二两三四五六七八九十"):
            continue  # a bare unit (1.5万's 万) is handled with the digits before it
        value = parse_chinese_number(numeral)
        if value is not None and numeral != "点":
            found.append(value)
    return found


def collect_evidence(messages: Sequence[Mapping[str, Any]], *, roles: Iterable[str] = DEFAULT_EVIDENCE_ROLES,
                     boundary_words: Sequence[str] = ()) -> Evidence:
    """Candidate spans and numbers from the messages of the given roles (user and tool by default).

    ``boundary_words`` are words no Chinese span may cross besides the function words: the
    request's own tool vocabulary (enum cues, aliases, words of the tool descriptions).
    """
    roles = tuple(roles)
    # Validator feedback in a re-ask lists the allowed values; it is not evidence of what the user wants.
    text = "\n".join(message_text(m) for m in messages if m.get("role") in roles and m.get("name") != FEEDBACK_NAME)
    spans: list[str] = []
    for match in _QUOTED.finditer(text):
        spans.append(next(group for group in match.groups() if group))
    spans += _latin_spans(text)
    spans += _cjk_spans(text, boundary_words)
    spans = [span.strip() for span in spans if span.strip()]
    unique_spans = tuple(dict.fromkeys(spans))[:MAX_CANDIDATES]
    numbers = tuple(dict.fromkeys(_numbers(text)))
    return Evidence(text=text, spans=unique_spans, numbers=numbers, _folded=text.casefold())


def _as_number(value: float, integer: bool) -> int | float | None:
    if integer:
        return int(value) if float(value).is_integer() else None
    return int(value) if float(value).is_integer() else value


def _fits(candidate: Any, schema: Mapping[str, Any]) -> bool:
    plain = {k: v for k, v in schema.items() if not k.startswith("x-") and k not in ("default", "description", "title", "examples")}
    return not validation_errors(plain, candidate)


_MISSING = object()


def _narrow_field(schema: Mapping[str, Any], evidence: Evidence, grounded: bool) -> Any:
    """The narrowed schema of one field, or ``_MISSING`` when the conversation gives no value for it."""
    if not isinstance(schema, Mapping):
        return schema
    grounded = bool(schema.get("x-grounded", grounded))
    kind = schema.get("type")
    aliases: Mapping[str, Any] = schema.get("x-aliases") or {}
    cues: Mapping[str, Sequence[str]] = schema.get("x-enum-aliases") or {}

    if kind == "object" or "properties" in schema:
        return narrow_schema(schema, evidence, grounded=grounded)
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        items = _narrow_field(schema["items"], evidence, grounded)
        if items is _MISSING:
            return _MISSING if schema.get("minItems", 0) > 0 else {**schema, "maxItems": 0}
        return {**schema, "items": items}

    enum = schema.get("enum")
    if enum is None and "const" in schema:
        enum = [schema["const"]]
    if enum is not None:
        if not (grounded or cues):
            return schema
        evidenced_aliases = {alias: canonical for alias, canonical in aliases.items() if evidence.mentions(alias)}
        kept = []
        for value in enum:
            if isinstance(value, str):
                hit = (evidence.mentions(value) or any(evidence.mentions(cue) for cue in cues.get(value, ()))
                       or value in evidenced_aliases.values())
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                hit = any(float(value) == number for number in evidence.numbers)
            else:
                hit = True
            if hit:
                kept.append(value)
        if not kept:
            return _MISSING
        narrowed = {k: v for k, v in schema.items() if k not in ("const", "x-enum-aliases")}
        narrowed["enum"] = kept
        narrowed["x-aliases"] = {a: c for a, c in evidenced_aliases.items() if c in kept}
        return narrowed

    if not grounded:
        return schema
    if kind in ("integer", "number"):
        values = []
        for number in evidence.numbers:
            candidate = _as_number(number, kind == "integer")
            if candidate is not None and _fits(candidate, schema):
                values.append(candidate)
        values = list(dict.fromkeys(values))
        return {**schema, "enum": values} if values else _MISSING
    if kind == "string":
        evidenced_aliases = {alias: canonical for alias, canonical in aliases.items() if evidence.mentions(alias)}
        canonical_hits = [c for c in dict.fromkeys(aliases.values()) if isinstance(c, str) and evidence.mentions(c)]
        candidates = [*evidenced_aliases.values(), *canonical_hits]
        candidates += [span for span in evidence.spans if _fits(span, schema)]
        candidates = [c for c in dict.fromkeys(candidates) if isinstance(c, str) and c not in evidenced_aliases]
        if not candidates and not evidenced_aliases:
            return _MISSING
        narrowed = {k: v for k, v in schema.items() if k not in ("pattern", "format", "minLength", "maxLength")}
        narrowed["enum"] = candidates or [next(iter(evidenced_aliases.values()))]
        narrowed["x-aliases"] = evidenced_aliases
        return narrowed
    return schema  # booleans, unions: nothing to ground


def narrow_schema(schema: Mapping[str, Any], evidence: Evidence, *, grounded: bool = False) -> Any:
    """Narrow an object schema's properties to the evidence; ``_MISSING`` if a required one has none."""
    grounded = bool(schema.get("x-grounded", grounded))
    properties = schema.get("properties") or {}
    required = list(schema.get("required") or [])
    new_properties: dict[str, Any] = {}
    new_required = list(required)
    for name, sub in properties.items():
        narrowed = _narrow_field(sub, evidence, grounded)
        if narrowed is not _MISSING:
            new_properties[name] = narrowed
            continue
        if isinstance(sub, Mapping) and "default" in sub:
            if name in required:
                new_properties[name] = {"enum": [sub["default"]]}
            else:
                continue  # the tool applies its default
        elif name in required:
            return _MISSING
        # an optional field with no evidence is left out of the grammar
    narrowed_schema = {k: v for k, v in schema.items() if k not in ("properties", "required")}
    narrowed_schema["properties"] = new_properties
    if new_required:
        narrowed_schema["required"] = [name for name in new_required if name in new_properties]
    return narrowed_schema


def is_grounded_tool(spec: ToolSpec, *, ground_all: bool = False) -> bool:
    """Whether any field of ``spec`` is subject to grounding (so its grammar is per request)."""
    text = json.dumps(spec.parameters)
    return ground_all or '"x-grounded": true' in text or '"x-enum-aliases"' in text


def tool_vocabulary(tools: Sequence[ToolSpec]) -> list[str]:
    """Words that describe the tools rather than fill their arguments: enum cues, alias keys and
    values, and the CJK bigrams of the descriptions (查询城市天气 → 城市, 天气, ...)."""
    words: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, Mapping):
            for cues in (node.get("x-enum-aliases") or {}).values():
                words.extend(c for c in cues if isinstance(c, str))
            words.extend(str(v) for v in (node.get("enum") or []) if isinstance(v, str))
            description = node.get("description")
            if isinstance(description, str):
                words.extend(_bigrams(description))
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    for spec in tools:
        words.extend(_bigrams(spec.description))
        visit(spec.parameters)
    return list(dict.fromkeys(words))


def _bigrams(text: str) -> list[str]:
    grams = []
    for run in _CJK_RUN.finditer(text):
        chars = run.group()
        grams.extend(chars[i:i + 2] for i in range(len(chars) - 1))
    return grams


@dataclass(frozen=True)
class GroundingResult:
    """Per-request narrowed parameter schemas of the tools that keep evidence."""

    #: ``{tool name: narrowed parameter schema}`` in the tools' order; narrowed only where grounded.
    parameters: dict[str, dict[str, Any]]
    #: ``{tool name: reason}`` for tools dropped from this request's grammar.
    dropped: dict[str, str]
    evidence: Evidence
    #: Whether any schema differs from its tool's base schema.
    narrowed: bool = False


def ground_tools(tools: Sequence[ToolSpec], messages: Sequence[Mapping[str, Any]], *, ground_all: bool = False,
                 allow_drop: bool = True, evidence: Evidence | None = None) -> GroundingResult:
    """Narrow every tool's parameter schema to the conversation; drop tools lacking required evidence.

    With ``allow_drop=False`` (a forced ``tool_choice``) a tool is never dropped: its fields
    without evidence are left as the spec declares them.
    """
    evidence = evidence or collect_evidence(messages, boundary_words=tool_vocabulary(tools))
    parameters: dict[str, dict[str, Any]] = {}
    dropped: dict[str, str] = {}
    narrowed_any = False
    for spec in tools:
        if not is_grounded_tool(spec, ground_all=ground_all):
            parameters[spec.name] = spec.parameters
            continue
        narrowed = narrow_schema(spec.parameters, evidence, grounded=ground_all)
        if narrowed is _MISSING:
            if allow_drop:
                dropped[spec.name] = "a required argument has no evidence in the conversation"
                continue
            narrowed = _narrow_keep_required(spec.parameters, evidence, ground_all)
        parameters[spec.name] = narrowed
        narrowed_any = narrowed_any or narrowed != spec.parameters
    return GroundingResult(parameters=parameters, dropped=dropped, evidence=evidence,
                           narrowed=narrowed_any or bool(dropped))


def _narrow_keep_required(schema: Mapping[str, Any], evidence: Evidence, grounded: bool) -> dict[str, Any]:
    """Narrow what has evidence and leave the rest as declared (used when a tool must be called)."""
    out = copy.deepcopy(dict(schema))
    grounded = bool(schema.get("x-grounded", grounded))
    for name, sub in (schema.get("properties") or {}).items():
        narrowed = _narrow_field(sub, evidence, grounded)
        if narrowed is not _MISSING:
            out["properties"][name] = narrowed
    return out
