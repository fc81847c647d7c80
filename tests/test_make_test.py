"""`make test` runs the tests marked ``alone`` after the parallel run by collecting only the Makefile's
``ALONE_FILES``: that list must name exactly the files that hold such tests, or one would never run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_alone_files_name_every_file_with_a_test_marked_alone() -> None:
    listed = re.search(r"^ALONE_FILES := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert listed, "the Makefile has no ALONE_FILES"
    marked = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
              if re.search(r"pytest\.mark\.alone\b", path.read_text(encoding="utf-8"))}
    assert set(listed.group(1).split()) == marked
