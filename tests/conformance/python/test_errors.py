"""Every error class of the official `openai` SDK, raised by the live gateway.

The SDK maps statuses to exception classes (400 BadRequestError, 401
AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError, 409
ConflictError, 429 RateLimitError, >= 500 InternalServerError) and reads
`.code`, `.param` and `.type` from the error envelope. This suite starts its
own stack with extra keys (a models-only key, a key of a blocked
organisation, a key on a 1-request-per-minute plan) and a model whose only
worker address is dead, so that each class can be provoked for real.
"""

import hashlib
import json
import os
import pathlib
import secrets
import subprocess
import threading
import time

import openai
import pytest
from openai import OpenAI

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _stack_bin() -> str:
    if os.environ.get("STACK_BIN"):
        return os.environ["STACK_BIN"]
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return str(target / "release" / "stack")


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def errors_stack():
    keys = {
        "models_only": "sk-models-" + secrets.token_hex(8),
        "blocked": "sk-blocked-" + secrets.token_hex(8),
        "limited": "sk-limited-" + secrets.token_hex(8),
    }
    extra = f"""
[[keys]]
sha256 = "{_sha(keys['models_only'])}"
org = "org-errors"
name = "models-only"
scopes = ["models.read"]

[[keys]]
sha256 = "{_sha(keys['blocked'])}"
org = "org-blocked"
name = "blocked"

[[keys]]
sha256 = "{_sha(keys['limited'])}"
org = "org-limited"
name = "limited"
plan = "one-rpm"

[plans.one-rpm]
rpm = 1

[orgs.org-blocked]
blocked = true
blocked_reason = "payment overdue"

[models.base-ultra]
workers = ["127.0.0.1:1"]
"""
    proc = subprocess.Popen(
        [
            _stack_bin(),
            "--models",
            "base,base-mini",
            "--tokens-per-second",
            "400",
            "--extra-toml",
            extra,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    ready = {}
    reader = threading.Thread(
        target=lambda: ready.update(line=proc.stdout.readline()), daemon=True
    )
    reader.start()
    reader.join(timeout=60)
    if not ready.get("line"):
        proc.kill()
        raise RuntimeError("the errors stack did not start (see its stderr above)")
    info = json.loads(ready["line"])
    info["keys"] = keys
    yield info
    proc.stdin.close()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _client(stack, key=None) -> OpenAI:
    return OpenAI(
        base_url=stack["base_url"], api_key=key or stack["api_key"], max_retries=0
    )


FAST = "hi synthetic:reply_tokens=1"


def _chat(client, **kw):
    args = {"model": "base-mini", "messages": [{"role": "user", "content": FAST}]}
    args.update(kw)
    return client.chat.completions.create(**args)


@pytest.mark.parametrize(
    "kwargs, code, param",
    [
        ({"extra_body": {"max_token": 5}}, "unknown_parameter", "max_token"),
        ({"temperature": 2.5}, "invalid_value", "temperature"),
        ({"n": 3}, "unsupported_value", "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "invalid_value", "stop"),
        ({"tools": [{"type": "web_search"}]}, "invalid_value", "tools.0.type"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "strict": True,
                            "parameters": {
                                "type": "object",
                                "properties": {"a": {"type": "string"}},
                            },
                        },
                    }
                ]
            },
            "invalid_function_parameters",
            "tools.0.function.parameters",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "missing_required_parameter",
            "response_format.json_schema.name",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image_url",
                                "image_url": {"url": "https://example.com/a.png"},
                            }
                        ],
                    }
                ]
            },
            "invalid_value",
            "messages.0.content.0",
        ),
        ({"extra_body": {"planner_mode": True}}, "missing_required_parameter", "x-session-id"),
        ({"max_tokens": 300_000}, "context_length_exceeded", "max_tokens"),
    ],
)
def test_bad_request_carries_code_and_param(errors_stack, kwargs, code, param):
    with pytest.raises(openai.BadRequestError) as info:
        _chat(_client(errors_stack), **kwargs)
    e = info.value
    assert e.status_code == 400
    assert e.code == code
    assert e.param == param
    assert e.type == "invalid_request_error"
    assert e.body["status"] == 400
    assert e.response.headers.get("x-should-retry") == "false"
    assert e.request_id


def test_responses_bad_request(errors_stack):
    client = _client(errors_stack)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="base", input=FAST, background=True, store=False)
    assert (info.value.code, info.value.param) == ("invalid_value", "background")
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="base", input=FAST, reasoning={"effort": "max"})
    assert info.value.param == "reasoning.effort"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="base",
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": "https://example.com/a.png"}
                    ],
                }
            ],
        )
    assert info.value.param == "input.0.content.0"


def test_authentication_error(errors_stack):
    with pytest.raises(openai.AuthenticationError) as info:
        _chat(_client(errors_stack, "sk-not-a-key"))
    assert info.value.status_code == 401
    assert info.value.code == "invalid_api_key"
    assert info.value.type == "authentication_error"


def test_permission_denied_error(errors_stack):
    client = _client(errors_stack, errors_stack["keys"]["models_only"])
    assert {m.id for m in client.models.list()} == {"base", "base-mini", "base-ultra"}
    with pytest.raises(openai.PermissionDeniedError) as info:
        _chat(client)
    assert info.value.status_code == 403
    assert info.value.type == "permission_error"
    assert isinstance(info.value.code, str) and info.value.code


def test_blocked_account_is_402_unwrapped(errors_stack):
    with pytest.raises(openai.APIStatusError) as info:
        _chat(_client(errors_stack, errors_stack["keys"]["blocked"]))
    e = info.value
    assert e.status_code == 402
    body = e.response.json()
    assert "error" not in body
    assert isinstance(body["message"], str)
    assert isinstance(body["code"], int)
    assert isinstance(body["ev"], int)
    assert body["data"]["reason"]


def test_not_found_error(errors_stack):
    client = _client(errors_stack)
    with pytest.raises(openai.NotFoundError) as info:
        _chat(client, model="base-maxi")
    assert (info.value.code, info.value.param) == ("model_not_found", "model")
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="gpt-4o", input=FAST)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_does_not_exist")


def test_conflict_error(errors_stack):
    client = _client(errors_stack)
    # About 10 s of simulated decoding at 400 tokens per second.
    running = client.responses.create(
        model="base",
        input="long synthetic:reply_tokens=4000",
        background=True,
    )
    try:
        with pytest.raises(openai.ConflictError) as info:
            client.responses.create(
                model="base", input=FAST, previous_response_id=running.id
            )
        assert info.value.status_code == 409
        assert info.value.param == "previous_response_id"
        assert info.value.response.headers.get("x-should-retry") is None
    finally:
        client.responses.cancel(running.id)


def test_rate_limit_error(errors_stack):
    client = _client(errors_stack, errors_stack["keys"]["limited"])
    # At 1 request per minute, at most two of three requests in a row are
    # admitted, even if a minute boundary falls between them.
    with pytest.raises(openai.RateLimitError) as info:
        for _ in range(3):
            _chat(client)
    e = info.value
    assert e.status_code == 429
    assert e.type == "rate_limit_error"
    assert e.code == "rate_limit_exceeded"
    assert int(e.response.headers["retry-after"]) >= 1


def test_internal_server_error_when_no_worker_answers(errors_stack):
    with pytest.raises(openai.InternalServerError) as info:
        _chat(_client(errors_stack), model="base-ultra")
    e = info.value
    assert e.status_code in (500, 502, 503)
    assert e.type == "server_error"
    assert e.body["status"] == e.status_code
    if e.status_code == 503:
        assert int(e.response.headers["retry-after"]) >= 1


def test_sdk_retries_server_errors_but_not_client_errors(errors_stack):
    """With retries on, a 400 fails at once and a 503 is retried (it honours
    retry-after), which shows in the time taken."""
    client = OpenAI(
        base_url=errors_stack["base_url"], api_key=errors_stack["api_key"], max_retries=1
    )
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError):
        _chat(client, temperature=9)
    assert time.monotonic() - started < 0.5
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError):
        _chat(client, model="base-ultra")
    assert time.monotonic() - started >= 0.4
