"""A tool that reports which of a few heavy modules its process holds: what its fork server imported.

It imports nothing itself, so what it sees is the image of the fork server it was forked from.
"""

from __future__ import annotations

import sys
from typing import Any

#: The modules a test asks about: the ledger's (redis-py, OpenTelemetry through it) and the built-in tools'.
WATCHED = ("opentelemetry", "pydantic", "redis", "tools.builtin", "tools.ledger")


def loaded_modules() -> dict[str, Any]:
    """The watched modules present in this tool process, sorted."""
    return {"loaded": sorted(name for name in WATCHED if name in sys.modules)}
