"""The backend contract suite on the embedded engine (tiny random model)."""

from __future__ import annotations

import pytest

from contract import *  # noqa: F401,F403
from decider_fixtures import tiny_decider, tiny_engine  # noqa: F401


@pytest.fixture(scope="module")
def contract_decider(tiny_decider):  # noqa: F811
    return tiny_decider
