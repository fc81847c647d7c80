"""Parsed Terraform for the tests in this directory (python-hcl2; no terraform binary needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tf_parse import Stack, load_stack  # noqa: E402


@pytest.fixture(scope="session")
def stack() -> Stack:
    return load_stack()
