"""Does the conversation state *this* value *for this field*? One field of a call, judged against one body of evidence.

The answer (:class:`Support`) is ``stated``, ``unclear`` (a person decides: the call waits for approval with
the reason) or ``absent`` (a grounding finding: re-asked, then review). What each kind of field needs:

- **a string**: the value occurs in the text as a whole word by Unicode's letters (:mod:`tools.evidence`), or an
  alias of it (``x-aliases``); a date (``format: date``/``date-time``) whose parts are stated or that a relative
  day names (``tomorrow`` against the request's day). A value with look-alike or invisible characters (a
  Cyrillic letter in a Latin word, fullwidth letters, zero-width or other format characters) is never stated.
- **a role** (``x-role: "source" | "destination"``, or inferred from a field named ``from``/``payer``/
  ``sender``… or ``to``/``payee``/``recipient``…): where the value occurs, the words around it say its role
  ("from alice", "to bob", "pay bob", "bob paid"; the language files' ``role_before``/``role_after``). Stated in
  the field's role: stated; only in the other role: absent ("from alice to bob" never states ``from=bob``);
  only without a role word: stated when the role is inferred from the name (as before), unclear when the
  schema declares it.
- **a number with a unit** (``x-unit``, :mod:`tools.amounts`): an amount stated in a compatible currency and
  converted to the field's scale ("5 dollars" is 500 in USD cents; "5,00 €" states nothing for a USD field);
  a number stated without a currency is stated for a field of major units and unclear for minor units (500
  what?); an amount two decimal conventions read as different values, both fitting the currency, is unclear.
- **a number without a unit**: stated without a currency; stated only with one ("12 euros") is unclear —
  the field says nothing about what 12 means.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any, Literal

import regex

from tools.amounts import field_unit
from tools.evidence import ConversationValues
from tools.languages import languages

__all__ = ["Field", "ROLES", "Support", "confusable", "date_supported", "field_role", "judge", "role_at", "unit_candidates"]

ROLES = ("source", "destination")
_OPPOSITE = {"source": "destination", "destination": "source"}
_SOURCE_NAMES = frozenset({"from", "payer", "sender", "source", "origin", "debtor", "debit", "drawer"})
_DESTINATION_NAMES = frozenset({"to", "payee", "recipient", "receiver", "destination", "target", "beneficiary",
                                "creditor", "credit", "dest"})
_NAME_PARTS = regex.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_SPACED = regex.compile(r"[\p{Latin}\p{Cyrillic}\p{Greek}]")
_DATE = regex.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?)?")
_TIME = regex.compile(r"^(\d{2}):(\d{2})(?::(\d{2}))?")


@dataclass(frozen=True)
class Support:
    state: Literal["stated", "unclear", "absent"]
    reason: str = ""


STATED = Support("stated")


@dataclass(frozen=True)
class Field:
    """A covered field of a tool: its pattern path, name, schema, the schema of its siblings, and whether it is
    grounded (an unsupported value is a finding) or only covered (free text: held for a person instead)."""

    pattern: str
    name: str
    leaf: Mapping[str, Any]
    siblings: Mapping[str, Any]
    grounded: bool


def field_role(name: str, leaf: Mapping[str, Any]) -> tuple[str | None, bool]:
    """The role a field's value plays and whether the schema declares it (``x-role``) or its name says it."""
    declared = leaf.get("x-role")
    if declared in ROLES:
        return declared, True
    if leaf.get("format") in ("date", "date-time", "time"):
        return None, False
    parts = {p.casefold() for p in _NAME_PARTS.findall(name)}
    source, destination = bool(parts & _SOURCE_NAMES), bool(parts & _DESTINATION_NAMES)
    return ("source" if source else "destination") if source != destination else None, False


def confusable(value: str) -> bool:
    """Look-alike or invisible characters: a format character (zero-width space/joiner, bidi control), a letter or
    digit that compatibility normalization changes (fullwidth ａ, ligatures), letters of two of Latin, Cyrillic and
    Greek in one word (Cyrillic а in "аlice")."""
    for char in value:
        if unicodedata.category(char) == "Cf":
            return True
        if char.isalnum() and unicodedata.normalize("NFKC", char) != char:
            folded = unicodedata.normalize("NFKC", char)
            if folded.isascii() or folded.isalnum():
                return True
    for word in regex.findall(r"[\p{L}\p{M}]+", value):
        scripts = sum(bool(regex.search(p, word)) for p in (r"\p{Latin}", r"\p{Cyrillic}", r"\p{Greek}"))
        if scripts > 1:
            return True
    return False


def _cue(text: str, cues: Mapping[str, str], *, at_end: bool) -> tuple[str, str] | None:
    """The longest cue word ``text`` ends (or starts) with, as a whole word: ``(cue, role)``."""
    for cue in sorted(cues, key=len, reverse=True):
        if at_end and text.endswith(cue):
            before = text[-len(cue) - 1:-len(cue)] if len(text) > len(cue) else ""
            if not (_SPACED.match(cue[0]) and before.isalnum()):
                return cue, cues[cue]
        if not at_end and text.startswith(cue):
            after = text[len(cue):len(cue) + 1]
            if not (_SPACED.match(cue[-1]) and after.isalnum()):
                return cue, cues[cue]
    return None


def role_at(text: str, start: int, end: int) -> tuple[str, str] | None:
    """The role the words around ``text[start:end]`` give it, and the cue: "from alice" → source, "pay bob",
    "to bob" → destination, "bob paid" → source. Up to four filler words ("the", "my", "account", "of") may stand
    between a cue before and the value."""
    for data in languages().values():
        before = text[:start]
        fillers = sorted(data.get("role_fillers", ()), key=len, reverse=True)
        for _ in range(5):
            before = before.rstrip(" ,:;")
            found = _cue(before, data.get("role_before", {}), at_end=True)
            if found:
                return found[1], f"{found[0]} {text[start:end]}"
            filler = next((f for f in fillers if before.endswith(f) and not (
                _SPACED.match(f[0]) and before[-len(f) - 1:-len(f)].isalnum())), None)
            if filler is None:
                break
            before = before[:-len(filler)]
        found = _cue(text[end:].lstrip(" ,"), data.get("role_after", {}), at_end=False)
        if found:
            return found[1], f"{text[start:end]} {found[0]}"
    return None


def date_supported(value: str, evidence: ConversationValues) -> bool:
    """An ISO date/time whose day is stated: written the same way, as numbers and month names, or as a day the
    text names relative to the request's (``tomorrow`` is one date); and whose time parts are stated."""
    found = _DATE.match(value)
    clock = _TIME.match(value[11:] if found else value)
    if found is None and clock is None:
        return False
    if found is not None and value[:10] not in evidence.text:
        year, month, day = (int(p) for p in found.groups()[:3])
        try:
            relative = date(year, month, day) in evidence.dates
        except ValueError:
            return False
        if not relative and not (evidence.has_number(year) or str(year) in evidence.text):
            return False
        if not relative and (not (evidence.has_number(month) or month in evidence.months) or not evidence.has_number(day)):
            return False
    if clock is None or clock.group(0)[:5] in evidence.text:
        return True
    hour, minute = int(clock.group(1)), int(clock.group(2))
    if hour and not (evidence.has_number(hour) or hour > 12 and evidence.has_number(hour - 12)):
        return False
    return minute == 0 or evidence.has_number(minute)


def _string(value: str, fld: Field, evidence: ConversationValues, call: Mapping[str, Any]) -> Support:
    if confusable(value):
        return Support("absent", f"{value!r} has look-alike or invisible characters; they never count as stated")
    spans = evidence.occurrences(value)
    aliases = fld.leaf.get("x-aliases")
    if isinstance(aliases, Mapping):
        spans += [span for alias, canonical in aliases.items() if canonical == value
                  for span in evidence.occurrences(str(alias))]
    if not spans:
        if fld.leaf.get("format") in ("date", "date-time", "time") and date_supported(value, evidence):
            return STATED
        if currency_field(fld) and any(value.upper() in amount.currencies for amount in evidence.amounts):
            return STATED
        return Support("absent")
    role, declared = field_role(fld.name, fld.leaf)
    if role is None:
        return STATED
    found = [role_at(evidence.text, start, end) for start, end in spans]
    roles = {r for r, _ in filter(None, found)}
    if role in roles:
        return STATED
    if _OPPOSITE[role] in roles:
        said = next(cue for r, cue in filter(None, found) if r == _OPPOSITE[role])
        return Support("absent", f"{value!r} is stated as the {_OPPOSITE[role]} ({said!r}), not as the {role} "
                                 f"that {fld.name} is")
    if declared:
        return Support("unclear", f"{value!r} is stated, but no word says it is the {role} ({fld.name})")
    return STATED


def currency_field(fld: Field) -> bool:
    if fld.name in ("currency", "currency_code"):
        return True
    return any(isinstance(s, Mapping) and isinstance(s.get("x-unit"), Mapping)
               and s["x-unit"].get("currency_field") == fld.name for s in fld.siblings.values())


def _number(value: float, fld: Field, evidence: ConversationValues, call: Mapping[str, Any]) -> Support:
    unit = field_unit(fld.name, fld.leaf, fld.siblings)
    currency = unit.currency_of(call) if unit else None
    number = Decimal(str(value))
    if unit is None or currency is None:
        if evidence.has_bare_number(value):
            return STATED
        said = [a for a in evidence.amounts if number in a.values]
        if said:
            return Support("unclear", f"{value!r} is stated as {said[0].said} {_name(said[0].currencies)}; "
                                      f"{fld.name} declares no currency (x-unit), so what it means is unclear")
        return Support("absent")
    matches = [a for a in evidence.amounts if currency in a.currencies
               and any(unit.in_field(v, currency) == number for v in a.values)]
    if any(len(a.values) == 1 for a in matches):
        return STATED
    if matches:
        return Support("unclear", f"{matches[0].said} {currency} can be read as more than one amount")
    if evidence.has_bare_number(value) or (unit.scale == "minor" and evidence.has_bare_number(
            float(number / unit.in_field(Decimal(1), currency)))):
        if unit.scale == "major":
            return STATED
        return Support("unclear", f"a number is stated without a currency; {fld.name} takes {unit.describe(call)}")
    others = [a for a in evidence.amounts if any(v in (number, number / unit.in_field(Decimal(1), currency))
                                                  for v in a.values)]
    if others:
        return Support("absent", f"{value!r} in {unit.describe(call)} is not what was stated "
                                 f"({others[0].said} {_name(others[0].currencies)})")
    return Support("absent")


def unit_candidates(leaf: Mapping[str, Any], evidence: ConversationValues) -> list[float] | None:
    """The numbers a field with a fixed-currency ``x-unit`` may take in this conversation: the stated amounts in
    its currency, in its scale (500 for "5 dollars" in USD cents), and the numbers said without a currency (a
    person decides those for a minor unit). None: the field has no such unit (the caller keeps its numbers)."""
    unit = field_unit("", leaf, {})
    if unit is None or unit.currency is None:
        return None
    found = {float(unit.in_field(v, unit.currency)) for a in evidence.amounts if unit.currency in a.currencies
             for v in a.values}
    return sorted(found | evidence.bare)


def _name(currencies: frozenset[str]) -> str:
    return next(iter(currencies)) if len(currencies) == 1 else "/".join(sorted(currencies)[:3]) + "…"


def judge(value: Any, fld: Field, evidence: ConversationValues, call: Mapping[str, Any]) -> Support:
    """Whether ``evidence`` states ``value`` for ``fld``; ``call``: the object holding the field (its siblings'
    values: a currency the call names)."""
    if isinstance(value, bool):
        words = [w for w in regex.split(r"[_\W]+", fld.name.casefold()) if len(w) >= 3]
        return STATED if any(evidence.has_text(w) for w in words) else Support("absent")
    if isinstance(value, (int, float)):
        return _number(float(value), fld, evidence, call)
    if isinstance(value, str):
        return _string(value, fld, evidence, call)
    return Support("absent")
