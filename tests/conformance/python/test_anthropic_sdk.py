"""The official `anthropic` SDK against the gateway's Messages API.

`messages.create`, the stream helper, a tool round trip (streamed and
not), a stop sequence named in the reply (streamed and not),
`count_tokens`, the Anthropic model list, and the SDK's error classes,
against one stack with a models-only key and a key on a
1-request-per-minute plan.
"""

import hashlib
import secrets

import anthropic
import pytest
from anthropic import Anthropic

from conftest import start_stack

TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def stack():
    keys = {
        "models_only": "sk-models-" + secrets.token_hex(8),
        "limited": "sk-limited-" + secrets.token_hex(8),
    }
    extra = f"""
[[keys]]
sha256 = "{_sha(keys['models_only'])}"
org = "org-a"
name = "models-only"
scopes = ["models.read"]

[[keys]]
sha256 = "{_sha(keys['limited'])}"
org = "org-limited"
name = "limited"
plan = "one-rpm"

[plans.one-rpm]
rpm = 1
"""
    with start_stack(["--models", "base", "--extra-toml", extra]) as info:
        info["keys"] = keys
        yield info


def _client(stack, key=None) -> Anthropic:
    origin = stack["base_url"].removesuffix("/v1")
    return Anthropic(base_url=origin, api_key=key or stack["api_key"], max_retries=0)


def test_create_has_the_message_shape(stack):
    m = _client(stack).messages.create(
        model="base",
        max_tokens=64,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello. synthetic:reply_tokens=7"}],
    )
    assert m.id.startswith("msg_")
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason == "end_turn"
    assert m.usage.output_tokens == 7
    assert m.usage.input_tokens > 0
    assert m.usage.cache_creation_input_tokens == 0


def test_the_stream_helper_accumulates_the_reply(stack):
    with _client(stack).messages.stream(
        model="base",
        max_tokens=64,
        messages=[{"role": "user", "content": "Stream. synthetic:reply_tokens=9"}],
    ) as s:
        text = "".join(s.text_stream)
        m = s.get_final_message()
    assert text and m.content[0].text == text
    assert m.stop_reason == "end_turn"
    assert m.usage.output_tokens == 9


@pytest.mark.parametrize("streamed", [False, True])
def test_a_tool_round_trip(stack, streamed):
    client = _client(stack)
    messages = [{"role": "user", "content": "Weather in Paris? Use get_weather."}]

    def turn():
        if not streamed:
            return client.messages.create(model="base", max_tokens=200, tools=TOOLS, messages=messages)
        with client.messages.stream(model="base", max_tokens=200, tools=TOOLS, messages=messages) as s:
            return s.get_final_message()

    m = turn()
    assert m.stop_reason == "tool_use"
    call = next(c for c in m.content if c.type == "tool_use")
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    assert isinstance(call.input["city"], str)
    messages += [
        {"role": "assistant", "content": [c.model_dump(exclude_none=True) for c in m.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}],
        },
    ]
    m = turn()
    assert m.stop_reason == "end_turn"
    assert m.content[0].type == "text"


@pytest.mark.parametrize("streamed", [False, True])
def test_a_stop_sequence_is_named(stack, streamed):
    body = dict(
        model="base",
        max_tokens=64,
        stop_sequences=["NEVER", "HALT"],
        extra_body={"top_k": 5},
        messages=[{"role": "user", "content": "alpha beta HALT gamma synthetic:echo"}],
    )
    client = _client(stack)
    if streamed:
        with client.messages.stream(**body) as s:
            m = s.get_final_message()
    else:
        m = client.messages.create(**body)
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "HALT")
    assert m.content[0].text == "alpha beta "


def test_count_tokens_matches_the_billed_prompt(stack):
    client = _client(stack)
    body = dict(
        model="base",
        tools=TOOLS,
        messages=[{"role": "user", "content": "Count me. synthetic:reply_tokens=2"}],
    )
    counted = client.messages.count_tokens(**body).input_tokens
    m = client.messages.create(max_tokens=16, **body)
    u = m.usage
    assert counted == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens


def test_the_model_list_has_the_windows(stack):
    models = list(_client(stack).models.list())
    assert any(m.id == "base" for m in models)
    assert all(m.type == "model" and m.max_input_tokens for m in models)


def test_errors_raise_the_sdks_classes(stack):
    client = _client(stack)
    hello = [{"role": "user", "content": "hi synthetic:reply_tokens=1"}]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="base", max_tokens=0, messages=hello)
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.AuthenticationError):
        _client(stack, "sk-wrong").messages.create(model="base", max_tokens=8, messages=hello)
    with pytest.raises(anthropic.PermissionDeniedError):
        _client(stack, stack["keys"]["models_only"]).messages.create(
            model="base", max_tokens=8, messages=hello
        )
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-nope", max_tokens=8, messages=hello)
    limited = _client(stack, stack["keys"]["limited"])
    limited.messages.create(model="base", max_tokens=8, messages=hello)
    with pytest.raises(anthropic.RateLimitError) as e:
        limited.messages.create(model="base", max_tokens=8, messages=hello)
    assert int(e.value.response.headers["retry-after"]) >= 1
    with pytest.raises(anthropic.InternalServerError) as e:
        client.messages.create(model="base-mini", max_tokens=8, messages=hello)
    assert e.value.status_code == 529
    assert e.value.body["error"]["type"] == "overloaded_error"
