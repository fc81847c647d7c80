"""The values a conversation holds: normalized text and numbers, for grounding checks and candidates.

Language knowledge (number words, month names, suffix multipliers such as ``k`` or ``万``) is
data, one JSON file per language under ``tools/lang/``; the code here is language-agnostic. Two
number styles are read: ``words`` (space-separated units/tens/scales: *two thousand five
hundred*) and ``characters`` (positional numerals: 两千五百, 三点五).

Only roles that carry facts count as evidence: what the user wrote and what tools returned
(``DEFAULT_ROLES``). The assistant's own words and the platform's feedback never ground a value.

Evidence has a source (:class:`Source`): the user's turns, the results of one tool (an MCP tool's
marked so), or the platform (the tool's own schema: a default). :func:`sourced_values` splits a
conversation by source, so a grounded value's provenance can be recorded and judged: a tool result
is untrusted input, like a web page, unless its tool's author or the tenant says otherwise.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "ConversationValues",
    "DEFAULT_ROLES",
    "PLATFORM",
    "Source",
    "USER",
    "conversation_text",
    "languages",
    "message_text",
    "normalize_text",
    "parse_number_words",
    "sourced_values",
]

DEFAULT_ROLES = ("user", "tool")
LANG_DIR = Path(__file__).with_name("lang")

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_LATIN_GAP = re.compile(rf"(?<=[{_CJK}])\s+(?=[^\s{_CJK}])|(?<=[^\s{_CJK}])\s+(?=[{_CJK}])")
_SPACES = re.compile(r"\s+")
#: A number standing on its own: not inside a word (Zx9q7), a date, a time or a path (2031-02-03, 10:30, a/2).
_DIGITS = re.compile(r"(?<![A-Za-z0-9_.:/\-])(-?\d{1,3}(?:,\d{3})+|-?\d+)(\.\d+)?(?![\d]|[\-/:]\d|\.\d)")
#: Clock times (10:30) give their hour and minute as numbers.
_CLOCK = re.compile(r"(?<![\d:])(\d{1,2}):(\d{2})(?![\d:])")
_LATIN_WORD = re.compile(r"[^\W\d_]+(?:[\-'][^\W\d_]+)*")


@cache
def languages() -> dict[str, dict[str, Any]]:
    """Every language data file, by its code (``en``, ``zh``, …)."""
    return {path.stem: json.loads(path.read_text("utf-8")) for path in sorted(LANG_DIR.glob("*.json"))}


def message_text(message: Mapping[str, Any]) -> str:
    """The text of one chat message (string content or text parts)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    if content is not None:
        return json.dumps(content, ensure_ascii=False)
    return ""


def conversation_text(messages: Sequence[Mapping[str, Any]], *, roles: Iterable[str] = DEFAULT_ROLES,
                      exclude_name: str | None = None) -> str:
    """The text of the messages of ``roles`` (one per line), leaving out messages named ``exclude_name``."""
    roles = set(roles)
    return "\n".join(message_text(m) for m in messages
                     if m.get("role") in roles and (exclude_name is None or m.get("name") != exclude_name))


def normalize_text(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed, no spaces between CJK and other characters."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _CJK_LATIN_GAP.sub("", text)
    return _SPACES.sub(" ", text).strip()


def _parse_words(tokens: Sequence[str], data: Mapping[str, Any]) -> float | None:
    units, tens, scales = data.get("units", {}), data.get("tens", {}), data.get("scales", {})
    total = current = 0
    seen = False
    for token in tokens:
        if token in data.get("joiners", ()):
            continue
        if token in units:
            current += units[token]
        elif token in tens:
            current += tens[token]
        elif token in scales:
            scale = scales[token]
            if scale == 100:
                current = (current or 1) * 100
            else:
                total += (current or 1) * scale
                current = 0
        else:
            return None
        seen = True
    return float(total + current) if seen else None


def _parse_characters(text: str, data: Mapping[str, Any]) -> float | None:
    digits, units, big = data.get("digits", {}), data.get("units", {}), data.get("big", {})
    integer_part, _, fraction_part = text.partition(data.get("point", "\x00"))
    if not integer_part:
        return None
    total = section = 0
    current: int | None = None
    last_unit = 0  # a digit right after a unit counts in the next lower unit (两千五 = 2500)
    for char in integer_part:
        if char in digits:
            current, last_unit = digits[char], (0 if digits[char] == 0 else last_unit)
        elif char in units:
            section += (1 if current is None else current) * units[char]
            current, last_unit = None, units[char]
        elif char in big:
            section += current or 0
            total += (section or 1) * big[char]
            section, current, last_unit = 0, None, big[char]
        else:
            return None
    if current is not None and last_unit >= 100 and digits.get(integer_part[-1]) != 0:
        current *= last_unit // 10
    value = float(total + section + (current or 0))
    if fraction_part:
        if not all(ch in digits for ch in fraction_part):
            return None
        value += float("0." + "".join(str(digits[ch]) for ch in fraction_part))
    return value


def parse_number_words(text: str, lang: str) -> float | None:
    """The number ``text`` spells in language ``lang`` (None when it spells none)."""
    data = languages().get(lang)
    if data is None:
        return None
    text = normalize_text(text)
    if data.get("style") == "characters":
        return _parse_characters(text.replace(" ", ""), data)
    return _parse_words(re.split(r"[\s\-]+", text), data)


def _word_numbers(text: str, data: Mapping[str, Any]) -> Iterable[float]:
    """Every maximal run of number words in ``text`` (words style)."""
    vocabulary = {*data.get("units", {}), *data.get("tens", {}), *data.get("scales", {})}
    run: list[str] = []
    for word in [*_LATIN_WORD.findall(text), ""]:
        for part in word.split("-"):
            if part in vocabulary or (run and part in data.get("joiners", ())):
                run.append(part)
                continue
            while run and run[-1] in data.get("joiners", ()):
                run.pop()
            if run:
                value = _parse_words(run, data)
                if value is not None:
                    yield value
            run = []


def _character_numbers(text: str, data: Mapping[str, Any]) -> Iterable[float]:
    chars = "".join([*data.get("digits", {}), *data.get("units", {}), *data.get("big", {}), data.get("point", "")])
    if not chars:
        return
    for match in re.finditer(f"[{re.escape(chars)}]+", text):
        value = _parse_characters(match.group(), data)
        if value is not None:
            yield value


def _digit_numbers(text: str, multipliers: Mapping[str, float]) -> Iterable[float]:
    for match in _DIGITS.finditer(text):
        value = float(match.group(1).replace(",", "") + (match.group(2) or ""))
        yield value
        rest = text[match.end():match.end() + 3].lstrip()
        for suffix, factor in multipliers.items():
            if rest.startswith(suffix) and not rest[len(suffix):len(suffix) + 1].isalpha():
                yield value * factor


@dataclass(frozen=True)
class ConversationValues:
    """What a conversation offers as values: normalized text, numbers, month numbers."""

    text: str
    numbers: frozenset[float]
    months: frozenset[int]

    @classmethod
    def from_messages(cls, messages: Sequence[Mapping[str, Any]], *, roles: Iterable[str] = DEFAULT_ROLES) -> "ConversationValues":
        return cls.from_text(conversation_text(messages, roles=roles))

    @classmethod
    def from_text(cls, raw: str) -> "ConversationValues":
        text = normalize_text(raw)
        numbers: set[float] = set()
        months: set[int] = set()
        multipliers: dict[str, float] = {}
        for data in languages().values():
            multipliers.update(data.get("suffix_multipliers", {}))
            if data.get("style") == "characters":
                numbers.update(_character_numbers(text, data))
            else:
                numbers.update(_word_numbers(text, data))
            for word in _LATIN_WORD.findall(text):
                if word in data.get("months", {}):
                    months.add(data["months"][word])
        numbers.update(_digit_numbers(text, multipliers))
        for hour, minute in _CLOCK.findall(text):
            numbers.update((float(hour), float(minute)))
        return cls(text=text, numbers=frozenset(numbers), months=frozenset(months))

    def has_text(self, value: str) -> bool:
        """``value`` occurs in the conversation (normalized on both sides; word-bounded for Latin words)."""
        needle = normalize_text(value)
        if not needle:
            return False
        start = self.text.find(needle)
        while start >= 0:
            end = start + len(needle)
            before = self.text[start - 1] if start else " "
            after = self.text[end] if end < len(self.text) else " "
            if not (needle[0].isalnum() and before.isalnum() and before.isascii()) and \
                    not (needle[-1].isalnum() and after.isalnum() and after.isascii()):
                return True
            start = self.text.find(needle, start + 1)
        return False

    def has_number(self, value: float) -> bool:
        """``value`` is a number the conversation states (digits, number words, suffixes like 2k or 3万)."""
        return any(abs(value - n) < 1e-9 for n in self.numbers)


@dataclass(frozen=True)
class Source:
    """Where a value was stated: the user's turns, one tool's results (``mcp``: an MCP server's tool), or the
    platform (the tool's own schema). ``trusted``: it may ground a side effect's fields by itself (the user and
    the platform always; a tool only when its author or the tenant vouches for its results)."""

    kind: Literal["user", "tool", "platform"]
    tool: str | None = None
    mcp: bool = False
    trusted: bool = True

    def public(self) -> dict[str, Any]:
        """The record shown on a call (and to the person approving it)."""
        if self.kind != "tool":
            return {"kind": self.kind}
        return {"kind": "tool", "tool": self.tool, "mcp": self.mcp, "trusted": self.trusted}


USER = Source("user")
PLATFORM = Source("platform")


def sourced_values(messages: Sequence[Mapping[str, Any]], *,
                   tool_source: Callable[[str | None], Source]) -> list[tuple[Source, ConversationValues]]:
    """The conversation's evidence by source: the user's turns together, each tool's results together.

    A ``tool`` message names its tool (``name``) or answers a call of an assistant turn (``tool_call_id``);
    ``tool_source(name)`` says what that tool is (name None: a result no call names, never trusted)."""
    names: dict[str, str] = {}
    for message in messages:
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, Mapping) and isinstance(call.get("id"), str):
                function = call.get("function") if isinstance(call.get("function"), Mapping) else call
                names[call["id"]] = str(function.get("name") or "")
    texts: dict[Source, list[str]] = {}
    for message in messages:
        role = message.get("role")
        if role == "user":
            texts.setdefault(USER, []).append(message_text(message))
        elif role == "tool":
            name = message.get("name") or names.get(str(message.get("tool_call_id"))) or None
            texts.setdefault(tool_source(str(name) if name else None), []).append(message_text(message))
    return [(source, ConversationValues.from_text("\n".join(parts))) for source, parts in texts.items()]
