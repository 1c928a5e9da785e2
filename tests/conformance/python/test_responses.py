"""The Responses API through the official `openai` Python SDK, against a live
gateway: every create form, the stream helper, retrieve with stream=True,
cancel, delete, input item listing, chaining and a tool round trip."""

import json
import subprocess
import threading
import time

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from conftest import _stack_bin


@pytest.fixture(scope="module")
def slow_client():
    """A second stack whose workers decode at 40 tokens/s, on Redis, so a
    background run is still going when the test cancels or follows it."""
    proc = subprocess.Popen(
        [_stack_bin(), "--redis", "--tokens-per-second", "40"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    ready = {}
    reader = threading.Thread(
        target=lambda: ready.setdefault("line", proc.stdout.readline()), daemon=True
    )
    reader.start()
    reader.join(timeout=60)
    if not ready.get("line"):
        proc.kill()
        raise RuntimeError("the slow test stack did not start")
    info = json.loads(ready["line"])
    yield OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)
    proc.stdin.close()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def wait_for(client, rid, statuses, timeout=10.0):
    deadline = time.time() + timeout
    while True:
        r = client.responses.retrieve(rid)
        if r.status in statuses or time.time() > deadline:
            return r
        time.sleep(0.05)


def test_create_non_streaming(client):
    r = client.responses.create(
        model="base",
        input="Hello. synthetic:reply_tokens=6",
        instructions="Be brief.",
        metadata={"case": "plain"},
    )
    assert r.id.startswith("resp_")
    assert r.object == "response"
    assert r.status == "completed"
    assert r.output_text
    assert r.metadata == {"case": "plain"}
    assert r.usage.output_tokens == 6
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.usage.input_tokens_details.cached_tokens >= 0
    assert r._request_id


def test_create_streaming_events(client):
    stream = client.responses.create(
        model="base-mini", input="Hi. synthetic:reply_tokens=5", stream=True
    )
    events = list(stream)
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert types[1] == "response.in_progress"
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text


def test_stream_helper(client):
    with client.responses.stream(
        model="base", input="Hi. synthetic:reply_tokens=7"
    ) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == text
    assert final.usage.output_tokens == 7


def test_store_false_is_not_retrievable(client):
    r = client.responses.create(model="base", input="x synthetic:reply_tokens=1", store=False)
    assert r.status == "completed"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_background_then_retrieve_and_replay(client):
    r = client.responses.create(
        model="base", input="bg synthetic:reply_tokens=8", background=True
    )
    assert r.status == "queued"
    assert r.background is True
    done = wait_for(client, r.id, {"completed"})
    assert done.status == "completed"
    assert done.usage.output_tokens == 8
    events = list(client.responses.retrieve(r.id, stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    after = list(client.responses.retrieve(r.id, stream=True, starting_after=4))
    assert [e.sequence_number for e in after] == list(range(5, len(events)))


def test_stream_helper_resumes_a_background_response(client):
    """`responses.stream(response_id=..., starting_after=N)`: the SDK's
    helper replays the run and hands over only the events after N, then
    builds the final response from what it saw."""
    r = client.responses.create(
        model="base", input="bg synthetic:reply_tokens=6", background=True
    )
    wait_for(client, r.id, {"completed"})
    with client.responses.stream(response_id=r.id, starting_after=3) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert events, "events after sequence number 3"
    assert all(e.sequence_number > 3 for e in events)
    assert events[-1].type == "response.completed"
    assert final.id == r.id
    assert final.status == "completed"
    assert final.usage.output_tokens == 6


def test_background_stream_on_create(client):
    stream = client.responses.create(
        model="base", input="bg synthetic:reply_tokens=4", background=True, stream=True
    )
    events = list(stream)
    assert events[0].type == "response.created"
    assert events[0].response.status == "queued"
    assert events[-1].type == "response.completed"


def test_retrieve_stream_needs_background(client):
    r = client.responses.create(model="base", input="x synthetic:reply_tokens=1")
    with pytest.raises(openai.BadRequestError) as e:
        list(client.responses.retrieve(r.id, stream=True))
    assert e.value.status_code == 400


def test_follow_and_cancel_a_running_background_response(slow_client):
    r = slow_client.responses.create(
        model="base", input="bg synthetic:reply_tokens=400", background=True
    )
    wait_for(slow_client, r.id, {"in_progress"})
    cancelled = slow_client.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    with pytest.raises(openai.BadRequestError) as e:
        slow_client.responses.cancel(r.id)
    assert e.value.code == "response_not_cancellable"
    assert slow_client.responses.retrieve(r.id).status == "cancelled"
    # A replay ends on the terminal event.
    events = list(slow_client.responses.retrieve(r.id, stream=True))
    assert events[-1].response.status == "cancelled"


def test_live_follow(slow_client):
    r = slow_client.responses.create(
        model="base", input="bg synthetic:reply_tokens=30", background=True
    )
    started = time.time()
    events = list(slow_client.responses.retrieve(r.id, stream=True))
    assert time.time() - started > 0.3
    assert events[-1].type == "response.completed"
    assert events[-1].response.usage.output_tokens == 30


def test_chaining_on_an_unfinished_response_is_a_conflict(slow_client):
    r = slow_client.responses.create(
        model="base", input="bg synthetic:reply_tokens=200", background=True
    )
    with pytest.raises(openai.ConflictError) as e:
        slow_client.responses.create(model="base", input="next", previous_response_id=r.id)
    assert e.value.status_code == 409
    slow_client.responses.cancel(r.id)


def test_delete(client):
    r = client.responses.create(model="base", input="x synthetic:reply_tokens=1")
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)


def test_input_items_list(client):
    r = client.responses.create(
        model="base",
        input=[
            {"role": "user", "content": "first"},
            {"role": "user", "content": [{"type": "input_text", "text": "second"}]},
        ],
    )
    items = client.responses.input_items.list(r.id)
    data = list(items)
    assert [i.content[0].text for i in data] == ["second", "first"]
    asc = client.responses.input_items.list(r.id, order="asc", limit=1)
    assert asc.data[0].content[0].text == "first"
    assert asc.has_more is True


def test_chaining_and_tool_round_trip(client):
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
            "strict": True,
        }
    ]
    first = client.responses.create(
        model="base", input="Weather in Paris?", tools=tools, tool_choice="required"
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert "city" in json.loads(calls[0].arguments)
    second = client.responses.create(
        model="base",
        previous_response_id=first.id,
        tools=tools,
        input=[
            {
                "type": "function_call_output",
                "call_id": calls[0].call_id,
                "output": '{"temp": 21}',
            }
        ],
    )
    assert second.status == "completed"
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens


def test_parse_with_a_pydantic_model(client):
    class Weather(BaseModel):
        city: str
        celsius: int

    r = client.responses.parse(model="base", input="Weather in Oslo?", text_format=Weather)
    assert isinstance(r.output_parsed, Weather)


def test_errors_map_to_sdk_exceptions(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="base", input="x", background=True, store=False)
    assert e.value.param == "background"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="base", input="x", reasoning={"effort": "max"})
    assert e.value.param == "reasoning.effort"
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="gpt-nope", input="x")
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="base", input="x", previous_response_id="resp_missing")
