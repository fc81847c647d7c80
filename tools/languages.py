"""The language data files (``tools/lang/*.json``): what the grounding code knows of each language, as data.

Number words and styles, month names, suffix multipliers (``k``, ``万``), relative days (tomorrow, 明天),
weekdays, colloquial currency words CLDR does not list (元, 块, bucks) and the words that give a name its
role in a payment (``role_before``: "from", "to", "pay"; ``role_after``: "paid"; ``role_fillers``: "the",
"account"). The code that reads them is language-agnostic; a language is a new file.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["LANG_DIR", "languages"]

LANG_DIR = Path(__file__).with_name("lang")


@cache
def languages() -> dict[str, dict[str, Any]]:
    """Every language data file, by its code (``en``, ``zh``, …)."""
    return {path.stem: json.loads(path.read_text("utf-8")) for path in sorted(LANG_DIR.glob("*.json"))}
