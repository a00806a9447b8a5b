"""Refuse, over HTTP, the OpenAI requests SGLang 0.5.23's server would serve although OpenAI's API refuses them.

SGLang's OpenAI-compatible server answers almost every malformed request with a clear 400 of its own (invalid JSON,
negative or huge ``max_tokens``, a prompt longer than the context, empty ``messages``, negative ``temperature``,
``top_p`` outside (0, 1]). Two kinds it serves anyway, which a client written against OpenAI's API relies on being
refused:

* a ``model`` the server does not serve: SGLang answers with the loaded model and echoes the requested name back, so
  a client that mistyped the model (or talks to the wrong server) gets another model's answer under the name it asked
  for. Refused here with OpenAI's 404 and SGLang's own error body for ``GET /v1/models/{model}``;
* ``temperature`` above OpenAI's documented maximum of 2: refused with a 400 in SGLang's error format.

Accepted model names: the served name (what ``GET /v1/models`` lists), SGLang's placeholder ``"default"`` (its
protocol's default and its documentation's examples), and with LoRA enabled ``<name>:<adapter>`` for either, whose
adapter SGLang itself resolves.

Why an ASGI middleware and not a patch or a subclass: the check has to run before SGLang's route parses the request,
on the two OpenAI generation routes only, and leave everything else (streaming, the disconnect detection SGLang's
handlers use to abort a request whose client left) exactly as SGLang built it. The middleware reads the request body
once, and either answers the refusal or hands the app the same body followed by the client's own ``receive``, so a
disconnect still reaches SGLang. A body it cannot read as a JSON object (compressed, not JSON) is passed on untouched
for SGLang to answer.
"""
from __future__ import annotations

import json
from typing import Awaitable, Callable

#: the OpenAI routes whose requests name a model and a temperature
GUARDED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
#: SGLang's protocol default for ``model`` (``sglang.srt.entrypoints.openai.protocol.DEFAULT_MODEL_NAME``)
SGLANG_DEFAULT_MODEL = "default"
#: OpenAI's documented range of ``temperature``; SGLang refuses only the negative side
MAX_TEMPERATURE = 2.0


def refusal(body: object, served_name: str, lora_enabled: bool) -> tuple[int, dict] | None:
    """(status, JSON error body) for a request OpenAI's API refuses and SGLang would serve; ``None`` to pass it on.

    >>> refusal({"model": "gpt-4", "prompt": "hi"}, "SmolLM2", False)[0]
    404
    >>> print(refusal({"model": "SmolLM2", "temperature": 3}, "SmolLM2", False)[1]["message"])
    temperature must be in [0, 2] (OpenAI's range), got 3
    >>> refusal({"model": "default", "temperature": 0.7}, "SmolLM2", False) is None
    True
    """
    if not isinstance(body, dict):
        return None                                     # SGLang's own validation answers it
    model = body.get("model", SGLANG_DEFAULT_MODEL)
    if isinstance(model, str) and not _served(model, served_name, lora_enabled):
        return 404, {"error": {
            "message": f"The model '{model}' does not exist: this server serves '{served_name}' (GET /v1/models "
                       "lists it)",
            "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}
    temperature = _number(body.get("temperature"))
    if temperature is not None and temperature > MAX_TEMPERATURE:
        return 400, {"object": "error",
                     "message": f"temperature must be in [0, 2] (OpenAI's range), got {body['temperature']}",
                     "type": "BadRequestError", "param": "temperature", "code": 400}
    return None


def _number(value) -> float | None:
    """``value`` as SGLang's schema reads a float field: a number, or a string holding one (pydantic's lax mode turns
    ``"3"`` into 3.0); ``None`` for anything else, which SGLang's own validation answers."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _served(model: str, served_name: str, lora_enabled: bool) -> bool:
    names = (served_name, SGLANG_DEFAULT_MODEL)
    if model in names:
        return True
    return lora_enabled and any(model.startswith(name + ":") for name in names)


class OpenAIRequestGuard:
    """ASGI middleware applying :func:`refusal` to ``POST`` requests on :data:`GUARDED_PATHS`.

    ``served`` is called per request and returns (served model name, LoRA enabled): the server's state, read when it
    is there (after SGLang's start-up), not when the middleware is added.
    """

    def __init__(self, app, served: Callable[[], tuple[str, bool]]):
        self.app = app
        self.served = served

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in GUARDED_PATHS:
            await self.app(scope, receive, send)
            return
        body, disconnected = await _read_body(receive)
        if not disconnected and not _compressed(scope):
            answer = refusal(_json_or_none(body), *self.served())
            if answer is not None:
                await _send_json(send, *answer)
                return
        await self.app(scope, _replay(body, disconnected, receive), send)


async def _read_body(receive) -> tuple[bytes, bool]:
    """The whole request body, and whether the client left while it was being read."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks), True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, disconnected: bool, receive) -> Callable[[], Awaitable[dict]]:
    """A ``receive`` that gives the app the body already read, then the client's own messages (its disconnect)."""
    pending = [{"type": "http.disconnect"} if disconnected else
               {"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> dict:
        return pending.pop() if pending else await receive()

    return replayed


def _compressed(scope) -> bool:
    return any(name.lower() == b"content-encoding" for name, _ in scope.get("headers", ()))


def _json_or_none(body: bytes) -> object:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


async def _send_json(send, status: int, content: dict) -> None:
    payload = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def install_on_sglang_server() -> None:
    """Add the guard to SGLang's FastAPI app (``sglang.srt.entrypoints.http_server.app``), before the server starts.

    Only the HTTP process that imported this app gets it: ``python -m sglang_hybrid.serve`` runs one
    (``--tokenizer-worker-num`` above 1 re-imports SGLang's app in worker processes, and is refused there).
    """
    from sglang.srt.entrypoints import http_server
    from sglang.srt.runtime_context import get_lora

    def served() -> tuple[str, bool]:       # as SGLang's own GET /v1/models reads them
        return http_server._global_state.tokenizer_manager.served_model_name, bool(get_lora().enable_lora)

    http_server.app.add_middleware(OpenAIRequestGuard, served=served)
