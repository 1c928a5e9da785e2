"""The official SDK over HTTPS: a gateway serving `[tls]` with a certificate
from a CA made for the run (`stack --tls`), and the SDK's HTTP client
(`openai.DefaultHttpxClient`) trusting that CA, as a client of a private
deployment would be configured.
"""

import ssl

import openai
import pytest
from openai import OpenAI

from conftest import start_stack


@pytest.fixture(scope="module")
def tls_stack():
    with start_stack(["--tls", "--models", "base"]) as info:
        yield info


def sdk(info, verify) -> OpenAI:
    return OpenAI(
        base_url=info["base_url"],
        api_key=info["api_key"],
        max_retries=0,
        # The SDK's own client class, with the SDK's defaults, told whom to trust.
        http_client=openai.DefaultHttpxClient(verify=verify),
    )


def test_chat_stream_and_models_over_https(tls_stack):
    assert tls_stack["base_url"].startswith("https://")
    client = sdk(tls_stack, ssl.create_default_context(cafile=tls_stack["ca_file"]))

    reply = client.chat.completions.create(
        model="base",
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=8,
    )
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens >= 1

    chunks = list(
        client.chat.completions.create(
            model="base",
            messages=[{"role": "user", "content": "Say hello"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1

    assert "base" in [m.id for m in client.models.list().data]


def test_a_client_without_the_ca_refuses_the_certificate(tls_stack):
    # The system's roots do not include the run's CA: the SDK must refuse
    # the connection rather than send the key.
    client = sdk(tls_stack, ssl.create_default_context())
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


def test_plain_http_on_the_tls_port_is_not_served(tls_stack):
    plain = tls_stack["base_url"].replace("https://", "http://", 1)
    client = OpenAI(base_url=plain, api_key=tls_stack["api_key"], max_retries=0)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()
