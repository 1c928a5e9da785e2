"""The official `openai` Python SDK against the live gateway."""

import openai
import pytest
from openai import OpenAI

MODELS = {"base", "base-mini", "base-ultra"}


def test_chat_create(client):
    reply = client.chat.completions.create(
        model="base",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello. synthetic:reply_tokens=8"},
        ],
    )
    assert reply.id.startswith("chatcmpl-")
    assert reply.object == "chat.completion"
    assert reply.model == "base"
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert reply.usage.completion_tokens == 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8
    assert reply.usage.prompt_tokens_details.cached_tokens == 0
    assert reply._request_id, "x-request-id is read by the SDK"


def test_chat_stream(client):
    stream = client.chat.completions.create(
        model="base-mini",
        messages=[{"role": "user", "content": "Hi. synthetic:reply_tokens=12"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, roles, finish, usage = "", 0, None, None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for c in chunk.choices:
            roles += c.delta.role is not None
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert roles == 1
    assert finish == "stop"
    assert text
    assert usage.completion_tokens == 12


def test_chat_stream_helper_accumulates(client):
    with client.chat.completions.stream(
        model="base-ultra",
        messages=[{"role": "user", "content": "Hi. synthetic:reply_tokens=5"}],
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert final.choices[0].message.content == "".join(deltas)
    assert final.choices[0].finish_reason == "stop"


def test_models_list_and_retrieve(client):
    ids = {m.id for m in client.models.list()}
    assert ids == MODELS
    m = client.models.retrieve("base")
    assert (m.id, m.object, m.created, m.owned_by) == ("base", "model", 0, "base")


def test_unknown_model_raises_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.status_code == 404
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
    assert e.value.code == "model_not_found"
    assert e.value.param == "model"
    assert e.value.request_id


def test_bad_key_raises_authentication_error(stack):
    bad = OpenAI(base_url=stack["base_url"], api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(
            model="base", messages=[{"role": "user", "content": "hi"}]
        )
    assert e.value.status_code == 401
    assert e.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_bad_parameter_raises_bad_request_with_code_and_param(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="base",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"max_token": 5},
        )
    assert e.value.status_code == 400
    assert e.value.code == "unknown_parameter"
    assert e.value.param == "max_token"

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="base",
            messages=[{"role": "user", "content": "hi"}],
            temperature=3,
        )
    assert e.value.param == "temperature"
    assert isinstance(e.value.code, str) and e.value.code
