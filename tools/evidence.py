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
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any, Literal
from zoneinfo import ZoneInfo

import regex
from dateutil.relativedelta import relativedelta, weekday

from tools.amounts import StatedAmount, find_amounts
from tools.languages import languages

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
    "reference_day",
    "sourced_values",
]

DEFAULT_ROLES = ("user", "tool")

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_LATIN_GAP = re.compile(rf"(?<=[{_CJK}])\s+(?=[^\s{_CJK}])|(?<=[^\s{_CJK}])\s+(?=[{_CJK}])")
_SPACES = re.compile(r"\s+")
#: A number standing on its own: not inside a word (Zx9q7, é5), a date, a time or a path (2031-02-03, 10:30, a/2).
_DIGITS = regex.compile(r"(?<![\p{Latin}\p{Cyrillic}\p{Greek}\p{N}_.:/\-])(-?\d{1,3}(?:,\d{3})+|-?\d+)(\.\d+)?"
                        r"(?![\p{N}]|[\-/:]\d|\.\d)")
#: Letters of scripts written without spaces between words (Han, kana, Thai...): a match next to one of them is
#: bounded by what it is, as before; next to any other letter, mark or digit it is inside a word.
_UNSPACED = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Bopomofo}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]")
_WORD_CHAR = regex.compile(r"[\p{L}\p{M}\p{N}_]")
#: Clock times (10:30) give their hour and minute as numbers.
_CLOCK = re.compile(r"(?<![\d:])(\d{1,2}):(\d{2})(?![\d:])")
_LATIN_WORD = re.compile(r"[^\W\d_]+(?:[\-'][^\W\d_]+)*")


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


Span = tuple[int, int, float]  # a number stated in the text: where, and its value


def _word_numbers(text: str, data: Mapping[str, Any]) -> Iterable[Span]:
    """Every maximal run of number words in ``text`` (words style)."""
    vocabulary = {*data.get("units", {}), *data.get("tens", {}), *data.get("scales", {})}
    joiners = data.get("joiners", ())
    run: list[tuple[str, int, int]] = []
    parts = [(p.group(), word.start() + p.start(), word.start() + p.end())
             for word in _LATIN_WORD.finditer(text) for p in re.finditer(r"[^\-]+", word.group())]
    for part, start, end in [*parts, ("", len(text), len(text))]:
        if part in vocabulary or (run and part in joiners):
            run.append((part, start, end))
            continue
        while run and run[-1][0] in joiners:
            run.pop()
        if run:
            value = _parse_words([p for p, _, _ in run], data)
            if value is not None:
                yield run[0][1], run[-1][2], value
        run = []


def _character_numbers(text: str, data: Mapping[str, Any]) -> Iterable[Span]:
    chars = "".join([*data.get("digits", {}), *data.get("units", {}), *data.get("big", {}), data.get("point", "")])
    if not chars:
        return
    for match in re.finditer(f"[{re.escape(chars)}]+", text):
        value = _parse_characters(match.group(), data)
        if value is not None:
            yield match.start(), match.end(), value


def _digit_numbers(text: str, multipliers: Mapping[str, float]) -> Iterable[Span]:
    for match in _DIGITS.finditer(text):
        value = float(match.group(1).replace(",", "") + (match.group(2) or ""))
        yield match.start(), match.end(), value
        rest = text[match.end():match.end() + 3].lstrip()
        for suffix, factor in multipliers.items():
            if rest.startswith(suffix) and not rest[len(suffix):len(suffix) + 1].isalpha():
                yield match.start(), match.end(), value * factor


def reference_day(now: float | None = None, time_zone: str | None = None) -> date:
    """The request's calendar day: its clock (epoch seconds; now when None) in its IANA time zone (UTC when None)."""
    zone = ZoneInfo(time_zone) if time_zone else timezone.utc
    return datetime.fromtimestamp(time.time() if now is None else now, tz=zone).date()


def _relative_dates(text: str, today: date) -> Iterable[date]:
    """The days ``text`` names relative to ``today``: tomorrow, 明天, friday (the coming one, never today)."""
    for data in languages().values():
        for word, days in data.get("relative_days", {}).items():
            if _find_bounded(text, word) >= 0:
                yield today + timedelta(days=days)
        for word, number in data.get("weekdays", {}).items():
            if _find_bounded(text, word) >= 0:
                yield today + relativedelta(days=+1, weekday=weekday(number))


def _find_bounded(text: str, needle: str, start: int = 0) -> int:
    """Where ``needle`` first occurs in ``text`` from ``start`` as a whole word (-1: nowhere).

    Word edges are Unicode's: a letter, mark or digit of any script next to the match continues the word
    ("éalice" does not hold "alice", nor "alice\u0301"), except between letters of scripts written without
    spaces (Han, kana: "转给张三" holds "张三"). Python's ``re`` knows no scripts; ``regex`` does. Its
    UAX #29 mode (``regex.WORD``) is not used: it reads "alice's" as one word, which would hide "alice"."""
    if not needle:
        return -1
    found = text.find(needle, start)
    while found >= 0:
        end = found + len(needle)
        before = text[found - 1] if found else ""
        after = text[end] if end < len(text) else ""
        if not (_joins(before, needle[0]) or _joins(needle[-1], after)):
            return found
        found = text.find(needle, found + 1)
    return -1


def _joins(left: str, right: str) -> bool:
    """``left`` and ``right`` side by side are one word (letters, marks, digits; not a script without spaces)."""
    if not left or not right or not (_WORD_CHAR.match(left) and _WORD_CHAR.match(right)):
        return False
    return not (_UNSPACED.match(left) or _UNSPACED.match(right))


@dataclass(frozen=True)
class ConversationValues:
    """What a conversation offers as values: normalized text, numbers, month numbers, amounts with their currency
    (:mod:`tools.amounts`), and the days it names relative to the request's day (``today``)."""

    text: str
    numbers: frozenset[float]
    months: frozenset[int]
    #: Numbers stated without a currency (every number of ``numbers`` that no amount uses).
    bare: frozenset[float] = frozenset()
    amounts: tuple[StatedAmount, ...] = ()
    dates: frozenset[date] = frozenset()
    today: date | None = field(default=None, compare=False)

    @classmethod
    def from_messages(cls, messages: Sequence[Mapping[str, Any]], *, roles: Iterable[str] = DEFAULT_ROLES,
                      today: date | None = None) -> "ConversationValues":
        return cls.from_text(conversation_text(messages, roles=roles), today=today)

    @classmethod
    def from_text(cls, raw: str, *, today: date | None = None) -> "ConversationValues":
        text = normalize_text(raw)
        spans: list[Span] = []
        months: set[int] = set()
        multipliers: dict[str, float] = {}
        for data in languages().values():
            multipliers.update(data.get("suffix_multipliers", {}))
            if data.get("style") == "characters":
                spans.extend(_character_numbers(text, data))
            else:
                spans.extend(_word_numbers(text, data))
            for word in _LATIN_WORD.findall(text):
                if word in data.get("months", {}):
                    months.add(data["months"][word])
        words = list(spans)
        spans.extend(_digit_numbers(text, multipliers))
        amounts, used = find_amounts(text, words, multipliers)
        clocks = [float(n) for hour, minute in _CLOCK.findall(text) for n in (hour, minute)]
        day = today or reference_day()
        in_amounts = bytearray(len(text))  # the characters of numbers an amount uses
        for start, end in used:
            in_amounts[start:end] = b"\x01" * (end - start)
        return cls(text=text, numbers=frozenset([value for _, _, value in spans] + clocks), months=frozenset(months),
                   bare=frozenset([v for s, e, v in spans if in_amounts.find(1, s, e) < 0] + clocks),
                   amounts=tuple(amounts), dates=frozenset(_relative_dates(text, day)), today=day)

    def find(self, value: str, start: int = 0) -> int:
        """Where ``value`` (normalized) next occurs in the text as a whole word, from ``start`` (-1: nowhere)."""
        return _find_bounded(self.text, normalize_text(value), start)

    def occurrences(self, value: str) -> list[tuple[int, int]]:
        """Every whole-word occurrence of ``value`` (normalized): ``(start, end)`` in :attr:`text`."""
        needle, found, spans = normalize_text(value), self.find(value), []
        while found >= 0:
            spans.append((found, found + len(needle)))
            found = _find_bounded(self.text, needle, found + 1)
        return spans

    def has_text(self, value: str) -> bool:
        """``value`` occurs in the conversation (normalized on both sides; a whole word by Unicode's letters)."""
        return self.find(value) >= 0

    def has_number(self, value: float) -> bool:
        """``value`` is a number the conversation states (digits, number words, suffixes like 2k or 3万)."""
        return any(abs(value - n) < 1e-9 for n in self.numbers)

    def has_bare_number(self, value: float) -> bool:
        """``value`` is a number the conversation states without a currency."""
        return any(abs(value - n) < 1e-9 for n in self.bare)


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


def sourced_values(messages: Sequence[Mapping[str, Any]], *, tool_source: Callable[[str | None], Source],
                   today: date | None = None) -> list[tuple[Source, ConversationValues]]:
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
    return [(source, ConversationValues.from_text("\n".join(parts), today=today)) for source, parts in texts.items()]
