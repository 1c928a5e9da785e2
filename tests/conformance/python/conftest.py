"""Starts one test stack (real gateway + simulated workers) for the session.

The stack comes from the harness's `stack` binary ($STACK_BIN, else the
workspace's target/release/stack): it prints its address and key as one JSON
line and runs until its stdin closes.
"""

import contextlib
import json
import os
import pathlib
import subprocess
import threading

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


@contextlib.contextmanager
def start_stack(args=()):
    """Runs `stack ARGS` until the block ends; yields its JSON info line."""
    proc = subprocess.Popen(
        [_stack_bin(), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    ready = {}

    def read_first_line():
        ready["line"] = proc.stdout.readline()

    reader = threading.Thread(target=read_first_line, daemon=True)
    reader.start()
    # A real engine may need its llama-server located (built once) first.
    reader.join(timeout=120)
    line = ready.get("line", "")
    if not line:
        proc.kill()
        raise RuntimeError("the test stack did not start (see its stderr above)")
    try:
        yield json.loads(line)
    finally:
        proc.stdin.close()  # the stack stops when its stdin closes
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def stack():
    with start_stack() as info:
        yield info


@pytest.fixture()
def client(stack) -> OpenAI:
    # No retries: a test must see the first answer.
    return OpenAI(base_url=stack["base_url"], api_key=stack["api_key"], max_retries=0)
