"""A small check of the layout ``terraform fmt`` produces, for machines without Terraform.

It follows hclwrite's formatter (``hclwrite/format.go``) for the two rules that matter in review:

* indentation is two spaces per open bracket group, where a line that opens several brackets
  (``tags = merge(var.tags, {``) counts as one level and the line that closes them pops it;
* in a run of consecutive single-line attributes (``name = value`` whose value closes every
  bracket it opens), the ``=`` signs line up one space after the longest name.

Heredoc bodies are left alone, as ``terraform fmt`` leaves them. The checker reports problems;
it does not rewrite files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["FormatProblem", "check_hcl"]

_OPEN = "{[("
_CLOSE = "}])"
_HEREDOC = re.compile(r"<<(-?)([A-Za-z_][A-Za-z0-9_]*)\s*$")


@dataclass(frozen=True)
class FormatProblem:
    """One formatting problem at a 1-based line number."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class _Line:
    number: int
    text: str
    net_brackets: int = 0
    #: Column of the first assignment ``=`` at bracket depth 0 of the line, if the value after it
    #: is bracket-balanced (hclwrite's "assign cell"); else None.
    assign_col: int | None = None
    key_end: int = 0


def _scan(text: str, state: list[str]) -> tuple[int, list[tuple[int, int]]]:
    """Tokenize one line just enough: bracket changes and the columns of bare ``=`` tokens.

    ``state`` is a stack carried across lines: ``"str"`` inside a quoted string and ``"tpl"``
    inside a ``${ }`` / ``%{ }`` template interpolation within a string.
    Returns the net bracket change and ``(column, bracket_depth_before)`` of every bare ``=``.
    """
    net = 0
    equals: list[tuple[int, int]] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        in_string = bool(state) and state[-1] == "str"
        if in_string:
            if ch == "\\":
                i += 2
                continue
            if ch == '"':
                state.pop()
            elif ch in "$%" and i + 1 < n and text[i + 1] == "{":
                state.append("tpl")
                i += 2
                continue
            i += 1
            continue
        if ch == "#" or text.startswith("//", i):
            break
        if ch == '"':
            state.append("str")
        elif ch in _OPEN:
            if ch == "{":
                state.append("{")
            net += 1
        elif ch in _CLOSE:
            if ch == "}" and state and state[-1] == "tpl":
                state.pop()
                i += 1
                continue
            if ch == "}" and state and state[-1] == "{":
                state.pop()
            net -= 1
        elif ch == "=":
            prev = text[i - 1] if i else ""
            nxt = text[i + 1] if i + 1 < n else ""
            if nxt not in "=>" and prev not in "=!<>":
                equals.append((i, net))
        i += 1
    return net, equals


def check_hcl(source: str) -> list[FormatProblem]:
    """Formatting problems of one HCL file's text (``.tf`` or ``.tfvars``)."""
    problems: list[FormatProblem] = []
    if source and not source.endswith("\n"):
        problems.append(FormatProblem(source.count("\n") + 1, "file must end with a newline"))
    raw_lines = source.split("\n")
    lines: list[_Line | None] = []
    state: list[str] = []
    heredoc_end: str | None = None
    for number, text in enumerate(raw_lines, start=1):
        if heredoc_end is not None:
            if text.strip() == heredoc_end:
                heredoc_end = None
            lines.append(None)
            continue
        if "\t" in text:
            problems.append(FormatProblem(number, "tab character"))
        if text != text.rstrip():
            problems.append(FormatProblem(number, "trailing whitespace"))
        heredoc = _HEREDOC.search(text)
        line = _Line(number=number, text=text)
        was_in_string = bool(state) and state[-1] in ("str", "tpl")
        line.net_brackets, equals = _scan(text, state)
        if not was_in_string and equals:
            col, depth = equals[0]
            if text[:col].strip() and line.net_brackets - depth == 0 and not heredoc:
                line.assign_col = col
                line.key_end = len(text[:col].rstrip())
        lines.append(line)
        if heredoc:
            heredoc_end = heredoc.group(2)

    _check_indentation(lines, problems)
    _check_alignment(lines, problems)
    return problems


def _check_indentation(lines: list[_Line | None], problems: list[FormatProblem]) -> None:
    indents: list[int] = []
    for line in lines:
        if line is None or not line.text.strip():
            continue
        net = line.net_brackets
        if net < 0:
            closed = -net
            while closed > 0 and indents:
                if closed >= indents[-1]:
                    closed -= indents.pop()
                else:
                    indents[-1] -= closed
                    closed = 0
        expected = 2 * len(indents)
        actual = len(line.text) - len(line.text.lstrip(" "))
        if actual != expected:
            problems.append(FormatProblem(line.number, f"indent {actual}, expected {expected}"))
        if net > 0:
            indents.append(net)


def _check_alignment(lines: list[_Line | None], problems: list[FormatProblem]) -> None:
    chain: list[_Line] = []

    def close() -> None:
        if not chain:
            return
        width = max(item.key_end for item in chain)
        for item in chain:
            if item.assign_col != width + 1:
                problems.append(
                    FormatProblem(item.number, f"'=' at column {item.assign_col + 1}, expected {width + 2} (aligned)")
                )
        chain.clear()

    for line in lines:
        if line is None or line.assign_col is None:
            close()
            continue
        after = line.text[line.assign_col + 1 :]
        if after and not after.startswith(" ") or after.startswith("  "):
            problems.append(FormatProblem(line.number, "exactly one space after '='"))
        chain.append(line)
    close()
