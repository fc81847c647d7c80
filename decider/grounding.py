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

Candidates are typed from the schema: a field with a ``pattern`` or ``format`` (date, time, ids,
phone numbers) takes only spans of that shape; a name field never takes a quantity, a date or a
value a shaped sibling already takes; numbers are never read from inside a date, time or id; a
free field whose leading name word (``from``_account, ``with``_person, ``to``; 从/给/和 in Chinese)
introduces a span in the text takes that span. A tool is also dropped when a dropped tool holds
all of its closed evidence and more (the request is about the richer tool, which lacks a value).

:func:`call_count` decides how many calls to make, outside the model: one per distinct evidence
set, read clause by clause, with each call narrowed to its own group's values.

The narrowing is expressed as a narrowed JSON Schema (``enum`` lists), so the Triton backend
enforces exactly the same constraint as the embedded engine. Evidence comes from user and tool
messages only: the system prompt lists every enum value and would count as evidence for all.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from decider.schema import validation_errors
from tools.spec import ToolSpec

__all__ = [
    "CJK_FUNCTION_WORDS",
    "CJK_REQUEST_WORDS",
    "CallCount",
    "DEFAULT_EVIDENCE_ROLES",
    "Evidence",
    "FORMAT_PATTERNS",
    "GroundingResult",
    "ROLE_CUES_ZH",
    "SHIFTING_WORDS",
    "call_count",
    "clock_times",
    "collect_evidence",
    "durations",
    "ground_tools",
    "intent_values",
    "is_grounded_tool",
    "is_name_like",
    "message_text",
    "narrow_schema",
    "parse_chinese_number",
    "parse_english_number",
    "relevance",
    "tool_cues",
    "tool_vocabulary",
    "typed_spans",
]

DEFAULT_EVIDENCE_ROLES = ("user", "tool")
#: Longest candidate span: words for Latin text, characters for CJK runs.
MAX_SPAN_WORDS = 4
MAX_CJK_SPAN = 8
MAX_CANDIDATES = 200

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|[A-Za-z0-9\u00c0-\u024f][A-Za-z0-9\u00c0-\u024f_.@+\-'/]*")
_QUOTED = re.compile(r"\"([^\"\n]{1,80})\"|(?<![A-Za-z])'([^'\n]{1,80})'(?![A-Za-z])|“([^”\n]{1,80})”|‘([^’\n]{1,80})’|「([^」\n]{1,80})」|《([^》\n]{1,80})》")
#: A number standing alone: not a piece of a date, time, id or code (2025-07-10, 09:30, BK-1024, SO123456).
_NUMBER = re.compile(r"(?<![A-Za-z0-9_.:/\-])(-?\d+(?:,\d{3})*(?:\.\d+)?)(?![0-9])(?![:/\-]\d)\s*([万千百亿kK])?")
#: A span that is a quantity (500, 88.8, 1,200), never a name; identifiers (≥ 5 digits) stay names.
_QUANTITY_WORD = re.compile(r"^-?(?:\d{1,4}|\d{1,3}(?:,\d{3})+|\d+\.\d+)$")
#: JSON Schema ``format`` values whose strings are recognised in text by shape.
FORMAT_PATTERNS = {
    "date": r"\d{4}-\d{2}-\d{2}",
    "time": r"\d{1,2}:\d{2}(?::\d{2})?",
    "date-time": r"\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2})?",
    "email": r"[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+",
}
_CN_NUMBER = re.compile("[零〇一二两三四五六七八九十百千万亿点]+")
#: Chinese function words: a candidate span never crosses one (longest first when splitting).
CJK_FUNCTION_WORDS = (
    "怎么样", "查一下", "查下", "看一下", "看下", "问下", "另外", "的话", "一下", "帮我", "给我", "请问", "查询", "可以", "怎么", "什么", "多少", "哪里", "然后",
    "还有", "同时", "以及", "并且", "或者", "看看", "的", "了", "吗", "呢", "吧", "啊", "呀", "嘛", "在", "给", "把",
    "和", "与", "及", "跟", "从", "向", "到", "是", "我", "你", "他", "她", "它", "们", "请", "帮", "查", "问", "看",
    "要", "想", "能", "会", "转", "发", "开", "几", "哪", "这", "那", "个", "也", "都", "还", "再", "就", "用", "为", "对", "被", "让",
)
#: Generic words of service requests (what is asked, not who or which): never part of a name.
CJK_REQUEST_WORDS = (
    "天气", "预报", "温度", "余额", "转账", "账单", "状态", "物流", "订单", "数量", "退款", "取消", "预订", "开会", "会议",
    "主题", "手机", "电话", "收件人", "改成", "改为", "换成", "显示", "告诉", "分钟", "小时",
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

#: Words that shift the meaning of the Latin word after them: it is then no evidence of itself.
SHIFTING_WORDS = frozenset({"after", "before", "not", "no", "except", "than", "non"})

#: Words that join two values (``from checking to Bob``): a name never spans one.
_EN_ROLE_WORDS = {"to", "from", "for", "with", "and", "or", "on", "at", "in", "by", "into", "then", "also", "about"}

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
    """Parse a Chinese numeral (三百五十, 两千, 两千五, 一万五千, 三点五, 十五); None if it is not one."""
    digits = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
    units = {"十": 10, "百": 100, "千": 1000}
    big = {"万": 10_000, "亿": 100_000_000}
    integer_part, _, fraction_part = text.partition("点")
    if not integer_part and not fraction_part:
        return None
    total = section = 0
    current: int | None = None
    last_unit = 0  # the unit just read: a digit right after it counts in the next lower unit (两千五 = 2500)
    for char in integer_part:
        if char in digits:
            current = digits[char]
            last_unit = 0 if char in "零〇" else last_unit
        elif char in units:
            section += (1 if current is None else current) * units[char]
            current, last_unit = None, units[char]
        elif char in big:
            section += current or 0
            total += (section or 1) * big[char]
            section, current, last_unit = 0, None, big[char]
        else:
            return None
    if current is not None and last_unit >= 100 and integer_part[-1] not in "零〇":
        current *= last_unit // 10
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
    #: Durations the text gives, in minutes (两个小时, two hours, 90 minutes): for fields of a time unit.
    durations: tuple[float, ...] = ()
    _folded: str = field(default="", repr=False)

    def mentions(self, word: str) -> bool:
        """Whether ``word`` appears in the text as itself (case-insensitive).

        A Latin word must be a whole word and not shifted by the word before it ("the day *after*
        tomorrow" does not mention tomorrow, "*not* damaged" does not mention damaged). A single
        CJK character counts only where it cannot be the tail of a longer word: after a digit, a
        numeral or a non-CJK character (300元 and 三百元 mention 元, 日元 does not; 南京 does not
        mention 京).
        """
        if not word:
            return False
        folded = word.casefold()
        haystack = self.folded
        if re.fullmatch(r"[\w .\-']+", folded, flags=re.ASCII):
            pattern = rf"(?<![A-Za-z0-9]){re.escape(folded)}(?![A-Za-z0-9])"
            return any(not self.shifted(m.start()) for m in re.finditer(pattern, haystack))
        if len(folded) == 1 and _CJK_RUN.fullmatch(folded):
            return any(start == 0 or not _CJK_RUN.fullmatch(haystack[start - 1]) or haystack[start - 1] in _CJK_NUMERAL_CHARS
                       for start in _occurrences(haystack, folded))
        return folded in haystack

    @property
    def folded(self) -> str:
        """The text, case-folded."""
        return self._folded or self.text.casefold()

    def shifted(self, index: int) -> bool:
        """Whether the word starting at ``index`` follows one of :data:`SHIFTING_WORDS` (day *after* tomorrow)."""
        match = re.search(r"([A-Za-z']+)\W*$", self.folded[max(0, index - 24):index])
        return bool(match) and match.group(1) in SHIFTING_WORDS


def _occurrences(text: str, needle: str) -> Iterator[int]:
    start = text.find(needle)
    while start >= 0:
        yield start
        start = text.find(needle, start + 1)


def _stem(word: str) -> str:
    """``Tomorrow's`` → tomorrow, ``balances`` → balance: enough to compare words with stop words."""
    word = word.casefold().strip(".'")
    if word.endswith("'s"):
        word = word[:-2]
    if len(word) > 4 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return word


def _latin_spans(text: str, vocabulary: frozenset[str] = frozenset()) -> list[str]:
    """Word n-grams that neither start nor end on a stop word or a word of the tools' own vocabulary."""
    spans: list[str] = []
    words = list(_WORD.finditer(text))
    stop = _EN_STOP | vocabulary
    for start in range(len(words)):
        for end in range(start, min(start + MAX_SPAN_WORDS, len(words))):
            first, last = _stem(words[start].group()), _stem(words[end].group())
            if first in stop or last in stop:
                continue
            gap = text[words[start].end():words[end].start()] if end > start else ""
            if "\n" in gap or any(ch in gap for ch in ",;:!?()，。；：！？") or _CJK_RUN.search(gap):
                break
            if any(w.group().casefold() in _EN_ROLE_WORDS for w in words[start + 1:end]):
                break  # "checking to Bob" holds two values, not one
            spans.append(text[words[start].start():words[end].end()].rstrip(".'"))
    return spans


def _cjk_spans(text: str, boundary_words: Sequence[str]) -> list[str]:
    """Substrings of CJK runs, never crossing a function word, a tool's own vocabulary or a numeral."""
    words = sorted({w for w in (*CJK_FUNCTION_WORDS, *CJK_REQUEST_WORDS, *boundary_words) if w and _CJK_RUN.fullmatch(w)},
                   key=len, reverse=True)
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


_EN_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
_EN_TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if w != "_"}
_EN_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_EN_NUMBER = re.compile(r"(?<![A-Za-z])(?:(?:" + "|".join([*_EN_UNITS, *_EN_TENS, *_EN_SCALES, "a", "and"]) +
                        r")(?:[\s\-]+|(?![A-Za-z])))+", re.IGNORECASE)


def parse_english_number(words: str) -> float | None:
    """Parse number words (three, twelve, twenty-five, two thousand five hundred); None if not one.

    A lone "one" or "a" is no number: "one account to another" counts nothing.
    """
    tokens = [t for t in re.split(r"[\s\-]+", words.casefold().strip()) if t and t != "and"]
    if not tokens or tokens in (["one"], ["a"]) or tokens[-1] == "a":
        return None
    total = current = 0
    seen = False
    for token in tokens:
        if token in _EN_UNITS:
            current += _EN_UNITS[token]
        elif token in _EN_TENS:
            current += _EN_TENS[token]
        elif token == "a":
            current += 1
        elif token in _EN_SCALES:
            scale = _EN_SCALES[token]
            if scale == 100:
                current = (current or 1) * 100
            else:
                total += (current or 1) * scale
                current = 0
        else:
            return None
        seen = True
    return float(total + current) if seen else None


_CLOCK_EN = re.compile(r"(?<![\d:])(\d{1,2})(?::(\d{2}))?\s*([ap])\.?\s?m\b\.?", re.IGNORECASE)
_CLOCK_NUMERAL = "[零一二两三四五六七八九十]+|\\d{1,2}"
_CLOCK_ZH = re.compile(rf"(凌晨|早上|上午|中午|下午|傍晚|晚上)?\s*({_CLOCK_NUMERAL})\s*[点點时](半|(?:过)?({_CLOCK_NUMERAL})分?)?")


def clock_times(text: str) -> list[str]:
    """Clock times written in words or with a half-day, as ``HH:MM``: 3 pm → 15:00, 下午3点半 → 15:30."""
    found: list[str] = []
    for match in _CLOCK_EN.finditer(text):
        hour, minute = int(match.group(1)) % 12, int(match.group(2) or 0)
        hour += 12 if match.group(3).casefold() == "p" else 0
        found.append(f"{hour:02d}:{minute:02d}")
    for match in _CLOCK_ZH.finditer(text):
        raw = match.group(2)
        hour = int(raw) if raw.isdigit() else int(parse_chinese_number(raw) or -1)
        minute = 30 if match.group(3) == "半" else 0
        if match.group(4):
            minute = int(match.group(4)) if match.group(4).isdigit() else int(parse_chinese_number(match.group(4)) or 0)
        if match.group(1) in ("下午", "傍晚", "晚上") and hour < 12 or match.group(1) == "中午" and hour < 11:
            hour += 12
        if 0 <= hour < 24 and 0 <= minute < 60:
            found.append(f"{hour:02d}:{minute:02d}")
    return list(dict.fromkeys(found))


#: A duration: a number (digits, Chinese numeral or number words) and a unit of time.
_DURATION = re.compile(r"(\d+(?:\.\d+)?|[零一二两三四五六七八九十半]+|(?:[A-Za-z]+[\s\-]+)*?[A-Za-z]+)\s*(?:个)?(半)?\s*"
                       r"(小时|钟头|分钟|hours?|hrs?|minutes?|mins?)(?![A-Za-z])", re.IGNORECASE)
_MINUTES_PER = {"小时": 60, "钟头": 60, "分钟": 1, "hour": 60, "hours": 60, "hr": 60, "hrs": 60,
                "minute": 1, "minutes": 1, "min": 1, "mins": 1}


def durations(text: str) -> list[tuple[float, tuple[int, int]]]:
    """Durations in minutes with their spans: 两个小时 → 120, two hours → 120, 1.5 hours → 90, 45 分钟 → 45."""
    found = []
    for match in _DURATION.finditer(text):
        raw = match.group(1).strip()
        if re.fullmatch(r"\d+(?:\.\d+)?", raw):
            amount: float | None = float(raw)
        elif _CJK_RUN.fullmatch(raw):
            amount = 0.5 if raw == "半" else parse_chinese_number(raw)
        else:  # the longest tail of the words that reads as a number: "for two" → two
            words = raw.split()
            amount = next((v for i in range(len(words)) if (v := parse_english_number(" ".join(words[i:]))) is not None), None)
        if amount:
            minutes = (amount + (0.5 if match.group(2) else 0)) * _MINUTES_PER[match.group(3).casefold()]
            found.append((minutes, match.span()))
    return found


#: Units a numeric field can be in, by the words of its name and description, in minutes each.
_FIELD_UNITS = (("second", 1 / 60), ("minute", 1), ("hour", 60), ("秒", 1 / 60), ("分钟", 1), ("小时", 60))


def _field_unit(name: str, schema: Mapping[str, Any]) -> float | None:
    """Minutes per unit of a numeric field that measures time (``duration_minutes``), else None."""
    words = f"{name} {schema.get('description', '')} {schema.get('title', '')}".casefold()
    return next((per for unit, per in _FIELD_UNITS if unit in words), None)


def _numbers(text: str, *, words: bool = True) -> list[float]:
    """Numbers written in the text (digits, Chinese numerals and, with ``words``, English number
    words). Clock times and durations are not numbers (see :func:`clock_times`, :func:`durations`);
    neither is the article 一个 (订一个会议室), unless it counts people (一个人)."""
    found: list[float] = []
    for _, (start, end) in durations(text):
        text = text[:start] + " " * (end - start) + text[end:]
    text = re.sub(r"(?<![零〇一二两三四五六七八九十百千万\d])一个(?!人)", "  ", text)
    for clock in [*_CLOCK_EN.finditer(text), *_CLOCK_ZH.finditer(text)]:
        text = text[:clock.start()] + " " * len(clock.group()) + text[clock.end():]
    for match in _EN_NUMBER.finditer(text) if words else ():
        value = parse_english_number(match.group())
        if value is not None:
            found.append(value)
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
    spans += _latin_spans(text, frozenset(_stem(w) for w in boundary_words if not _CJK_RUN.search(w)))
    spans += _cjk_spans(text, boundary_words)
    spans = [span.strip() for span in spans if span.strip()]
    unique_spans = tuple(dict.fromkeys(spans))[:MAX_CANDIDATES]
    numbers = tuple(dict.fromkeys(_numbers(text)))
    minutes = tuple(dict.fromkeys(m for m, _ in durations(text)))
    return Evidence(text=text, spans=unique_spans, numbers=numbers, durations=minutes, _folded=text.casefold())


def _unanchored(pattern: str) -> str:
    core = pattern[1:] if pattern.startswith("^") else pattern
    if core.endswith("$") and not core.endswith("\\$"):
        core = core[:-1]
    return core


def typed_spans(schema: Mapping[str, Any], text: str) -> list[str] | None:
    """Spans of ``text`` shaped like the field's ``pattern`` or ``format``; None for an unshaped field.

    Matches never start or end inside a word, so ``BK-12`` is no candidate in ``BK-1234``. Clock
    times written in words (3 pm, 下午3点) count in the canonical form the shape accepts (15:00).
    """
    shapes = []
    if isinstance(schema.get("pattern"), str):
        shapes.append(_unanchored(schema["pattern"]))
    if isinstance(schema.get("format"), str) and schema["format"] in FORMAT_PATTERNS:
        shapes.append(FORMAT_PATTERNS[schema["format"]])
    if not shapes:
        return None
    found: list[str] = []
    for shape in shapes:
        try:
            regex = re.compile(rf"(?<![A-Za-z0-9_\-])(?:{shape})(?![A-Za-z0-9_])")
        except re.error:
            return None
        found += [m.group() for m in regex.finditer(text) if m.group()]
        found += [t for clock in clock_times(text) for t in (clock, clock.lstrip("0") or "0") if re.fullmatch(shape, t)]
    return list(dict.fromkeys(found))


#: Shapes of values that are never names: dates and times.
_SHAPED_VALUES = tuple(FORMAT_PATTERNS[key] for key in ("date", "time", "date-time"))


def is_name_like(span: str) -> bool:
    """Whether a span can fill a free name/text field: it holds no bare quantity (``500``, ``88.8``).

    Long digit strings (account numbers, phone numbers) stay: they identify, they do not count.
    """
    if any(re.fullmatch(shape, span) for shape in _SHAPED_VALUES):
        return False
    return not any(_QUANTITY_WORD.match(word) or any(re.fullmatch(shape, word) for shape in _SHAPED_VALUES)
                   for word in span.split())


def _as_number(value: float, integer: bool) -> int | float | None:
    if integer:
        return int(value) if float(value).is_integer() else None
    return int(value) if float(value).is_integer() else value


def _fits(candidate: Any, schema: Mapping[str, Any]) -> bool:
    plain = {k: v for k, v in schema.items() if not k.startswith("x-") and k not in ("default", "description", "title", "examples")}
    return not validation_errors(plain, candidate)


_MISSING = object()


def _narrow_field(schema: Mapping[str, Any], evidence: Evidence, grounded: bool, name: str = "") -> Any:
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
        unit = _field_unit(name, schema) if evidence.durations else None
        given = [*evidence.numbers, *(m / unit for m in evidence.durations)] if unit else evidence.numbers
        for number in given:
            candidate = _as_number(number, kind == "integer")
            if candidate is not None and _fits(candidate, schema):
                values.append(candidate)
        values = list(dict.fromkeys(values))
        return {**schema, "enum": values} if values else _MISSING
    if kind == "string":
        evidenced_aliases = {alias: canonical for alias, canonical in aliases.items() if evidence.mentions(alias)}
        canonical_hits = [c for c in dict.fromkeys(aliases.values()) if isinstance(c, str) and evidence.mentions(c)]
        candidates = [*evidenced_aliases.values(), *canonical_hits]
        typed = typed_spans(schema, evidence.text)
        if typed is not None:  # a shaped field (pattern, format): only spans of that shape
            candidates += [span for span in typed if _fits(span, schema)]
        else:  # a name-like field: spans that are not quantities
            candidates += [span for span in evidence.spans if is_name_like(span) and _fits(span, schema)]
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
    name_words = {word for name in properties for word in _name_words(name)}
    for name, sub in properties.items():
        narrowed = _narrow_field(sub, evidence, grounded, name)
        if narrowed is not _MISSING:
            new_properties[name] = _cued(name, narrowed, evidence.text, name_words) if narrowed is not sub else narrowed
            continue
        if isinstance(sub, Mapping) and "default" in sub:
            if name in required:
                new_properties[name] = {"enum": [sub["default"]]}
            else:
                continue  # the tool applies its default
        elif name in required:
            return _MISSING
        # an optional field with no evidence is left out of the grammar
    _release_shaped_values(properties, new_properties)
    narrowed_schema = {k: v for k, v in schema.items() if k not in ("properties", "required")}
    narrowed_schema["properties"] = new_properties
    if new_required:
        narrowed_schema["required"] = [name for name in new_required if name in new_properties]
    return narrowed_schema


#: Chinese words that play the role of a leading English field-name word (from_account → 从).
ROLE_CUES_ZH = {"from": ("从",), "to": ("给", "向", "到"), "with": ("和", "跟", "与", "同"), "title": ("主题是", "主题：", "主题:", "标题")}


def _release_shaped_values(properties: Mapping[str, Any], narrowed: dict[str, Any]) -> None:
    """A value a shaped sibling field takes (a phone number, an id) is no candidate for a free one."""
    shaped_values = set()
    for name, sub in properties.items():
        if isinstance(sub, Mapping) and (sub.get("pattern") or sub.get("format")) and name in narrowed:
            shaped_values.update(v for v in narrowed[name].get("enum") or () if isinstance(v, str))
    if not shaped_values:
        return
    for name, sub in properties.items():
        free = narrowed.get(name)
        if (isinstance(sub, Mapping) and not (sub.get("pattern") or sub.get("format") or "enum" in sub)
                and isinstance(free, dict) and isinstance(free.get("enum"), list) and free is not sub):
            kept = [v for v in free["enum"] if v not in shaped_values]
            if kept:
                narrowed[name] = {**free, "enum": kept}


def _name_words(name: str) -> list[str]:
    return [w for w in re.split(r"[_\W]+|(?<=[a-z])(?=[A-Z])", name.casefold()) if w]


def _cued(name: str, schema: Any, text: str, name_words: set[str]) -> Any:
    """A free text field narrowed to the spans its own name introduces (``to Bob``, ``title: x``).

    Each word of the field's name (``with_person`` → with, person) is a cue: the longest
    candidates starting right after it (past ``:``, "is" and words of the tool's field names)
    are kept, when there are any. Shaped, numeric and enum fields are left alone.
    """
    if not isinstance(schema, dict) or schema.get("type") != "string" or not isinstance(schema.get("enum"), list):
        return schema
    candidates = [c for c in schema["enum"] if isinstance(c, str)]
    aliases = schema.get("x-aliases") or {}
    if aliases or not candidates:
        return schema
    cued: list[str] = []
    skip = name_words | {"the", "my", "is", "a", "an"}
    words = _name_words(name)[:1]  # the leading word names the role: from_account, with_person, title
    patterns = [rf"(?<![A-Za-z0-9]){re.escape(w)}(?![A-Za-z0-9])" for w in words]
    patterns += [re.escape(c) for w in words for c in ROLE_CUES_ZH.get(w, ())]
    for pattern in patterns:
        for match in re.finditer(pattern, text, flags=re.IGNORECASE):
            rest = text[match.end():]
            while True:
                stripped = rest.lstrip(" :：\t")
                word = re.match(r"[A-Za-z]+", stripped)
                if word and word.group().casefold() in skip and stripped[word.end():word.end() + 1] in (" ", ":"):
                    rest = stripped[word.end():]
                    continue
                break
            starting = [c for c in candidates if stripped.startswith(c)]
            if starting:
                best = max(starting, key=len)
                cued.append(_labelled_value(best, stripped[len(best):], candidates) or best)
    cued = list(dict.fromkeys(cued))
    return {**schema, "enum": cued} if cued else schema


def _labelled_value(label: str, rest: str, candidates: Sequence[str]) -> str | None:
    """The identifier a CJK label introduces (从账户 6222021001: the account is the number, not 账户)."""
    if not _CJK_RUN.fullmatch(label):
        return None
    following = rest.lstrip(" :：\t")
    ids = [c for c in candidates if following.startswith(c) and re.fullmatch(r"[A-Za-z\-]*\d[\d\-]{4,}", c)]
    return max(ids, key=len) if ids else None


def is_grounded_tool(spec: ToolSpec, *, ground_all: bool = False) -> bool:
    """Whether any field of ``spec`` is subject to grounding (so its grammar is per request)."""
    text = json.dumps(spec.parameters)
    return ground_all or '"x-grounded": true' in text or '"x-enum-aliases"' in text


def tool_vocabulary(tools: Sequence[ToolSpec]) -> list[str]:
    """Words that describe the tools rather than fill their arguments: enum values and cues, field
    names, the Latin words of the descriptions and their CJK bigrams (查询城市天气 → 城市, 天气, ...)."""
    words: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, Mapping):
            for cues in (node.get("x-enum-aliases") or {}).values():
                words.extend(c for c in cues if isinstance(c, str))
            words.extend(c for c in node.get("x-cues") or () if isinstance(c, str))
            words.extend(str(v) for v in (node.get("enum") or []) if isinstance(v, str))
            description = node.get("description")
            if isinstance(description, str):
                words.extend(_bigrams(description))
                words.extend(_latin_words(description))
            for name in node.get("properties") or {}:
                words.extend(w for w in _name_words(name) if len(w) > 2)
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    for spec in tools:
        words.extend(_bigrams(spec.description))
        words.extend(_latin_words(spec.description))
        visit(spec.parameters)
    return list(dict.fromkeys(words))


def _latin_words(text: str) -> list[str]:
    """Latin words of a description worth a boundary: not stop words, at least three letters."""
    return [w for w in re.findall(r"[A-Za-z]{3,}", text) if w.casefold() not in _EN_STOP]


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
                 allow_drop: bool = True, evidence: Evidence | None = None, relevance: bool = True) -> GroundingResult:
    """Narrow every tool's parameter schema to the conversation; drop tools lacking required evidence.

    With ``allow_drop=False`` (a forced ``tool_choice``) a tool is never dropped: its fields
    without evidence are left as the spec declares them. With ``relevance`` (the default), tools
    also compete for the request (:func:`_shadowed` with cue words, :func:`_unacceptable`
    quantities); without it, only an offered tool whose closed values a dropped tool holds and
    more of is dropped (the ladder's ``counted`` rung).
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
    if allow_drop:
        competing = {**_unacceptable(tools, parameters, evidence), **_shadowed(tools, parameters, dropped, evidence)} \
            if relevance else _richer_dropped(tools, parameters, dropped, evidence)
        for name, reason in competing.items():
            parameters.pop(name, None)
            dropped[name] = reason
    return GroundingResult(parameters=parameters, dropped=dropped, evidence=evidence,
                           narrowed=narrowed_any or bool(dropped))


#: Words of tool names that say nothing about which tool is meant (generic verbs, function words).
_CUE_STOP = frozenset({"get", "set", "query", "look", "up", "fetch", "find", "check", "do", "make", "update", "change",
                       "by", "of", "for", "to", "and", "the", "a", "an", "my", "new", "info", "data", "tool"})


def _cue_words(spec: ToolSpec) -> set[str]:
    """The stems of the words of a tool's name (see :func:`tool_cues`)."""
    return {_stem(w) for w in _name_words(spec.name) if len(w) > 2 and w.isascii() and _stem(w) not in _CUE_STOP}


def tool_cues(tools: Sequence[ToolSpec]) -> dict[str, tuple[str, ...]]:
    """For each tool, the words that say a request is about it.

    A tool declares its cues as ``"x-cues": [...]`` on its parameter schema (any language: 天气,
    forecast, 下雨); besides those, the words of its name that no other tool of the request shares
    are cues (``refund_order`` next to ``get_order_status``: refund, not order). Descriptions are
    left out: their words (city, date, number) name arguments as often as intents.
    """
    stems = {spec.name: _cue_words(spec) for spec in tools}
    out: dict[str, tuple[str, ...]] = {}
    for spec in tools:
        others = set().union(*(words for name, words in stems.items() if name != spec.name))
        declared = [c for c in spec.parameters.get("x-cues") or () if isinstance(c, str) and c.strip()]
        out[spec.name] = tuple(dict.fromkeys([*declared, *sorted(stems[spec.name] - others)]))
    return out


def _cue_mentioned(cue: str, evidence: Evidence) -> bool:
    if _CJK_RUN.search(cue) or " " in cue:
        return evidence.mentions(cue)
    # a Latin cue is a stem: booking, books and booked mention "book"
    return any(_stem(w.group()).startswith(cue) and len(_stem(w.group())) <= len(cue) + 3 and not evidence.shifted(w.start())
               for w in re.finditer(r"[A-Za-z]+", evidence.text))


def relevance(tools: Sequence[ToolSpec], evidence: Evidence) -> dict[str, set[tuple[str, Any]]]:
    """What the conversation gives each tool: its closed values (:func:`intent_values`) and, when
    one of its cues (:func:`tool_cues`) is mentioned, the mark ``("cue", name)``."""
    cues = tool_cues(tools)
    out = {}
    for spec in tools:
        found = intent_values(spec, evidence)
        if any(_cue_mentioned(cue, evidence) for cue in cues[spec.name]):
            found.add(("cue", spec.name))
        out[spec.name] = found
    return out


def intent_values(spec: ToolSpec, evidence: Evidence) -> set[tuple[str, Any]]:
    """The closed values the conversation gives a tool, bounds ignored: shaped spans, enum values
    with a cue, aliases, numbers of the field's type. Free text is left out: every tool has some."""
    found: set[tuple[str, Any]] = set()
    for sub in (spec.parameters.get("properties") or {}).values():
        if not isinstance(sub, Mapping):
            continue
        shaped = typed_spans(sub, evidence.text) if sub.get("type") == "string" else None
        if shaped:
            found.update(("s", v) for v in shaped)
        cues = sub.get("x-enum-aliases") or {}
        for value in sub.get("enum") or ():
            if isinstance(value, str) and (cues or sub.get("x-grounded")) and (
                    evidence.mentions(value) or any(evidence.mentions(c) for c in cues.get(value, ()))):
                found.add(("e", value))
        found.update(("e", c) for a, c in (sub.get("x-aliases") or {}).items() if evidence.mentions(a))
        if sub.get("type") in ("integer", "number"):
            found.update(("n", v) for v in evidence.numbers if sub["type"] == "number" or float(v).is_integer())
    return found


def _shadowed(tools: Sequence[ToolSpec], parameters: Mapping[str, Any], dropped: Mapping[str, str],
              evidence: Evidence) -> dict[str, str]:
    """Offered tools whose evidence another tool holds and more of: the request is about that richer
    tool. "SO123 arrived broken, refund it" with no amount is a refund (dropped), not a status
    lookup; "Transfer money to Charlie" names transfer (dropped) and gives query_balance nothing but
    free text. An offered tool yields only to a richer offered one that the request names (a cue)
    while it does not name itself: without names, two actions on two ids stay two calls. A tool
    that declares cues (``x-cues``) and is not named, whose evidence another tool has just as well,
    is dropped too: "Cancel order SO565656" fits every order tool alike. Evidence is
    :func:`relevance`: closed values and cue mentions, never free text."""
    values = relevance(tools, evidence)
    declares = {spec.name for spec in tools if spec.parameters.get("x-cues")}
    out = {}
    for name in parameters:
        own = values.get(name, set())
        named = ("cue", name) in own
        for other in values:
            if other == name:
                continue
            if own < values[other] and (other in dropped or (("cue", other) in values[other] and not named)):
                why = "lacks a required value" if other in dropped else "is named"
                out[name] = f"the request says more than it uses: {other} fits it better ({other} {why})"
                break
            if own == values[other] and name in declares:
                out[name] = f"the request names none of its cues and {other} has the same evidence"
                break
    return out


def _richer_dropped(tools: Sequence[ToolSpec], parameters: Mapping[str, Any], dropped: Mapping[str, str],
                    evidence: Evidence) -> dict[str, str]:
    """Without relevance: offered tools whose closed values a dropped tool holds and more of."""
    values = {spec.name: intent_values(spec, evidence) for spec in tools}
    return {name: f"the request says more than it uses: {other} fits it better but lacks a required value"
            for name in parameters for other in dropped
            if values.get(name) and values[name] < values.get(other, set())}


def _quantities(evidence: Evidence) -> list[float]:
    """Numbers written in the conversation that count something (not ids: at most four integer digits)."""
    return [n for n in evidence.numbers if abs(n) < 10_000]


def _unacceptable(tools: Sequence[ToolSpec], parameters: Mapping[str, Any], evidence: Evidence) -> dict[str, str]:
    """Offered tools asked for a quantity no numeric field of theirs accepts ("for 300 minutes" where
    the duration stops at 240): a quantity that fits no numeric field of any tool of the request is
    a value the tools cannot take, not one to leave out (the model would fill in a default).
    Durations are judged against the fields that measure time, in their own unit."""
    fields = {spec.name: [(sub, _field_unit(name, sub)) for name, sub in (spec.parameters.get("properties") or {}).items()
                          if isinstance(sub, Mapping) and sub.get("type") in ("integer", "number") and "enum" not in sub]
              for spec in tools}

    def fits(sub: Mapping[str, Any], quantity: float) -> bool:
        value = _as_number(quantity, sub.get("type") == "integer")
        return value is not None and _fits(value, sub)

    asked = [(q, False) for q in _quantities(evidence)] + [(m, True) for m in evidence.durations]
    out = {}
    for quantity, in_minutes in asked:
        # a duration is judged by the fields that measure time, in their unit; a number by every numeric field
        takers = {tool: [(sub, quantity / unit if in_minutes else quantity) for sub, unit in subs if unit or not in_minutes]
                  for tool, subs in fields.items()}
        if any(fits(sub, value) for subs in takers.values() for sub, value in subs):
            continue
        for tool, subs in takers.items():
            if tool in parameters and subs:
                out[tool] = f"{quantity:g}{' minutes' if in_minutes else ''} is outside what its numeric fields accept"
    return out


def _narrow_keep_required(schema: Mapping[str, Any], evidence: Evidence, grounded: bool) -> dict[str, Any]:
    """Narrow what has evidence and leave the rest as declared (used when a tool must be called)."""
    out = copy.deepcopy(dict(schema))
    grounded = bool(schema.get("x-grounded", grounded))
    for name, sub in (schema.get("properties") or {}).items():
        narrowed = _narrow_field(sub, evidence, grounded)
        if narrowed is not _MISSING:
            out["properties"][name] = narrowed
    return out


# ------------------------------------------------------------------------------------------
# how many calls: one per distinct evidence set
# ------------------------------------------------------------------------------------------

#: Where one request's clauses part: punctuation, and conjunctions in Chinese and English.
_CLAUSE_SPLIT = re.compile(
    r"[，,；;、。！？!?\n]|(?<=[A-Za-z)])\.(?=\s|$)|\s+(?:and|or|also|then|plus|as well as)\s+"
    r"|以及|并且|然后|另外|还有|同时|和|与|及|再")
_PUNCTUATION = set("，,；;。！？!?\n.")


@dataclass(frozen=True)
class CallCount:
    """Bounds on the number of calls a request asks for, read from its evidence."""

    lower: int
    upper: int
    #: The clauses of each call group (for logs and tests).
    groups: tuple[tuple[str, ...], ...] = ()
    #: Per group, ``{tool: {field: values}}``: the tools that best cover the group's evidence and
    #: the strong values each gave a required field (used to narrow the group's call).
    slots: tuple[dict[str, dict[str, frozenset[Any]]], ...] = ()

    def positions(self, parameters: Mapping[str, Mapping[str, Any]]) -> list[list[tuple[str, dict[str, Any]]]]:
        """Per call position, ``(tool, parameters)`` narrowed to that group's strong values."""
        out = []
        for slot, clauses in zip(self.slots[:self.upper], self.groups):
            branches = []
            for tool, fields in slot.items():
                if tool not in parameters:
                    continue
                schema = copy.deepcopy(dict(parameters[tool]))
                text = "\n".join(clauses)
                for name, sub in schema.get("properties", {}).items():
                    if not isinstance(sub, dict) or not isinstance(sub.get("enum"), list):
                        continue
                    if name in fields:  # strong values this group gave the field
                        kept = [v for v in sub["enum"] if v in fields[name]]
                    elif sub.get("type") == "string" and not sub.get("x-aliases"):  # free text said in this group
                        kept = [v for v in sub["enum"] if isinstance(v, str) and v in text]
                    else:
                        kept = []
                    if kept:
                        sub["enum"] = kept
                        if sub.get("x-aliases"):
                            sub["x-aliases"] = {a: c for a, c in sub["x-aliases"].items() if c in kept}
                branches.append((tool, schema))
            if not branches:
                return []
            out.append(branches)
        return out


#: What a field filled by free text holds in a call group (no value to narrow it to).
_WEAK = object()


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user" and message.get("name") != FEEDBACK_NAME:
            return message_text(message)
    return ""


def _clauses(text: str) -> list[tuple[str, bool]]:
    """``(clause, after a conjunction)`` pairs; punctuation alone parts clauses of one action.

    The enumeration comma 、 joins like a conjunction (张伟、李秀英和王芳), and so do the commas
    of a list that ends in one ("Zhang Wei, Li Xiuying and Ouyang Nana": short items only).
    """
    out: list[list[Any]] = []
    position, conjunction, comma = 0, False, False
    for match in _CLAUSE_SPLIT.finditer(text):
        clause = text[position:match.start()].strip()
        if clause:
            out.append([clause, conjunction, comma])
            conjunction = comma = False
        separator = match.group().strip() or "\n"
        conjunction = conjunction or not set(separator) <= _PUNCTUATION
        comma = comma or separator in (",", "，")
        position = match.end()
    tail = text[position:].strip()
    if tail:
        out.append([tail, conjunction, comma])
    for start in range(len(out)):
        end = start
        while end < len(out) and out[end][2] and not out[end][1] and _short_item(out[end][0]):
            end += 1
        if end > start and end < len(out) and out[end][1] and _short_item(out[end][0]) \
                and (start == 0 or _parallel(out[start - 1][0], out[start][0])):
            for item in out[start:end]:
                item[1] = True
    return [(clause, conj) for clause, conj, _ in out]


def _parallel(before: str, item: str) -> bool:
    """Whether the words before a list's first comma end like its items begin: "for Zhang Wei, Li
    Xiuying and …" lists names; "Which is hotter today, Paris or Berlin" lists after a question."""
    last, first = re.findall(r"\w+", before)[-1:], re.findall(r"\w+", item)[:1]
    if not last or not first:
        return False
    if _CJK_RUN.match(last[0]) or _CJK_RUN.match(first[0]):
        return bool(_CJK_RUN.match(last[0])) == bool(_CJK_RUN.match(first[0]))
    return last[0][0].isupper() == first[0][0].isupper() and last[0][0].isdigit() == first[0][0].isdigit()


def _short_item(clause: str) -> bool:
    """A list item: a few words or characters, not a sentence."""
    return len(clause.split()) <= 3 and len(clause) <= 24


def _field_hits(schema: Mapping[str, Any], clause: str, shaped: bool, cues: Mapping[str, Sequence[str]] | None = None,
                aliases: Mapping[str, Any] | None = None) -> tuple[set[Any], bool]:
    """Values of one narrowed field that ``clause`` gives evidence for, and whether they are strong.

    Strong evidence is shaped or closed (a number, an enum value or cue, an alias, a pattern
    match); a free span of text is weak: every clause has some.
    """
    enum = schema.get("enum")
    if not isinstance(enum, list):
        return set(), False
    local = Evidence(text=clause, _folded=clause.casefold())
    if schema.get("type") in ("integer", "number"):
        numbers = set(_numbers(clause, words=False))
        hits = {v for v in enum if isinstance(v, (int, float)) and float(v) in numbers}
        if hits:
            return hits, True
        worded = set(_numbers(clause))  # "Three things: …" may count nothing: number words are weak
        return {v for v in enum if isinstance(v, (int, float)) and float(v) in worded}, False
    aliases = aliases or schema.get("x-aliases") or {}
    cues = cues or schema.get("x-enum-aliases") or {}
    strong, weak = set(), set()
    clocks = clock_times(clause) if shaped else ()
    for value in enum:
        if not isinstance(value, str):
            continue
        if any(local.mentions(a) for a, c in aliases.items() if c == value):
            strong.add(value)
        elif local.mentions(value) or any(local.mentions(c) for c in cues.get(value, ())):
            (strong if shaped or value in aliases.values() else weak).add(value)
        elif value in clocks:
            strong.add(value)
    return (strong, True) if strong else (weak, False)


def call_count(tools: Sequence[ToolSpec], parameters: Mapping[str, Mapping[str, Any]],
               messages: Sequence[Mapping[str, Any]], *, max_calls: int = 8) -> CallCount:
    """Bounds on how many calls the last user message asks for: one per distinct evidence set.

    The message is cut into clauses at punctuation and conjunctions. Clauses are read left to
    right and fill the required fields of one call group. A clause starts a new group when its
    strong evidence (numbers, enum values or cues, aliases, shaped values) fits no tool of the
    current group or gives a field the group already has another value, or when it follows a
    conjunction (和, 再, and, then) while some tool of the group is already complete. Free
    text after mere punctuation never starts a group ("…, please"). ``upper`` is the number
    of groups; ``lower`` the most distinct strong values one required field received.
    ``parameters`` are the request's narrowed schemas of the offered ``tools``.
    """
    shaped = {spec.name: {name for name, sub in (spec.parameters.get("properties") or {}).items()
                          if isinstance(sub, Mapping) and any(k in sub for k in ("enum", "const", "pattern", "format"))}
              for spec in tools}
    # narrowing keeps only the cues and aliases the whole text evidences; each clause needs all of them
    cues = {spec.name: {name: sub.get("x-enum-aliases") or {} for name, sub in (spec.parameters.get("properties") or {}).items()
                        if isinstance(sub, Mapping)} for spec in tools}
    aliases = {spec.name: {name: sub.get("x-aliases") or {} for name, sub in (spec.parameters.get("properties") or {}).items()
                           if isinstance(sub, Mapping)} for spec in tools}
    required = {tool: [f for f in (schema.get("required") or []) if f in (schema.get("properties") or {})]
                for tool, schema in parameters.items() if tool in shaped}
    groups: list[dict[str, Any]] = []
    distinct: dict[tuple[str, str], set[Any]] = {}
    for clause, after_conjunction in _clauses(_last_user_text(messages)):
        strong: dict[str, dict[str, set[Any]]] = {}
        weak: dict[str, set[str]] = {}
        for tool, fields in required.items():
            for name in fields:
                hits, is_strong = _field_hits(parameters[tool]["properties"][name], clause, name in shaped[tool],
                                              cues[tool].get(name), aliases[tool].get(name))
                if hits and is_strong:
                    strong.setdefault(tool, {})[name] = hits
                    distinct.setdefault((tool, name), set()).update(hits)
                elif hits:
                    weak.setdefault(tool, set()).add(name)
        if not strong and not weak:
            continue
        current = groups[-1] if groups else None
        if current is not None:
            complete = any(set(required[t]) <= set(current["filled"].get(t, {})) for t in current["tools"])
            live = (set(strong) & current["tools"]) if strong else (set(weak) & current["tools"])
            clash = not live or (bool(strong) and all(
                any(current["filled"].get(t, {}).get(n) not in (None, h) and _WEAK not in current["filled"][t][n]
                    for n, h in strong[t].items()) for t in live))
            if not strong and not after_conjunction:
                clash = False  # "…, please", "…, title: x": free text after a comma stays in its call
                live = live or current["tools"]
            if not clash and not (after_conjunction and complete):
                current["tools"] = live
                for t in live:
                    filled = current["filled"].setdefault(t, {})
                    filled.update(strong.get(t, {}))
                    for n in weak.get(t, ()):
                        filled.setdefault(n, {_WEAK})
                current["clauses"].append(clause)
                continue
        tools_here = set(strong) or set(weak)
        inherited = False
        if not strong and current is not None and set(weak) & current["tools"] and _is_bare_value(clause, parameters, weak):
            tools_here, inherited = set(weak) & current["tools"], True  # "London and Madrid": the same action again
        groups.append({"tools": tools_here, "clauses": [clause], "inherited": inherited,
                       "filled": {t: {**{n: {_WEAK} for n in weak.get(t, ())}, **strong.get(t, {})} for t in tools_here}})
    names = tool_cues(tools)
    for group in groups:  # "the status of SO1; …": a group that names some of its tools is about those
        said = Evidence(text="\n".join(group["clauses"]), _folded="\n".join(group["clauses"]).casefold())
        named = {t for t in group["tools"] if any(_cue_mentioned(cue, said) for cue in names.get(t, ()))}
        if named and named != group["tools"] and not group.get("inherited"):
            group["tools"] = named
    upper = max(1, min(len(groups), max_calls))
    lower = max(1, min(max([len(v) for v in distinct.values()] or [1]), upper))
    return CallCount(lower=lower, upper=upper, groups=tuple(tuple(g["clauses"]) for g in groups),
                     slots=tuple(_best_covered(group, required) for group in groups))


def _is_bare_value(clause: str, parameters: Mapping[str, Mapping[str, Any]], weak: Mapping[str, set[str]]) -> bool:
    """Whether a clause is nothing but one candidate value (``Madrid`` in "London and Madrid")."""
    folded = clause.strip(" .!?。？！").casefold()
    return any(isinstance(v, str) and v.casefold() == folded
               for tool, names in weak.items() for name in names
               for v in parameters[tool]["properties"][name].get("enum") or ())


def _best_covered(group: Mapping[str, Any], required: Mapping[str, list[str]]) -> dict[str, dict[str, frozenset[Any]]]:
    """The group's tools whose required fields it covers best (share filled, then strong values);
    all of them for a bare value that repeats the previous call's action."""
    def rank(tool: str) -> tuple[float, int]:
        filled = group["filled"].get(tool, {})
        share = len(set(required[tool]) & set(filled)) / max(1, len(required[tool]))
        strong = sum(1 for values in filled.values() if _WEAK not in values)
        return share, strong

    tools = sorted(group["tools"], key=rank, reverse=True)
    best = [t for t in tools if rank(t) == rank(tools[0]) or group.get("inherited")] if tools else []
    return {t: {n: frozenset(v) for n, v in group["filled"].get(t, {}).items() if _WEAK not in v} for t in best}
