"""Cleaning raw model output into JSON values: small pure steps, run as lists.

Two phases, each a list of functions with one signature:

- text steps, ``(Draft) -> Draft``: strip code fences, cut the JSON out of prose, re-lex
  leniently (Chinese/full-width quotes and punctuation *outside* strings, single quotes,
  Python literals, bare words, missing and trailing commas), close truncated structure
  only where the cut fell on a value boundary;
- value steps, ``(value, schema) -> (value, notes)``: aliases to canonical values, scalar
  coercion where the schema is unambiguous, enum case folding, defaults of optional fields —
  one alias rule, one enum rule and one walk, shared with the decider (``canonical_value``).

Nothing is dropped silently: a field outside the schema is left for validation to
report. Every change is recorded as a note so the job record shows what was repaired.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tools.errors import AmbiguousOutputError, CleaningError
from tools.schema_walk import declared_types, map_described, pointer

__all__ = [
    "CANONICAL_STEPS",
    "NORMALIZE_STEPS",
    "TEXT_STEPS",
    "VALUE_STEPS",
    "Draft",
    "alias_target",
    "apply_aliases",
    "canonical_value",
    "clean_text",
    "clean_value",
    "close_truncated",
    "coerce_scalars",
    "enum_member",
    "extract_json_span",
    "fill_defaults",
    "fold_enum_case",
    "loads_strict",
    "normalize_value",
    "relex",
    "strip_code_fences",
    "strip_comments",
    "strip_invisible",
]

MAX_TEXT_CHARS = 200_000
MAX_DEPTH = 64


@dataclass(frozen=True)
class Draft:
    """Text on its way to JSON, and the notes of what was changed."""

    text: str
    notes: tuple[str, ...] = ()
    #: Set by ``relex`` when the text ended inside open brackets.
    open_brackets: tuple[str, ...] = field(default=())
    #: Set by ``relex``: the role of the final token (value, number, word, key, colon, comma, open).
    last_token: str = ""

    def note(self, message: str, **changes: Any) -> "Draft":
        return replace(self, notes=(*self.notes, message), **changes)


TextStep = Callable[[Draft], Draft]
ValueStep = Callable[[Any, dict[str, Any]], tuple[Any, list[str]]]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)
_OPENERS = {"{": "}", "[": "]", "｛": "｝", "［": "］"}
_CLOSERS = frozenset({"}", "]", "｝", "］"})
_QUOTES = {'"': '"', "'": "'", "“": "”", "„": "”", "‘": "’", "「": "」", "『": "』", "＂": "＂"}


_INVISIBLE = re.compile("[\ufeff\u200b\u200c\u200d\u2060]")


def strip_invisible(draft: Draft) -> Draft:
    """Drop a byte-order mark and zero-width characters: invisible, never meant as content."""
    text, count = _INVISIBLE.subn("", draft.text)
    return draft.note(f"removed {count} invisible character(s) (BOM, zero-width)", text=text) if count else draft


def strip_comments(draft: Draft) -> Draft:
    """Remove ``// …`` line comments and ``/* … */`` block comments outside strings (JSON has none)."""
    text, out, i, n, quote, removed = draft.text, [], 0, len(draft.text), None, 0
    while i < n:
        ch = text[i]
        if quote:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in _QUOTES and (ch != "'" or not (i and text[i - 1].isalnum())):
            quote = _QUOTES[ch]
            out.append(ch)
        elif text.startswith("//", i) and not (i and text[i - 1] == ":"):  # not the // of a bare http://
            end = text.find("\n", i)
            i, removed = (n if end < 0 else end), removed + 1
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i, removed = (n if end < 0 else end + 2), removed + 1
            continue
        else:
            out.append(ch)
        i += 1
    return draft.note(f"removed {removed} comment(s)", text="".join(out)) if removed else draft


def strip_code_fences(draft: Draft) -> Draft:
    """```json ... ``` → the inside (an unterminated fence keeps everything after it).

    Only a fence that opens before any JSON bracket counts: backticks inside a string
    value of the JSON itself are content, not Markdown.
    """
    match = _FENCE.search(draft.text)
    if not match or any(ch in _OPENERS for ch in draft.text[:match.start()]):
        return draft
    return draft.note(f"stripped a ```{match.group(1)} code fence", text=match.group(2).strip())


def _span_end(text: str, start: int) -> int | None:
    """Index just past the bracket closing the one at ``start``; None when the text ends first."""
    depth, quote = 0, None
    i, n = start, len(text)
    while i < n:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in _QUOTES and (ch != "'" or not text[i - 1].isalnum()):
            quote = _QUOTES[ch]
        elif ch in _OPENERS:
            depth += 1
        elif ch in _CLOSERS:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def extract_json_span(draft: Draft) -> Draft:
    """Cut the first JSON object/array out of surrounding prose (before and after it).

    Text with no bracket at all holds no call: re-lexing prose would turn it into words.
    """
    text = draft.text.strip()
    start = next((i for i, ch in enumerate(text) if ch in _OPENERS), None)
    if start is None:
        raise CleaningError("no JSON found in the output", errors=[{"path": "", "message": "no JSON value found"}])
    end = _span_end(text, start)
    span = text[start:end] if end else text[start:]
    if end is not None and any(ch in _OPENERS for ch in text[end:]):
        raise AmbiguousOutputError("the output holds more than one JSON value where one was expected", errors=[{
            "path": "", "message": "more than one JSON value in the output (which one is meant is ambiguous)",
            "validator": "ambiguous"}])
    if span == text:
        return draft if text == draft.text else replace(draft, text=text)
    dropped = len(text) - len(span)
    return draft.note(f"extracted JSON from surrounding prose ({dropped} characters around it)", text=span)


_PUNCT = {"{": "{", "}": "}", "[": "[", "]": "]", ":": ":", ",": ",",
          "｛": "{", "｝": "}", "［": "[", "］": "]", "：": ":", "，": ",", "、": ","}
_LITERALS = {"true": "true", "false": "false", "null": "null", "True": "true", "False": "false", "None": "null",
             "TRUE": "true", "FALSE": "false", "NULL": "null", "nil": "null"}
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WORD_STOP = set(" \t\r\n\u3000") | set(_PUNCT) | set(_QUOTES)
_ESCAPE = re.compile(r'\\(u[0-9a-fA-F]{4}|["\\/bfnrt])|\\')
_ESCAPED_APOSTROPHE = re.compile(r"(?<!\\)((?:\\\\)*)\\'")
_BARE_DOUBLE_QUOTE = re.compile(r'(?<!\\)((?:\\\\)*)"')


def _value_end(tok: tuple[str, str] | None) -> bool:
    return tok is not None and (tok[0] in {"str", "num", "lit", "word"} or tok[1] in {"}", "]"})


def _value_start(tok: tuple[str, str]) -> bool:
    return tok[0] in {"str", "num", "lit", "word"} or tok[1] in {"{", "["}


def _decode_string(body: str, quote: str) -> tuple[str, bool]:
    """The value of a string body between ``quote`` marks; True when escapes were invalid.

    JSON escapes are decoded; a backslash that starts no valid escape is kept as a
    literal backslash. Raw control characters (a literal newline) are kept as they are.
    """
    body = _ESCAPED_APOSTROPHE.sub(r"\1'", body)  # \' is no JSON escape; models mean '
    if quote != '"':
        body = _BARE_DOUBLE_QUOTE.sub(r'\1\\"', body)  # a " inside '…' or “…” is content
    invalid = False

    def keep(match: re.Match[str]) -> str:
        nonlocal invalid
        if match.group(1) is None:
            invalid = True
            return "\\\\"
        return match.group(0)

    fixed = _ESCAPE.sub(keep, body)
    return json.loads(f'"{fixed}"', strict=False), invalid


def relex(draft: Draft) -> Draft:
    """Re-lex leniently and re-emit canonical JSON text.

    Strings may be delimited by any common quote pair; their contents are kept exactly.
    Outside strings, full-width punctuation becomes JSON syntax, Python literals become JSON
    ones, bare words become strings, missing commas are inserted and trailing or doubled
    ones removed. Records on the draft the brackets left open and the role of the last
    token, for ``close_truncated``.
    """
    text, notes = draft.text, []
    tokens: list[tuple[str, str]] = []
    stack: list[str] = []
    i, n = 0, len(text)

    def push(tok: tuple[str, str]) -> None:
        if _value_start(tok) and _value_end(tokens[-1] if tokens else None):
            tokens.append(("punct", ","))
            notes.append("inserted a missing comma")
        tokens.append(tok)

    while i < n:
        ch = text[i]
        if ch in " \t\r\n\u3000":
            i += 1
            continue
        if ch in _QUOTES:
            close = _QUOTES[ch]
            j = i + 1
            while j < n and text[j] != close:
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise CleaningError("output was cut inside a string; its value is unknown",
                                    errors=[{"path": "", "message": "truncated inside a string"}])
            value, invalid = _decode_string(text[i + 1:j], ch)
            if invalid:
                notes.append("kept invalid escapes in a string as literal backslashes")
            if ch != '"':
                notes.append(f"requoted a {ch}…{close} string")
            push(("str", json.dumps(value, ensure_ascii=False)))
            i = j + 1
            continue
        if ch in _PUNCT:
            sym = _PUNCT[ch]
            i += 1
            if sym != ch:
                notes.append(f"full-width {ch!r} → {sym!r}")
            if sym == "," and (not tokens or tokens[-1][1] in {",", "{", "[", ":"}) and stack and stack[-1] == "}":
                notes.append("removed a doubled comma")
                continue
            if sym in "{[":
                stack.append("}" if sym == "{" else "]")
                if len(stack) > MAX_DEPTH:
                    raise CleaningError(f"nesting deeper than {MAX_DEPTH}", errors=[{"path": "", "message": "too deep"}])
            elif sym in "}]":
                if tokens and tokens[-1][1] == ",":
                    tokens.pop()
                    notes.append("removed a trailing comma")
                if stack and stack[-1] == sym:
                    stack.pop()
                else:
                    raise CleaningError(f"unbalanced {sym!r} at offset {i - 1}", errors=[{"path": "", "message": f"unbalanced {sym!r}"}])
            push(("punct", sym))
            continue
        number = _NUMBER.match(text, i)
        if number and (number.end() == n or text[number.end()] in _WORD_STOP):
            tok = ("num", number.group())
            i = number.end()
        else:
            j = _word_end(text, i)
            if tokens and tokens[-1][1] == ":":
                # A bare value runs to the next delimiter: {city: New York} is one string.
                while True:
                    k = j
                    while k < n and text[k] in " \t":
                        k += 1
                    if k == j or k >= n or text[k] in _WORD_STOP:
                        break
                    j = _word_end(text, k)
            word = text[i:j]
            i = j
            if word in _LITERALS:
                if _LITERALS[word] != word:
                    notes.append(f"literal {word} → {_LITERALS[word]}")
                tok = ("lit", _LITERALS[word])
            elif word in {"NaN", "Infinity", "-Infinity", "undefined"}:
                raise CleaningError(f"{word} is not a JSON value", errors=[{"path": "", "message": f"{word} is not a JSON value"}])
            else:
                notes.append(f"quoted bare word {word!r}")
                tok = ("word", json.dumps(word, ensure_ascii=False))
        push(tok)
    rendered = "".join(tok for _, tok in tokens)
    return replace(draft, text=rendered, open_brackets=tuple(stack), last_token=_last_role(tokens, stack),
                   notes=(*draft.notes, *dict.fromkeys(notes)))


def _word_end(text: str, start: int) -> int:
    end = start
    while end < len(text) and text[end] not in _WORD_STOP:
        end += 1
    return end


def _last_role(tokens: list[tuple[str, str]], stack: list[str]) -> str:
    """What the final token is: value, number, word, key, colon, comma or open."""
    if not tokens:
        return ""
    kind, tok = tokens[-1]
    if kind == "punct":
        return {":": "colon", ",": "comma", "{": "open", "[": "open"}.get(tok, "value")
    if kind in {"str", "word"} and stack and stack[-1] == "}" and (len(tokens) == 1 or tokens[-2][1] in {"{", ","}):
        return "key"
    return {"num": "number", "word": "word"}.get(kind, "value")


def close_truncated(draft: Draft) -> Draft:
    """Close brackets left open when output was cut on a value boundary; refuse otherwise.

    A cut after a complete string, literal or closed container (or after the comma that
    follows any value) is safe to close. A cut after a number (``100`` may have been
    ``1000``), a bare word (``tru``…), a key, a colon or an opening bracket is not.
    """
    if not draft.open_brackets:
        return draft
    text = draft.text.rstrip()
    role = draft.last_token
    if text.endswith(","):
        text = text[:-1]
    elif role in {"number", "word", "colon", "open"} or (not role and (text.endswith(":") or re.search(r"[\d.{\[]$", text))):
        raise CleaningError("output was cut before a value was complete",
                            errors=[{"path": "", "message": "truncated output: the last value is incomplete"}])
    if role == "key":
        raise CleaningError("output was cut after a key", errors=[{"path": "", "message": "truncated output after a key"}])
    closing = "".join(reversed(draft.open_brackets))
    return draft.note(f"closed {len(closing)} bracket(s) of truncated output", text=text + closing, open_brackets=())


TEXT_STEPS: tuple[TextStep, ...] = (strip_invisible, strip_code_fences, strip_comments, extract_json_span, relex,
                                     close_truncated)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` that refuses a key given twice with different values."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out and out[key] != value:
            raise AmbiguousOutputError(f"key {key!r} is given twice with different values", errors=[{
                "path": f"/{key}", "message": f"key {key!r} is given twice with different values ({out[key]!r}, {value!r})",
                "validator": "ambiguous"}])
        out[key] = value
    return out


def loads_strict(text: str) -> Any:
    """``json.loads`` that rejects NaN/Infinity and conflicting duplicate keys (AmbiguousOutputError)."""
    return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_pairs)

class _NonJSONConstant(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    """Python's json accepts NaN and Infinity; JSON does not, and neither does a tool argument."""
    raise _NonJSONConstant(name)


def clean_text(text: str, steps: tuple[TextStep, ...] = TEXT_STEPS) -> tuple[Any, tuple[str, ...]]:
    """Parse ``text`` strictly, else run the text steps and parse the result.

    Returns the parsed value and the notes of every change. Raises ``CleaningError``.
    """
    if len(text) > MAX_TEXT_CHARS:
        raise CleaningError(f"output of {len(text)} characters exceeds {MAX_TEXT_CHARS}",
                            errors=[{"path": "", "message": "output too large"}])
    try:
        return loads_strict(text), ()
    except AmbiguousOutputError:
        raise
    except (ValueError, RecursionError):  # also NaN, and integers past Python's digit limit
        pass
    draft = Draft(text=text)
    for step in steps:
        draft = step(draft)
    if not draft.text.strip():
        raise CleaningError("no JSON found in the output", errors=[{"path": "", "message": "no JSON value found"}])
    try:
        return loads_strict(draft.text), draft.notes
    except AmbiguousOutputError:
        raise
    except (ValueError, RecursionError) as exc:
        raise CleaningError(f"output is not repairable JSON: {exc}", errors=[{"path": "", "message": str(exc)}]) from None


# ---------------------------------------------------------------- value steps (one walk: ``map_described``)

Rule = Callable[[Any, Any, str, list[str]], Any]


def _by_part(rule: Rule) -> ValueStep:
    """A value step applying ``rule(part, its schema, pointer, notes)`` to every described part."""
    def step(value: Any, schema: dict[str, Any]) -> tuple[Any, list[str]]:
        notes: list[str] = []
        return map_described(value, schema, lambda part, node, path: rule(part, node, path, notes)), notes

    step.__doc__ = rule.__doc__
    step.__name__ = step.__qualname__ = rule.__name__.lstrip("_")
    return step


def alias_target(current: str, aliases: Any) -> str | None:
    """The one alias rule: the canonical value ``current`` spells, exactly, stripped, else case-folded."""
    if not isinstance(aliases, dict) or not aliases:
        return None
    for spelling in (current, current.strip()):
        if spelling in aliases:
            return aliases[spelling]
    return {str(alias).casefold(): canonical for alias, canonical in aliases.items()}.get(current.strip().casefold())


def enum_member(current: str, enum: Any) -> str | None:
    """The one enum rule: the enum's spelling of a case/space variant, when exactly one member matches."""
    if not isinstance(enum, list) or current in enum:
        return None
    matches = [e for e in enum if isinstance(e, str) and e.casefold() == current.strip().casefold()]
    return matches[0] if len(matches) == 1 else None


def _apply_aliases(part: Any, node: Any, path: str, notes: list[str]) -> Any:
    """Map declared aliases (``x-aliases``) to canonical values: 沪 → Shanghai, 明天 → tomorrow, at any depth."""
    canonical = alias_target(part, node.get("x-aliases")) if isinstance(part, str) else None
    if canonical is None or canonical == part:
        return part
    notes.append(f"{path}: alias {part!r} → {canonical!r}")
    return canonical


def _fold_enum_case(part: Any, node: Any, path: str, notes: list[str]) -> Any:
    """Map a case/whitespace variant of an enum value (" Celsius") to the enum's own spelling."""
    member = enum_member(part, node.get("enum")) if isinstance(part, str) else None
    if member is None:
        return part
    notes.append(f"{path}: enum case {part!r} → {member!r}")
    return member


_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _scalar_for(current: Any, types: set[str]) -> Any:
    """``current`` as the one type the schema names, where that spelling is unambiguous; else itself."""
    if isinstance(current, str) and types == {"integer"}:
        s = current.strip().replace(",", "") if re.fullmatch(r"\s*[+-]?\d{1,3}(,\d{3})+\s*", current) else current.strip()
        if _INT.match(s):
            return int(s)
        if _FLOAT.match(s) and float(s).is_integer():
            return int(float(s))
    elif isinstance(current, str) and types == {"number"}:
        s = current.strip().replace(",", "") if re.fullmatch(r"\s*[+-]?\d{1,3}(,\d{3})+(\.\d+)?\s*", current) else current.strip()
        if _FLOAT.match(s):
            return int(float(s)) if _INT.match(s) else float(s)
    elif isinstance(current, str) and types == {"boolean"} and current.strip().lower() in {"true", "false"}:
        return current.strip().lower() == "true"
    elif type(current) is int and types == {"string"}:
        return str(current)
    elif isinstance(current, float) and types == {"integer"} and current.is_integer():
        return int(current)
    return current


def _coerce_scalars(part: Any, node: Any, path: str, notes: list[str]) -> Any:
    """Coerce scalars where the schema names exactly one type: "100" → 100, "true" → true, 42 → "42".

    Enum strings are case-folded to the unique enum member they match ("Today" → "today").
    Only integers become strings: ``1.50`` or ``1e3`` have no single faithful spelling.
    """
    if not path:  # the arguments object itself
        return part
    new = _scalar_for(part, declared_types(node))
    if isinstance(new, str):
        new = enum_member(new, node.get("enum")) or new
    if new != part or type(new) is not type(part):
        notes.append(f"{path}: coerced {part!r} → {new!r}")
        return new
    return part


def _fill_defaults(part: Any, node: Any, path: str, notes: list[str]) -> Any:
    """Fill declared defaults of optional fields that are missing."""
    props = node.get("properties")
    if not isinstance(part, dict) or not isinstance(props, dict):
        return part
    missing = {key: sub["default"] for key, sub in props.items()
               if key not in part and isinstance(sub, dict) and "default" in sub}
    for key, default in missing.items():
        notes.append(f"{pointer(path, key)}: default {default!r}")
    return {**part, **{key: json.loads(json.dumps(default)) for key, default in missing.items()}} if missing else part


apply_aliases = _by_part(_apply_aliases)
fold_enum_case = _by_part(_fold_enum_case)
coerce_scalars = _by_part(_coerce_scalars)
fill_defaults = _by_part(_fill_defaults)

#: What a decoded call is handed back as (the decider): canonical values, nothing added.
CANONICAL_STEPS: tuple[ValueStep, ...] = (apply_aliases, fold_enum_case)
#: Semantic normalization, applied to every call, valid or not.
NORMALIZE_STEPS: tuple[ValueStep, ...] = (*CANONICAL_STEPS, fill_defaults)
#: Repairs, applied when validation failed.
VALUE_STEPS: tuple[ValueStep, ...] = (coerce_scalars, apply_aliases, fill_defaults)


def _run(value: Any, schema: dict[str, Any], steps: tuple[ValueStep, ...]) -> tuple[Any, tuple[str, ...]]:
    notes: list[str] = []
    for step in steps:
        value, step_notes = step(value, schema)
        notes += step_notes
    return value, tuple(notes)


def canonical_value(value: Any, schema: dict[str, Any]) -> tuple[Any, tuple[str, ...]]:
    """Aliases and enum spellings made canonical (what the decider returns for a call)."""
    return _run(value, schema, CANONICAL_STEPS)


def normalize_value(value: Any, schema: dict[str, Any]) -> tuple[Any, tuple[str, ...]]:
    """Aliases, enum spellings and defaults (semantic normalization)."""
    return _run(value, schema, NORMALIZE_STEPS)


def clean_value(value: Any, schema: dict[str, Any]) -> tuple[Any, tuple[str, ...]]:
    """Coercion, aliases and defaults (repair)."""
    return _run(value, schema, VALUE_STEPS)
