"""langchain-openai's ``ChatOpenAI.bind_tools`` against toolrail, over Chat Completions and the Responses API."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("langchain_openai")


@pytest.fixture
def chat_model(base_url):
    from langchain_openai import ChatOpenAI

    return functools.partial(ChatOpenAI, model="toolrail", base_url=base_url, api_key="unused", max_retries=0,
                             timeout=120, max_tokens=60)


def save_note(title: str, pages: int) -> str:
    """Save a short note.

    Args:
        title: the note's title
        pages: how many pages
    """
    return "saved"


ASK = "Save a note titled groceries with 2 pages."


@pytest.mark.conformance("chat: bind_tools (invoke and stream)", "langchain-openai")
def test_bind_tools_over_chat_completions(chat_model):
    bound = chat_model().bind_tools([save_note], tool_choice="save_note", parallel_tool_calls=False)
    message = bound.invoke(ASK)
    (call,) = message.tool_calls
    assert call["name"] == "save_note" and set(call["args"]) == {"title", "pages"} and call["id"].startswith("call_")
    assert message.usage_metadata["input_tokens"] > 0
    chunks = list(bound.stream(ASK))
    merged = functools.reduce(lambda a, b: a + b, chunks)
    (streamed,) = merged.tool_calls
    assert streamed["name"] == "save_note" and streamed["id"].count("call_") == 1, streamed["id"]
    assert set(streamed["args"]) == {"title", "pages"}


@pytest.mark.conformance("responses: bind_tools with use_responses_api", "langchain-openai")
def test_bind_tools_over_the_responses_api(chat_model):
    bound = chat_model(use_responses_api=True).bind_tools([save_note], tool_choice="save_note",
                                                          parallel_tool_calls=False)
    message = bound.invoke(ASK)
    (call,) = message.tool_calls
    assert call["name"] == "save_note" and set(call["args"]) == {"title", "pages"}
    assert message.response_metadata["id"].startswith("resp_")
