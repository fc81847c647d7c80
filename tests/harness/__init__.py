"""The tests' one harness: the session's stack as fixtures (``fixtures``, a pytest plugin loaded by the root
conftest) and the helpers test modules import by name (``jobs``, ``processes``, ``databases``, ``serving``).

Helpers are imported as ``from tests.harness.jobs import wait_terminal`` — never ``from conftest import``, which
names whichever conftest was imported last (a subset run failed with an ImportError, a full run built the
executor's session fixtures twice: two worker pools with one hostname).
"""
