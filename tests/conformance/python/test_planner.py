"""Planner mode through the official SDK, the way SDK users call it:
`extra_body={"planner_mode": True, "agents": [...]}` and
`extra_headers={"x-session-id": ...}`, reading the reply's extra fields
(`thought`, `tool_thought`, `executable_data`, `conversation_id`) from
`model_extra`.

A tiny A2A v1.0 agent runs in this process (stdlib HTTP server); the plan
calls are scripted with the simulated engine's `synthetic:json_replies=`
control, and `synthetic:echo` makes the answer the synthesis prompt.
"""

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
from openai import OpenAI

from conftest import start_stack

PLANNER_TOML = """
[planner]
allow_private_addresses = true
first_byte_timeout_ms = 3000
idle_timeout_ms = 3000
step_timeout_ms = 5000
run_timeout_ms = 15000
"""


class _Agent(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/.well-known/agent-card.json":
            return self._send(404, {})
        host = self.headers["host"]
        self._send(200, {
            "name": "pyagent",
            "description": "Answers from Python",
            "version": "1.0.0",
            "supportedInterfaces": [
                {"url": f"http://{host}/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
            ],
            "capabilities": {"streaming": False},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"],
            "skills": [{"id": "a", "name": "answer", "description": "answers", "tags": ["test"]}],
        })

    def do_POST(self):
        call = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self._send(200, {"jsonrpc": "2.0", "id": call["id"], "result": {"task": {
            "id": "py-task", "contextId": "py-ctx",
            "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"artifactId": "a", "parts": [
                {"text": "pyagent says hello"},
                {"data": {"temperature": 21}, "mediaType": "application/json"},
            ]}],
        }}})


@pytest.fixture(scope="module")
def agent_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Agent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def planner():
    with start_stack(["--models", "base-mini", "--extra-toml", PLANNER_TOML]) as info:
        yield OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)


def _scripted(ask, *plans):
    return f"{ask} synthetic:echo synthetic:json_replies=" + " ".join(json.dumps(p) for p in plans)


# Plans as the model writes them: steps identified by position (`id` 1,
# 2, ...; `s1`, `s2` in tool_thought), `depends_on` naming earlier ones.
AGENT_PLAN = {"thought": "ask the agent", "steps": [
    {"id": 1, "kind": "agent", "target": "pyagent", "instruction": "Say hello.", "depends_on": []},
]}

TOOL_PLAN = {"thought": "agent, then the caller's clock", "steps": [
    {"id": 1, "kind": "agent", "target": "pyagent", "instruction": "Say hello.", "depends_on": []},
    {"id": 2, "kind": "function", "target": "get_time", "instruction": "Time?",
     "arguments": {"tz": "UTC"}, "depends_on": [1]},
]}

TOOLS = [{"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                   "required": ["tz"], "additionalProperties": False},
}}]


def test_planner_reply_fields_through_extra_body(planner, agent_url):
    session = "py-" + uuid.uuid4().hex
    reply = planner.chat.completions.create(
        model="base-mini",
        messages=[{"role": "user", "content": _scripted("Greet me.", AGENT_PLAN)}],
        extra_body={"planner_mode": True, "agents": [agent_url]},
        extra_headers={"x-session-id": session},
    )
    assert reply.choices[0].finish_reason == "stop"
    assert "pyagent says hello" in reply.choices[0].message.content
    extra = reply.model_extra
    assert extra["conversation_id"] == session
    assert any(t.startswith("Plan (") for t in extra["thought"])
    steps = [t for t in extra["tool_thought"] if t["step"] == "s1"]
    assert steps and steps[0]["target"] == "pyagent" and steps[0]["outcome"] == "completed"
    assert isinstance(steps[0]["latency_ms"], int)
    data = extra["executable_data"]
    assert data == [{"type": "data", "data": {"temperature": 21}, "media_type": "application/json",
                     "step": "s1", "agent": "pyagent"}]
    assert reply.usage.total_tokens > 0


def test_planner_pauses_for_tools_and_resumes_by_session(planner, agent_url):
    session = "py-" + uuid.uuid4().hex
    messages = [{"role": "user", "content": _scripted("Time please.", TOOL_PLAN)}]
    paused = planner.chat.completions.create(
        model="base-mini",
        messages=messages,
        tools=TOOLS,
        extra_body={"planner_mode": True, "agents": [agent_url]},
        extra_headers={"x-session-id": session},
    )
    choice = paused.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments) == {"tz": "UTC"}
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "09:30 UTC"})
    done = planner.chat.completions.create(
        model="base-mini",
        messages=messages,
        tools=TOOLS,
        extra_body={"planner_mode": True},
        extra_headers={"x-session-id": session},
    )
    assert done.choices[0].finish_reason == "stop"
    assert "09:30 UTC" in done.choices[0].message.content
    assert done.model_extra["conversation_id"] == session
    # A result nobody waits for is a 400 that names it.
    messages[-1]["tool_call_id"] = "call_nobody"
    messages[-2]["tool_calls"][0]["id"] = "call_nobody"
    with pytest.raises(openai.BadRequestError) as e:
        planner.chat.completions.create(
            model="base-mini", messages=messages, tools=TOOLS,
            extra_body={"planner_mode": True}, extra_headers={"x-session-id": session},
        )
    assert e.value.body["param"] == "messages.2.tool_call_id"


def test_planner_stream_carries_thoughts_then_the_answer(planner, agent_url):
    stream = planner.chat.completions.create(
        model="base-mini",
        messages=[{"role": "user", "content": _scripted("Stream it.", AGENT_PLAN)}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"planner_mode": True, "agents": [agent_url]},
        extra_headers={"x-session-id": "py-" + uuid.uuid4().hex},
    )
    order, text, usage = [], "", None
    for chunk in stream:
        extra = chunk.model_extra or {}
        if extra.get("thought"):
            order.append("thought")
        if extra.get("tool_thought"):
            order.append("tool_thought")
        if chunk.choices and chunk.choices[0].delta.content:
            order.append("content")
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage
    assert order[0] == "thought"
    assert order.index("tool_thought") < order.index("content")
    assert "content" not in order[: order.index("tool_thought")]
    assert "pyagent says hello" in text
    assert usage and usage.total_tokens > 0


def test_planner_mode_needs_a_session(planner):
    with pytest.raises(openai.BadRequestError) as e:
        planner.chat.completions.create(
            model="base-mini",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"planner_mode": True},
        )
    assert e.value.body["param"] == "x-session-id"
    with pytest.raises(openai.BadRequestError) as e:
        planner.chat.completions.create(
            model="base-mini",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"agents": ["http://127.0.0.1:1"]},
        )
    assert e.value.body["param"] == "agents"
