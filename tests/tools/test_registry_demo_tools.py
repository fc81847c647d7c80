"""Built-in demo tools are offered only when ``TOOLRAIL_DEMO_TOOLS`` enables them."""

from __future__ import annotations

import pytest

from tools.registry import DEMO_TOOLS, ToolRegistrationError, demo_tools_from_settings, load_registry
from toolrail.settings import Settings


def test_unset_enables_none_and_the_default_setting_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLRAIL_DEMO_TOOLS", raising=False)
    assert Settings().demo_tools == ""
    assert demo_tools_from_settings("") == ()
    registry = load_registry(entry_points=False, demo_tools=demo_tools_from_settings(""))
    assert not set(DEMO_TOOLS) & set(registry.names())


def test_names_and_all_enable_exactly_those() -> None:
    assert demo_tools_from_settings("get_weather") == ("get_weather",)
    assert demo_tools_from_settings(" transfer , get_weather ") == ("get_weather", "transfer")
    assert demo_tools_from_settings("all") == DEMO_TOOLS
    registry = load_registry(entry_points=False, demo_tools=("get_weather",))
    assert "get_weather" in registry and "stress" not in registry and "transfer" not in registry


def test_an_unknown_name_is_refused_not_ignored() -> None:
    with pytest.raises(ToolRegistrationError, match="stres"):
        demo_tools_from_settings("get_weather,stres")
