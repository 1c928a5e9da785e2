"""The `openai` SDK's helpers, unchanged, against the live gateway: stream
accumulation of tool calls, `chat.completions.parse` and `responses.parse`
with Pydantic models (the SDK builds strict JSON Schemas with `$defs`,
`additionalProperties: false` and every property required)."""

import json
from typing import List, Literal, Optional

import openai
from pydantic import BaseModel


class Weather(BaseModel):
    """Weather forecast for a city."""

    city: str
    unit: Literal["celsius", "fahrenheit"]
    days: int


class LocalTime(BaseModel):
    timezone: str
    hour24: bool


class Author(BaseModel):
    name: str
    born: Optional[int]


class Book(BaseModel):
    title: str
    year: int
    rating: float
    tags: List[str]
    author: Author
    co_authors: List[Author]


def test_stream_helper_accumulates_parallel_tool_calls(client):
    tools = [
        openai.pydantic_function_tool(Weather, name="get_weather"),
        openai.pydantic_function_tool(LocalTime, name="get_time"),
    ]
    with client.chat.completions.stream(
        model="base",
        messages=[{"role": "user", "content": "Use get_time in Oslo and get_weather in Rome."}],
        tools=tools,
    ) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    # The role chunk carries content "" (wire-conventions), so the helper
    # accumulates "" rather than None: no text either way.
    assert not choice.message.content
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_time", "get_weather"]
    assert len({c.id for c in calls}) == 2
    assert all(c.id.startswith("call_") and c.id.count("call_") == 1 for c in calls)
    # Strict tools: the helper parsed the accumulated arguments.
    assert isinstance(calls[0].function.parsed_arguments, LocalTime)
    assert isinstance(calls[1].function.parsed_arguments, Weather)
    assert [e.name for e in done] == ["get_time", "get_weather"]
    for e, c in zip(done, calls):
        assert e.arguments == c.function.arguments
        json.loads(e.arguments)


def test_stream_helper_tool_round_trip(client):
    tools = [openai.pydantic_function_tool(LocalTime, name="get_time")]
    messages = [{"role": "user", "content": "What time is it? Use get_time."}]
    with client.chat.completions.stream(model="base-mini", messages=messages, tools=tools) as s:
        first = s.get_final_completion()
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True, exclude={"parsed"}))
    # The SDK's own dump of the assistant message must be accepted back.
    for tc in messages[-1]["tool_calls"]:
        tc["function"].pop("parsed_arguments", None)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "12:34"})
    with client.chat.completions.stream(model="base-mini", messages=messages, tools=tools) as s:
        text = "".join(e.delta for e in s if e.type == "content.delta")
        final = s.get_final_completion()
    assert final.choices[0].finish_reason == "stop"
    assert "12:34" in text
    assert final.choices[0].message.content == text


def test_chat_parse_with_a_pydantic_model(client):
    for model in ["base", "base-mini", "base-ultra"]:
        completion = client.chat.completions.parse(
            model=model,
            messages=[{"role": "user", "content": "Describe a book."}],
            response_format=Book,
        )
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "stop"
        assert isinstance(message.parsed, Book)
        assert message.parsed == Book.model_validate_json(message.content)


def test_chat_parse_with_reasoning(client):
    completion = client.chat.completions.parse(
        model="base",
        messages=[{"role": "user", "content": "Describe a book."}],
        response_format=Book,
        reasoning_effort="low",
    )
    assert isinstance(completion.choices[0].message.parsed, Book)
    details = completion.usage.completion_tokens_details
    assert details.reasoning_tokens > 0


def test_chat_stream_helper_with_response_format(client):
    with client.chat.completions.stream(
        model="base",
        messages=[{"role": "user", "content": "Describe a book."}],
        response_format=Book,
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Book)


def test_responses_parse_with_a_pydantic_model(client):
    response = client.responses.parse(
        model="base",
        input="Describe a book.",
        text_format=Book,
    )
    assert response.status == "completed"
    assert isinstance(response.output_parsed, Book)
    assert response.output_parsed == Book.model_validate_json(response.output_text)


def test_responses_parse_with_function_tools(client):
    response = client.responses.parse(
        model="base",
        input="Use get_weather for Paris.",
        tools=[openai.pydantic_function_tool(Weather, name="get_weather")],
        reasoning={"effort": "low"},
    )
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "function_call"]
    call = response.output[1]
    assert call.name == "get_weather"
    assert isinstance(call.parsed_arguments, Weather)
    assert response.usage.output_tokens_details.reasoning_tokens > 0

    follow = client.responses.create(
        model="base",
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24C"}],
        tools=[openai.pydantic_function_tool(Weather, name="get_weather")],
    )
    assert follow.status == "completed"
    assert "sunny, 24C" in follow.output_text


def test_responses_stream_helper(client):
    with client.responses.stream(
        model="base",
        input="Describe a book.",
        text_format=Book,
        reasoning={"effort": "minimal"},
    ) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_response()
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    assert "response.reasoning_summary_text.delta" in types
    assert isinstance(final.output_parsed, Book)
