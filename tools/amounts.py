"""Money in a conversation: amounts stated with a currency, and the unit a numeric field declares.

A side-effecting call's number is only what the user meant when it is the stated amount *in the field's
unit*: "5 dollars" is 500 in a field of US cents, never 5. A field declares its unit with ``x-unit``::

    {"x-unit": {"currency": "USD", "scale": "minor"}}            # cents of US dollars
    {"x-unit": {"currency": "EUR"}}                              # euros ("scale": "major", the default)
    {"x-unit": {"currency_field": "currency"}}                   # the currency is the call's sibling field

``scale`` is ``major`` (units of the currency) or ``minor`` (its smallest unit, by ISO 4217's exponent:
cents of USD or EUR, yen of JPY). A field with no ``x-unit`` takes its currency from a sibling field named
``currency`` / ``currency_code`` when its own name says money (``amount``, ``price``, ``total``, ``cost``,
``fee``, ``payment``; ``_cents``/``_minor`` in the name: the minor scale) — :func:`field_unit`.

The parsing is babel's (CLDR data), not patterns of our own: currency symbols, codes and names of every
currency that is legal tender today, in the locales of :data:`LOCALES` ("$", "US$", "CA$", "€", "¥",
"USD", "US dollars", "euros", "人民币"); locale-aware decimals ("5,00 €" is 5 in de/fr; "1,500 $" is 1500
in en; a reading with more decimals than the currency has is dropped). A name several currencies share
("dollars", "$", "¥") states each of them; the field's currency picks. Colloquial words CLDR does not list
(元, 块, 美金, bucks) come from the language files (``currency_words`` in ``tools/lang/*.json``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache, lru_cache
from typing import Any

import regex
from babel import Locale
from babel.core import get_global
from babel.numbers import NumberFormatError, get_currency_name, get_currency_precision, parse_decimal

from tools.languages import languages

__all__ = ["FieldUnit", "LOCALES", "StatedAmount", "currency_words", "field_unit", "find_amounts", "unit_errors"]

#: Locales whose currency symbols and names are read, and whose decimal conventions a number may follow.
LOCALES = ("en", "en_US", "en_GB", "en_CA", "en_AU", "en_IN", "zh", "zh_Hant", "ja", "de", "fr", "es", "es_MX",
           "it", "pt", "ru", "ko")
#: The decimal conventions tried on a number written with separators (1,234.5 / 1.234,5 / 1 234,5 / 1'234.5).
NUMBER_LOCALES = ("en", "de", "fr", "de_CH")
_SCALES = ("major", "minor")
_MONEY_NAMES = regex.compile(r"(?:^|_)(?:amount|price|total|cost|fee|payment)(?:_|$)|(?:amount|price|total|cost|fee)s?$",
                             regex.IGNORECASE)
_CURRENCY_SIBLINGS = ("currency", "currency_code")
#: A number as written: digits with group/decimal separators (after NFKC, a no-break space is a space).
_NUMBER = regex.compile(r"(?<![\p{Latin}\p{Cyrillic}\p{Greek}\p{N}_.,'’])\d{1,3}(?:[ ’']\d{3})+(?:[.,]\d+)?(?![\p{N}])"
                        r"|(?<![\p{Latin}\p{Cyrillic}\p{Greek}\p{N}_.,'’:/\-])\d+(?:[.,]\d+)*(?![\p{N}]|[.,]\d|[\-/:]\d)")


@dataclass(frozen=True)
class StatedAmount:
    """An amount the text states with a currency: its possible values (more than one when the decimal convention
    is unclear) and the currencies its unit may name (more than one for "$" or "dollars"). ``said``: as written."""

    values: frozenset[Decimal]
    currencies: frozenset[str]
    said: str


@dataclass(frozen=True)
class FieldUnit:
    """A numeric field's unit: a fixed currency or the sibling field that holds it, and the scale."""

    currency: str | None
    currency_field: str | None
    scale: str
    declared: bool

    def currency_of(self, call: Mapping[str, Any] | None) -> str | None:
        if self.currency is not None:
            return self.currency
        value = (call or {}).get(self.currency_field or "")
        return value.upper() if isinstance(value, str) else None

    def in_field(self, amount: Decimal, currency: str) -> Decimal:
        """``amount`` of ``currency`` written in this field's scale (500 for 5 USD in minor units)."""
        return amount * 10 ** get_currency_precision(currency) if self.scale == "minor" else amount

    def describe(self, call: Mapping[str, Any] | None) -> str:
        currency = self.currency_of(call) or f"the currency in {self.currency_field!r}"
        return f"{currency} ({'its minor unit' if self.scale == 'minor' else 'major units'})"


@cache
def _active_currencies() -> frozenset[str]:
    return frozenset(code for spans in get_global("territory_currencies").values()
                     for code, _start, end, tender in spans if end is None and tender)


@cache
def currency_words() -> dict[str, frozenset[str]]:
    """Every way :data:`LOCALES` write a current currency (casefolded) → the currencies it may name."""
    words: dict[str, set[str]] = {}
    active = _active_currencies()

    def add(word: str, code: str) -> None:
        word = word.casefold().strip()
        if word and not word.isdigit():
            words.setdefault(word, set()).add(code)

    for name in LOCALES:
        locale = Locale.parse(name)
        for code in active:
            add(code, code)
            symbol = locale.currency_symbols.get(code)
            if symbol:
                add(symbol, code)
            for count in (1, 2):
                label = get_currency_name(code, count=count, locale=locale)
                if label and label != code:
                    add(label, code)
                    head = label.split()[-1]
                    if len(label.split()) > 1 and head.isalpha():
                        add(head, code)  # "US dollars" → "dollars": every dollar
    for data in languages().values():
        for word, codes in data.get("currency_words", {}).items():
            for code in codes:
                add(word, code)
    return {word: frozenset(codes) for word, codes in words.items()}


_SCRIPTS_WITH_SPACES = regex.compile(r"[\p{Latin}\p{Cyrillic}\p{Greek}]")


def _bounded(text: str, start: int, end: int) -> bool:
    """No letter of a script that separates words with spaces continues the word on either side."""
    word = text[start:end]
    before = text[start - 1] if start else ""
    after = text[end] if end < len(text) else ""
    return not ((_SCRIPTS_WITH_SPACES.match(word[0]) and before.isalpha())
                or (_SCRIPTS_WITH_SPACES.match(word[-1]) and after.isalpha()))


def _currency_after(text: str, end: int) -> frozenset[str] | None:
    """The currencies the longest currency word starting at ``end`` (a space at most before it) names."""
    words, start = currency_words(), end + (text[end:end + 1] == " ")
    for stop in range(min(len(text), start + _longest()), start, -1):
        if text[start:stop] in words and _bounded(text, start, stop):
            return words[text[start:stop]]
    return None


def _currency_before(text: str, start: int) -> frozenset[str] | None:
    words, end = currency_words(), start - (text[start - 1:start] == " ")
    for begin in range(max(0, end - _longest()), end):
        if text[begin:end] in words and _bounded(text, begin, end):
            return words[text[begin:end]]
    return None


@cache
def _longest() -> int:
    return max(map(len, currency_words()))


def _readings(number: str, currencies: Iterable[str]) -> frozenset[Decimal]:
    """The values ``number`` may be, under each decimal convention, with no more decimals than the currency has."""
    if number.isdigit():
        return frozenset({Decimal(number)})
    return _readings_with(number, max((get_currency_precision(code) for code in currencies), default=2))


@lru_cache(maxsize=4096)
def _readings_with(number: str, places: int) -> frozenset[Decimal]:
    found = set()
    for name, point in zip(NUMBER_LOCALES, (".", ",", ",", ".")):
        written = number.replace(" ", "\u202f") if name == "fr" else number.replace("'", "’") if name == "de_CH" else number
        try:
            value = parse_decimal(written, locale=name, strict=True)
        except (NumberFormatError, InvalidOperation):
            continue
        decimals = len(number.rsplit(point, 1)[1]) if point in number else 0
        if decimals <= places and (decimals or value == value.to_integral_value()):
            found.add(value.normalize())
    return frozenset(found)


def find_amounts(text: str, spans: Iterable[tuple[int, int, float]], multipliers: Mapping[str, float] | None = None,
                 ) -> tuple[list[StatedAmount], set[tuple[int, int]]]:
    """The amounts ``text`` (normalized) states with a currency, and the spans of the numbers they use.

    ``spans``: numbers written in words or characters (``(start, end, value)``, from :mod:`tools.evidence`);
    digits are read here. A number is an amount when a currency word touches it (a space at most between):
    "$5", "5 USD", "five dollars", "5,00 €", "500元", "$2k" (``multipliers``: the language files' suffixes)."""
    multipliers = multipliers or {}
    numbers: list[tuple[int, int, str | float]] = [(m.start(), m.end(), m.group()) for m in _NUMBER.finditer(text)]
    digits = bytearray(len(text) + 1)  # where digits are written, and the character right after (3万: a suffix)
    for start, end, _ in numbers:
        digits[start:end + 1] = b"\x01" * (end + 1 - start)
    numbers += [span for span in spans if not digits[span[0]]]
    amounts, used = [], set()
    for start, end, number in numbers:
        factor, suffix = _multiplier(text, end, multipliers)
        touching = [codes for codes in (_currency_after(text, end + suffix), _currency_before(text, start)) if codes]
        if not touching:
            continue
        codes = frozenset().union(*touching)
        values = _readings(number, codes) if isinstance(number, str) else frozenset({Decimal(str(number))})
        if values:
            amounts.append(StatedAmount(values=frozenset(v * factor for v in values), currencies=codes,
                                        said=text[start:end + suffix]))
            used.add((start, end))
    return amounts, used


def _multiplier(text: str, end: int, multipliers: Mapping[str, float]) -> tuple[Decimal, int]:
    """A suffix multiplier right after a number ("5k", "3万"): its factor and length (1 and 0 when none)."""
    for suffix, factor in sorted(multipliers.items(), key=lambda item: -len(item[0])):
        stop = end + len(suffix)
        if text[end:stop] == suffix and not (suffix.isascii() and text[stop:stop + 1].isalpha()):
            return Decimal(str(factor)), len(suffix)
    return Decimal(1), 0


def field_unit(name: str, leaf: Mapping[str, Any], siblings: Mapping[str, Any]) -> FieldUnit | None:
    """The unit of a numeric field: its ``x-unit``, or a currency sibling's when its name says money."""
    declared = leaf.get("x-unit")
    if isinstance(declared, Mapping):
        currency = declared.get("currency")
        return FieldUnit(currency=currency.upper() if isinstance(currency, str) else None,
                         currency_field=declared.get("currency_field"), scale=str(declared.get("scale", "major")),
                         declared=True)
    sibling = next((s for s in _CURRENCY_SIBLINGS if s in siblings and s != name), None)
    if sibling is None or not _MONEY_NAMES.search(name):
        return None
    minor = regex.search(r"(?:^|_)(?:cents|minor)(?:_|$)", name, regex.IGNORECASE) is not None
    return FieldUnit(currency=None, currency_field=sibling, scale="minor" if minor else "major", declared=False)


def unit_errors(path: str, leaf: Mapping[str, Any], siblings: Mapping[str, Any]) -> list[str]:
    """Problems with one field's ``x-unit`` (checked when a tool is registered)."""
    declared = leaf.get("x-unit")
    if declared is None:
        return []
    if not isinstance(declared, Mapping) or set(declared) - {"currency", "currency_field", "scale"}:
        return [f"{path}: x-unit must be an object with currency or currency_field, and scale"]
    errors = []
    currency, field = declared.get("currency"), declared.get("currency_field")
    if (currency is None) == (field is None):
        errors.append(f"{path}: x-unit needs exactly one of currency and currency_field")
    if currency is not None and (not isinstance(currency, str) or currency.upper() not in _active_currencies()):
        errors.append(f"{path}: x-unit currency {currency!r} is not an ISO 4217 code in use")
    if field is not None and field not in siblings:
        errors.append(f"{path}: x-unit currency_field {field!r} is not a field next to it")
    if declared.get("scale", "major") not in _SCALES:
        errors.append(f"{path}: x-unit scale must be one of {', '.join(_SCALES)}")
    return errors
