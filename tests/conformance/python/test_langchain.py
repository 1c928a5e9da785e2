"""LangChain's `ChatOpenAI` (langchain-openai, pinned in requirements.txt)
against the live gateway: invoke, stream with usage, `bind_tools`, and
`with_structured_output` by JSON schema and by function calling, on chat
completions and on the Responses API (`use_responses_api=True`)."""

from typing import Literal

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field


class Weather(BaseModel):
    """Weather forecast for a city."""

    city: str = Field(description="the city")
    unit: Literal["celsius", "fahrenheit"]
    days: int


@tool
def get_time(timezone: str) -> str:
    """The current time in a timezone."""
    return "12:34"


@pytest.fixture(params=[False, True], ids=["chat", "responses"])
def llm(request, stack):
    def make(**kw):
        return ChatOpenAI(
            model="base",
            base_url=stack["base_url"],
            api_key=stack["api_key"],
            max_retries=0,
            timeout=30,
            use_responses_api=request.param,
            **kw,
        )

    return make


def test_invoke(llm):
    reply = llm().invoke("Hello. synthetic:reply_tokens=6")
    assert isinstance(reply, AIMessage)
    assert reply.text
    assert reply.usage_metadata["output_tokens"] == 6
    assert reply.usage_metadata["total_tokens"] == reply.usage_metadata["input_tokens"] + 6


def test_stream_with_usage(llm):
    chunks = list(llm(stream_usage=True).stream("Hi. synthetic:reply_tokens=9"))
    assert len(chunks) > 2
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    whole = chunks[0]
    for c in chunks[1:]:
        whole += c
    assert whole.text
    assert whole.usage_metadata["output_tokens"] == 9


def test_bind_tools_returns_a_tool_call_and_takes_its_result(llm):
    model = llm().bind_tools([get_time], tool_choice="get_time")
    question = HumanMessage("What time is it in Oslo? Use get_time.")
    first = model.invoke([question])
    assert len(first.tool_calls) == 1
    call = first.tool_calls[0]
    assert call["name"] == "get_time"
    assert isinstance(call["args"].get("timezone"), str)
    assert call["id"]
    # The tool's result goes back with LangChain's own message history.
    answer = llm().bind_tools([get_time]).invoke(
        [question, first, ToolMessage(content=get_time.invoke(call["args"]), tool_call_id=call["id"])]
    )
    assert answer.text
    assert not answer.tool_calls


def test_bind_tools_streamed_tool_call_chunks(llm):
    model = llm().bind_tools([get_time], tool_choice="required")
    whole = None
    for chunk in model.stream("Time in Tokyo? Use get_time."):
        whole = chunk if whole is None else whole + chunk
    assert [c["name"] for c in whole.tool_calls] == ["get_time"]
    assert isinstance(whole.tool_calls[0]["args"]["timezone"], str)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(llm, method):
    structured = llm().with_structured_output(Weather, method=method, strict=True)
    value = structured.invoke("Weather in Rome for 3 days, in celsius.")
    assert isinstance(value, Weather)
    assert value.unit in ("celsius", "fahrenheit")


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_include_raw(llm, method):
    structured = llm().with_structured_output(Weather, method=method, include_raw=True)
    out = structured.invoke("Weather in Lima for 2 days.")
    assert out["parsing_error"] is None
    assert isinstance(out["parsed"], Weather)
    assert isinstance(out["raw"], AIMessage)
