"""``toolrail config docs | show``, described; what they do is ``toolrail.config_docs``, loaded only when one runs."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["DEFAULT_DOCS_PATH", "register"]

DEFAULT_DOCS_PATH = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def register(subparsers: argparse._SubParsersAction) -> None:
    config = subparsers.add_parser("config", help="the configuration reference and the settings in effect",
                                   description="Render the configuration reference, or show the settings in effect.")
    commands = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    docs = commands.add_parser("docs", help="write docs/configuration.md from Settings")
    docs.add_argument("--output", type=Path, default=DEFAULT_DOCS_PATH, help="file to write (- for stdout)")
    docs.add_argument("--check", action="store_true", help="write nothing; exit 1 when the file is out of date")
    docs.set_defaults(handler="toolrail.config_docs:docs")
    show = commands.add_parser("show", help="print every variable and the value in effect (secrets masked)")
    show.add_argument("--json", action="store_true", help="print one JSON object: variable → value")
    show.set_defaults(handler="toolrail.config_docs:show")
