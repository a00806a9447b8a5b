"""The request guard of ``python -m sglang_hybrid.serve`` (``sglang_hybrid/http_guard.py``), in front of a real FastAPI
app driven over ASGI: what it refuses (OpenAI's 404 for a model the server does not serve, a 400 for temperature
above 2), what it passes on untouched (the body byte for byte, other routes, what SGLang answers itself), and that a
client's disconnect still reaches the app behind it (SGLang aborts a request whose client left by polling it). The
live server tests (``tests/live/test_server_live.py``) send the same refusals to SGLang's own server."""
from __future__ import annotations

import asyncio
import json

import pytest

import fastapi  # noqa: E402

from sglang_hybrid.http_guard import OpenAIRequestGuard, refusal  # noqa: E402

SERVED = "SmolLM2-135M-Instruct"


def _app(seen: list):
    """A FastAPI app standing where SGLang's is: it records each body it receives and whether the client left."""
    app = fastapi.FastAPI()

    @app.post("/v1/completions")
    @app.post("/v1/chat/completions")
    @app.post("/generate")
    async def record(request: fastapi.Request):
        seen.append(await request.body())
        return {"ok": True, "disconnected": await request.is_disconnected()}

    return OpenAIRequestGuard(app, served=lambda: (SERVED, False))


def _call(app, path: str, body: bytes, method: str = "POST", chunks: int = 1, then_disconnect: bool = False,
          headers=()) -> tuple[int, dict]:
    """One request over ASGI: the body in ``chunks`` messages, then (if asked) the client's disconnect."""
    step = max(1, -(-len(body) // chunks))
    messages = [{"type": "http.request", "body": body[i:i + step], "more_body": i + step < len(body)}
                for i in range(0, max(len(body), 1), step)]
    messages.append({"type": "http.disconnect"} if then_disconnect else None)
    sent = []

    async def receive():
        message = messages.pop(0) if messages else None
        if message is None:
            await asyncio.sleep(3600)       # a connected client that sends nothing more
        return message

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"content-type", b"application/json"), *headers], "http_version": "1.1",
             "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "root_path": "",
             "asgi": {"version": "3.0"}}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_http_guard_refuses_a_model_the_server_does_not_serve_with_openais_404(path):
    seen = []
    status, answer = _call(_app(seen), path, json.dumps({"model": "gpt-4o", "prompt": "hi"}).encode())
    assert status == 404 and seen == []
    assert answer["error"]["code"] == "model_not_found" and answer["error"]["param"] == "model"
    assert "'gpt-4o' does not exist" in answer["error"]["message"] and SERVED in answer["error"]["message"]


@pytest.mark.parametrize("temperature, status", [(3, 400), (2.0001, 400), ("3", 400), (2, 200), (0, 200), (1.3, 200),
                                                 ("2", 200), ("warm", 200)])
def test_http_guard_refuses_temperature_above_openais_maximum_of_2(temperature, status):
    seen = []
    got, answer = _call(_app(seen), "/v1/chat/completions",
                        json.dumps({"model": SERVED, "messages": [], "temperature": temperature}).encode())
    assert got == status and len(seen) == (status == 200)
    if status == 400:
        assert answer["code"] == 400 and answer["param"] == "temperature"
        assert answer["message"] == f"temperature must be in [0, 2] (OpenAI's range), got {temperature}"


@pytest.mark.parametrize("body", [
    {"model": SERVED, "prompt": "hi", "temperature": 0.7},
    {"model": "default", "prompt": "hi"},            # SGLang's placeholder, its documentation's examples
    {"prompt": "hi"},                                # no model: SGLang's protocol defaults it to "default"
    {"model": SERVED, "prompt": "hi", "temperature": -1},     # SGLang answers negative values itself
    {"model": SERVED, "prompt": "hi", "temperature": True},   # not a number: SGLang's schema answers it
    {"model": SERVED, "prompt": "hi", "temperature": "warm"},
    [1, 2, 3],                                       # not an object: SGLang's schema answers it
])
def test_http_guard_passes_on_what_openai_accepts_or_sglang_answers_itself_byte_for_byte(body):
    seen = []
    raw = json.dumps(body).encode()
    status, answer = _call(_app(seen), "/v1/completions", raw, chunks=3)
    assert (status, answer["ok"], seen) == (200, True, [raw])


@pytest.mark.parametrize("path, body, headers", [
    ("/v1/completions", b'{"model": "gpt-4o", "prompt": "hi",', ()),                         # invalid JSON
    ("/generate", json.dumps({"model": "gpt-4o", "temperature": 9}).encode(), ()),           # not an OpenAI route
    ("/v1/completions", json.dumps({"model": "gpt-4o"}).encode(), [(b"content-encoding", b"gzip")]),  # compressed
])
def test_http_guard_leaves_other_routes_invalid_json_and_compressed_bodies_to_sglang(path, body, headers):
    seen = []
    status, _ = _call(_app(seen), path, body, headers=list(headers))
    assert status == 200 and seen == [body]


def test_http_guard_hands_the_clients_disconnect_to_the_app_after_the_body():
    """SGLang's handlers poll ``is_disconnected()`` to abort a request whose client left: the guard, having read the
    body, must still pass the client's next message through."""
    seen = []
    raw = json.dumps({"model": SERVED, "prompt": "hi"}).encode()
    status, answer = _call(_app(seen), "/v1/completions", raw, then_disconnect=True)
    assert (status, answer["disconnected"], seen) == (200, True, [raw])
    status, answer = _call(_app(seen), "/v1/completions", raw)
    assert (status, answer["disconnected"]) == (200, False)


def test_http_guard_lora_names_pass_only_with_lora_enabled():
    body = {"model": SERVED + ":my-adapter"}
    assert refusal(body, SERVED, lora_enabled=True) is None
    assert refusal({"model": "default:my-adapter"}, SERVED, lora_enabled=True) is None
    assert refusal(body, SERVED, lora_enabled=False)[0] == 404
    assert refusal({"model": "other:my-adapter"}, SERVED, lora_enabled=True)[0] == 404
