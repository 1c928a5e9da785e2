"""The same SDK checks against both real engines, so the two cannot drift:
`llama` (llama.cpp in the worker) and `upstream` (a worker in front of
llama.cpp's own llama-server), each serving `base` with SmolLM2.

SmolLM2 is weak: the checks are on structure, not on content. Each engine
gets its own stack (`stack --engine ...`) for the module.
"""

import json

import openai
import pytest
from openai import OpenAI

from conftest import start_stack

ENGINES = ["llama", "upstream"]


@pytest.fixture(scope="module", params=ENGINES)
def real(request):
    with start_stack(["--engine", request.param]) as info:
        yield OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)


def test_chat_shape_and_usage(real):
    reply = real.chat.completions.create(
        model="base",
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        max_tokens=16,
        temperature=0,
    )
    assert reply.object == "chat.completion"
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 5
    assert 1 <= reply.usage.completion_tokens <= 16
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens is not None


def test_stream_with_usage(real):
    stream = real.chat.completions.create(
        model="base",
        messages=[{"role": "user", "content": "Name three colors."}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    roles, text, finish, usage = 0, "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for c in chunk.choices:
            roles += c.delta.role is not None
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert roles == 1
    assert text.strip()
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens >= 1


def test_max_tokens_gives_length(real):
    reply = real.chat.completions.create(
        model="base",
        messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
        max_tokens=4,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 4


def test_json_schema_reply_parses(real):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    reply = real.chat.completions.create(
        model="base",
        messages=[{"role": "user", "content": "The weather in a city, as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": True}},
    )
    value = json.loads(reply.choices[0].message.content)
    assert set(value) == {"city", "sunny"}
    assert isinstance(value["sunny"], bool)


def test_required_tool_call(real):
    reply = real.chat.completions.create(
        model="base",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[{"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                           "required": ["city"], "additionalProperties": False},
        }}],
        tool_choice="required",
        # One call: an open array of calls may run to max_tokens.
        parallel_tool_calls=False,
        max_tokens=120,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_context_overflow_is_the_same_400(real):
    with pytest.raises(openai.BadRequestError) as e:
        real.chat.completions.create(
            model="base",
            messages=[{"role": "user", "content": "apple banana cherry " * 400}],
            max_tokens=16,
        )
    err = e.value.body
    assert err["code"] == "context_length_exceeded"
    assert "maximum context length is 1024 tokens" in err["message"]
