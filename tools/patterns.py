"""Linear-time patterns for client-supplied schemas.

A client's JSON Schema ``pattern`` meets client text in validation and in the decider's grounding.
Python's ``re`` backtracks: ``^(a+)+$`` over 30 characters holds a worker for minutes. Everything
here runs on RE2 (``google-re2``), whose matching time is linear in the text, or on fixed,
non-backtracking code:

- :func:`compile_pattern` — an ECMA-262 pattern (the JSON Schema flavour) translated to RE2 and
  compiled once; patterns RE2 cannot express (backreferences, lookaround) raise
  :class:`~tools.errors.UnsupportedPatternError` naming the schema path;
- :func:`check_schema_patterns` — every ``pattern`` / ``patternProperties`` key of a schema, checked
  at the boundary ("compile before you match").

The validator that matches with them (and checks formats on fixed RE2 shapes) is
:mod:`tools.validator`.

Linear is not free: when RE2's DFA runs out of its memory budget it falls back to an NFA whose
cost per character grows with the compiled program (a 2,000-instruction pattern over 1 MB took
98 s on one core). So every match is charged ``characters x program size`` before it runs: one
check may spend at most :data:`MAX_MATCH_COST`, and the checks inside a :func:`match_budget`
block (one validation) share :data:`DEFAULT_VALIDATION_COST`. Over budget is a typed
:class:`~tools.errors.PatternBudgetError` (a validation error message inside the validator),
never a stall.

Patterns are unanchored: ``search`` semantics, as JSON Schema says. ``\\d``, ``\\w`` and ``\\b`` are
ASCII as in ECMA-262 (and in RE2); ``\\s`` and ``.`` are widened to ECMA-262's sets of whitespace
and line terminators; ``\\uXXXX`` and ``(?<name>…)`` are rewritten to RE2's spelling.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import re2

from tools.errors import PatternBudgetError, UnsupportedPatternError
from tools.schema_walk import pointer, subschemas

__all__ = [
    "DEFAULT_MAX_MATCHES",
    "DEFAULT_VALIDATION_COST",
    "MAX_MATCH_COST",
    "MAX_PATTERN_LENGTH",
    "MAX_PROGRAM_SIZE",
    "SafePattern",
    "check_schema_patterns",
    "compile_pattern",
    "match_budget",
]

#: Longest pattern accepted (characters); a schema pattern is a shape, not a program.
MAX_PATTERN_LENGTH = 4_096
#: Largest compiled RE2 program accepted (instructions).
MAX_PROGRAM_SIZE = 5_000
#: RE2 memory budget per pattern (bytes): bounds the program and the DFA cache of each cached pattern.
MAX_PATTERN_MEMORY = 2 << 20
#: Most work one match may cost, in characters x program instructions (worst case about 5e-8 s per
#: unit on one core when RE2 falls back to its NFA, so about half a second; usually far less).
MAX_MATCH_COST = 10_000_000
#: Work the checks inside one :func:`match_budget` block share (one validation of one value).
DEFAULT_VALIDATION_COST = 50_000_000
#: Matches :meth:`SafePattern.finditer` yields at most unless told otherwise.
DEFAULT_MAX_MATCHES = 1_000

# ECMA-262 WhiteSpace and LineTerminator code points, for ``\s`` (RE2's ``\s`` is [\t\n\f\r ]).
_ECMA_SPACE = (r"\t\n\v\f\r \x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}"
               r"\x{3000}\x{feff}")
# ECMA-262 ``.`` matches anything but a line terminator (RE2's ``.`` only excludes \n).
_ECMA_DOT = r"[^\n\r\x{2028}\x{2029}]"
_HEX = frozenset("0123456789abcdefABCDEF")


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is a typed error, not a line on stderr
    options.max_mem = MAX_PATTERN_MEMORY
    return options


class _Refused(Exception):
    """A pattern the translator refuses; the message is the reason a client reads."""


class _Budget:
    __slots__ = ("left",)

    def __init__(self, cost: int) -> None:
        self.left = cost


_BUDGET: ContextVar[_Budget | None] = ContextVar("toolrail_pattern_budget", default=None)


@contextmanager
def match_budget(cost: int = DEFAULT_VALIDATION_COST) -> Iterator[None]:
    """Let every pattern match inside the block share one budget of ``cost`` units of work."""
    token = _BUDGET.set(_Budget(cost))
    try:
        yield
    finally:
        _BUDGET.reset(token)


@dataclass(frozen=True)
class SafePattern:
    """A compiled, linear-time pattern. Build it with :func:`compile_pattern`; share it freely."""

    source: str
    """The pattern as the schema wrote it (ECMA-262)."""
    translated: str
    """The same pattern in RE2's syntax."""
    program_size: int
    """Instructions of the compiled program: the cost of one character in the worst case."""
    _regex: Any = field(repr=False, compare=False)

    @property
    def max_text_length(self) -> int:
        """The longest text one match may scan within :data:`MAX_MATCH_COST`."""
        return MAX_MATCH_COST // self.program_size

    def _charge(self, length: int) -> None:
        cost = max(1, length) * self.program_size
        if cost > MAX_MATCH_COST:
            raise PatternBudgetError(f"a text of {length} characters is longer than pattern {self.source[:100]!r} may "
                                     f"check (at most {self.max_text_length})", pattern=self.source, length=length,
                                     limit=self.max_text_length)
        budget = _BUDGET.get()
        if budget is not None:
            if cost > budget.left:
                raise PatternBudgetError(f"the pattern-matching budget of this check is spent (pattern "
                                         f"{self.source[:100]!r}, {length} characters)", pattern=self.source,
                                         length=length)
            budget.left -= cost

    def search(self, text: str) -> bool:
        """Whether the pattern matches anywhere in ``text`` (JSON Schema ``pattern`` semantics).

        Raises :class:`~tools.errors.PatternBudgetError` when the text is too long to check.
        """
        self._charge(len(text))
        return self._regex.search(text) is not None

    def fullmatch(self, text: str) -> bool:
        """Whether the pattern matches all of ``text`` (budget as :meth:`search`)."""
        self._charge(len(text))
        return self._regex.fullmatch(text) is not None

    def finditer(self, text: str, *, max_matches: int = DEFAULT_MAX_MATCHES) -> Iterator[tuple[int, int, str]]:
        """Non-overlapping matches as ``(start, end, matched_text)``, leftmost first, at most ``max_matches``.

        Each search for the next match is charged for the rest of the text; a scan that would
        overspend raises :class:`~tools.errors.PatternBudgetError` before it starts.
        """
        self._charge(len(text))
        for count, match in enumerate(self._regex.finditer(text)):
            if count >= max_matches:
                return
            yield match.start(), match.end(), match.group()
            if match.end() < len(text):
                self._charge(len(text) - match.end())


def compile_pattern(pattern: str, *, path: str = "") -> SafePattern:
    """``pattern`` (ECMA-262, as in JSON Schema) compiled for RE2, once per distinct pattern.

    Raises :class:`~tools.errors.UnsupportedPatternError` carrying ``path`` (the JSON pointer of the
    pattern in its schema) when RE2 cannot express the pattern or it is larger than the limits.
    """
    compiled = _compile(pattern)
    if isinstance(compiled, str):
        raise UnsupportedPatternError(path, pattern, compiled)
    return compiled


@lru_cache(maxsize=256)  # x MAX_PATTERN_MEMORY: at most 512 MiB of RE2 state however many patterns arrive
def _compile(pattern: str) -> SafePattern | str:
    """The compiled pattern, or the reason it is refused (cached either way)."""
    if not isinstance(pattern, str):
        return "a pattern must be a string"
    if len(pattern) > MAX_PATTERN_LENGTH:
        return f"pattern longer than {MAX_PATTERN_LENGTH} characters"
    try:
        translated = _translate(pattern)
    except _Refused as exc:
        return str(exc)
    try:
        regex = re2.compile(translated, _options())
    except re2.error as exc:
        message = exc.args[0] if exc.args else "invalid pattern"
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        return f"not a pattern RE2 can run: {message}"
    if regex.programsize > MAX_PROGRAM_SIZE:
        return f"pattern compiles to {regex.programsize} instructions (at most {MAX_PROGRAM_SIZE})"
    return SafePattern(pattern, translated, regex.programsize, regex)


# ----------------------------------------------------------------- ECMA-262 → RE2


def _translate(pattern: str) -> str:
    """Rewrite an ECMA-262 pattern in RE2's syntax; raise :class:`_Refused` for what RE2 lacks."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        char = pattern[i]
        if char == "\\":
            text, i = _escape(pattern, i, in_class)
            out.append(text)
            continue
        if in_class:
            if char == "]":
                in_class = False
            elif char == "[":
                char = r"\["  # a literal in ECMA-262; RE2 would read [[:alpha:]] as a POSIX class
            out.append(char)
        elif char == "[":
            if pattern.startswith("[^]", i):
                out.append(r"(?s:.)")  # ECMA-262: any character
                i += 3
                continue
            if pattern.startswith("[]", i):
                out.append(r"[^\x00-\x{10ffff}]")  # ECMA-262: no character
                i += 2
                continue
            in_class = True
            out.append("[")
            if pattern.startswith("[^", i):
                out.append("^")
                i += 1
        elif char == "(":
            if pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
                raise _Refused("lookaround assertions ((?=, (?!, (?<=, (?<!) need a backtracking engine")
            if pattern.startswith("(?<", i):
                out.append("(?P<")  # a named group: RE2 spells it (?P<name>
                i += 3
                continue
            out.append(char)
        elif char == ".":
            out.append(_ECMA_DOT)
        else:
            out.append(char)
        i += 1
    return "".join(out)


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """The RE2 spelling of the escape at ``pattern[i]`` and the index after it."""
    if i + 1 >= len(pattern):
        raise _Refused("the pattern ends with a lone backslash")
    kind = pattern[i + 1]
    if kind in "123456789":
        if in_class:
            raise _Refused(f"octal escape \\{kind} in a character class")
        raise _Refused(f"backreference \\{kind} needs a backtracking engine")
    if kind == "k" and pattern.startswith("<", i + 2):
        raise _Refused("named backreference \\k<…> needs a backtracking engine")
    if kind == "u":
        return _unicode_escape(pattern, i)
    if kind == "c" and i + 2 < len(pattern) and pattern[i + 2].isascii() and pattern[i + 2].isalpha():
        return f"\\x{{{ord(pattern[i + 2]) % 32:x}}}", i + 3
    if kind == "0" and not (i + 2 < len(pattern) and pattern[i + 2].isdigit()):
        return r"\x{0}", i + 2
    if kind == "s":
        return (_ECMA_SPACE if in_class else f"[{_ECMA_SPACE}]"), i + 2
    if kind == "S" and not in_class:
        return f"[^{_ECMA_SPACE}]", i + 2
    if kind == "/":
        return "/", i + 2
    return pattern[i:i + 2], i + 2  # \d \w \b \n \t \x41 \p{L} \. …: RE2 spells them alike or refuses them


def _unicode_escape(pattern: str, i: int) -> tuple[str, int]:
    """``\\uXXXX`` (with surrogate pairs) and ``\\u{X…}`` as RE2's ``\\x{…}``."""
    if pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 3)
        digits = pattern[i + 3:end] if end > 0 else ""
        if not digits or not set(digits) <= _HEX or int(digits, 16) > 0x10FFFF:
            raise _Refused(f"invalid escape {pattern[i:i + 12]!r}")
        return f"\\x{{{digits}}}", end + 1
    digits = pattern[i + 2:i + 6]
    if len(digits) != 4 or not set(digits) <= _HEX:
        raise _Refused(f"invalid escape {pattern[i:i + 6]!r} (\\u takes four hex digits)")
    code = int(digits, 16)
    end = i + 6
    if 0xD800 <= code <= 0xDBFF:
        low = pattern[end + 2:end + 6] if pattern.startswith("\\u", end) else ""
        if len(low) == 4 and set(low) <= _HEX and 0xDC00 <= int(low, 16) <= 0xDFFF:
            code = 0x10000 + ((code - 0xD800) << 10) + (int(low, 16) - 0xDC00)
            end += 6
        else:
            raise _Refused(f"lone surrogate {pattern[i:i + 6]!r} can match no text")
    elif 0xDC00 <= code <= 0xDFFF:
        raise _Refused(f"lone surrogate {pattern[i:i + 6]!r} can match no text")
    return f"\\x{{{code:x}}}", end


# ----------------------------------------------------------------- schema patterns


def check_schema_patterns(schema: Any, *, path: str = "") -> None:
    """Compile every pattern of ``schema``; raise :class:`UnsupportedPatternError` for the first refused.

    ``path`` prefixes the JSON pointers in errors (e.g. ``/tools/0/function/parameters``).
    """
    for where, node in subschemas(schema, path):
        if "pattern" in node:
            if not isinstance(node["pattern"], str):
                raise UnsupportedPatternError(pointer(where, "pattern"), repr(node["pattern"]), "a pattern must be a string")
            compile_pattern(node["pattern"], path=pointer(where, "pattern"))
        if isinstance(node.get("patternProperties"), Mapping):
            for key in node["patternProperties"]:
                compile_pattern(key, path=pointer(where, "patternProperties", key))
