"""The public import surface, pinned: every module's ``__all__`` resolves, and no pinned name silently disappears.

A name that moved or went away on purpose is taken out of ``tests/data/public_surface.json`` in the same change;
``REDIS_URL=redis://127.0.0.1:1/0 python tests/test_public_surface.py --write`` (nothing connects) rewrites the file from the code (new names are added by it too).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from pathlib import Path

import pytest

PACKAGES = ("toolrail", "tools", "decider", "executor", "mcpbridge", "engine_build")
PINNED = Path(__file__).parent / "data" / "public_surface.json"
#: Modules that import only inside another runtime (Triton's Python backend provides triton_python_backend_utils).
OTHER_RUNTIME = {"engine_build.llmapi_model"}


def surface() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if info.name in OTHER_RUNTIME:
                continue
            module = importlib.import_module(info.name)
            names = getattr(module, "__all__", None)
            if names is not None:
                found[info.name] = sorted(names)
    return found


@pytest.fixture(scope="module")
def current() -> dict[str, list[str]]:
    return surface()


def test_every_exported_name_resolves(current: dict[str, list[str]]) -> None:
    missing = {module: [n for n in names if not hasattr(importlib.import_module(module), n)]
               for module, names in current.items()}
    assert not {m: n for m, n in missing.items() if n}, missing


def test_no_pinned_name_disappears(current: dict[str, list[str]]) -> None:
    pinned = json.loads(PINNED.read_text())
    gone = {module: sorted(set(names) - set(current.get(module, []))) for module, names in pinned.items()}
    assert not {m: n for m, n in gone.items() if n}, (
        f"names dropped from the public surface (update {PINNED.name} if on purpose): {gone}")


if __name__ == "__main__" and "--write" in sys.argv:
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # the checkout, not tests/ (tests/toolrail would shadow it)
    PINNED.write_text(json.dumps(surface(), indent=1, sort_keys=True) + "\n")
