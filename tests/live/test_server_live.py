"""HYBRID behind SGLang 0.5.23's real HTTP server, as users run it: ``python -m sglang_hybrid.serve --cpu`` on a local
port, talked to through the ``openai`` package (and raw HTTP for malformed requests).

Two servers start once for the module, side by side: HYBRID (``--enable-metrics``, ``--max-running-requests 8`` for
the 8 clients; ``serve`` exports HYBRID's counters at every step on CPU) and the same model without
speculation (``--no-speculation``, torch_native), which gives the greedy reference every completed HYBRID response must
equal (text, finish reason, token count). Two runs share them: the load (8 clients, /v1/completions and
/v1/chat/completions, streaming and not, with malformed requests sent while it is in flight) and, after it, the next
requests, with ``/metrics`` scraped around both. Outputs are short (4 and 8 new tokens): SGLang's CPU engine runs
HYBRID's speculative kernels in Triton's interpreter, seconds per decode step; the HYBRID server runs extend and
decode attention through the torch twins of SGLang's Triton kernels (``sglang_hybrid/cpu_engine/torch_attention.py``),
which take most of that time off. Timeouts are hang guards, never speed checks. In the live suite (marker
``live_sglang``, CI runs it); ``pytest -k server`` selects these.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

# Imported, not skipped, when missing: scripts/setup.sh installs SGLang's server dependencies and the test extra, so a
# missing one is a broken set-up, which a new user would meet too.
import openai  # noqa: E402
import sglang.srt.entrypoints.http_server  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [json.loads(line) for line in (ROOT / "sglang_hybrid" / "data" / "check_prompts.jsonl").read_text()
           .splitlines() if line.strip()]
CODE = next(i for i, p in enumerate(PROMPTS) if "prompt" in p)         # a code edit, raw text: /v1/completions
CHAT = next(i for i, p in enumerate(PROMPTS) if "messages" in p)       # the chat: /v1/chat/completions

from sglang_hybrid.cpu_engine.torch_attention import DECODE_SWAP_LOG, SWAP_LOG, TORCH_ATTENTION_ENV  # noqa: E402
from sglang_hybrid.cpu_engine.torch_kv_indices import KV_INDICES_SWAP_LOG  # noqa: E402
from sglang_hybrid import serve  # noqa: E402
from sglang_hybrid.sglang_plugin.metrics import FALLBACKS  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.live_sglang]
#: hang guards (seconds), not speed checks: a server start (about 45 s alone on a 2-core machine), one request, a run
START_GUARD_S, REQUEST_GUARD_S, RUN_GUARD_S = 600, 900, 1800
#: new tokens per request: 8 for the requests checked one by one after the load; 4 in the load, where 24 requests
#: at seconds per request and verify step would take most of the live suite's time (each still runs verify steps)
NEW_TOKENS, LOAD_TOKENS = 8, 4
CLIENTS, REQUESTS_PER_CLIENT, DISCONNECTING_CLIENTS = 8, 3, (0, 4, 5)
#: what a request that disconnects asks for (end-of-sequence ignored): left running, it would decode all of them
DISCONNECT_TOKENS = 400
#: the most draft tokens one verify step can accept with the server's defaults: n_nodes = 3 EAGLE steps + ngram_k 8
MAX_DRAFTS_PER_STEP = 11
SOURCES = {"none", "model", "ngram", "mixed"}

#: what a CPU engine process logs when the torch twins replace SGLang's Triton kernels (``TORCH_ATTENTION_ENV``)
TWIN_LOGS = (SWAP_LOG, DECODE_SWAP_LOG, KV_INDICES_SWAP_LOG)


class Server:
    """One ``python -m sglang_hybrid.serve --cpu`` process group on a free local port, its log in a file."""

    def __init__(self, name: str, flags: list, env: dict):
        self.name = name
        self.log = Path(tempfile.mkdtemp(prefix=f"hybrid_server_{name}_")) / "server.log"
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("SGLANG_HYBRID_") and k not in ("PROMETHEUS_MULTIPROC_DIR", TORCH_ATTENTION_ENV)}
        self.proc, self.port = serve.spawn(list(flags), self.log, {**base, **env}, cwd=ROOT)
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = None

    def tail(self, n: int = 4000) -> str:
        return f"[{self.name} server log {self.log}]\n" + self.log.read_text(errors="replace")[-n:]

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} server exited with {self.proc.returncode} during start\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as r:
                    self.model = json.loads(r.read())["data"][0]["id"]
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(2)
        pytest.fail(f"{self.name} server not ready after {START_GUARD_S} s (hang guard)\n{self.tail()}")

    def client(self):
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", timeout=REQUEST_GUARD_S, max_retries=0)

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=REQUEST_GUARD_S) as r:
            return r.read().decode()

    def stop(self) -> None:
        serve.stop(self.proc)


@pytest.fixture(scope="module")
def servers():
    """(HYBRID server, plain server), started together once for the module."""
    from sglang_hybrid.reference.models import ensure_converted

    ensure_converted()            # convert once here, not twice inside the servers
    # extend and decode attention through the torch twins of SGLang's Triton kernels (cpu_engine/torch_attention.py):
    # what runs here is the server around HYBRID, and the kernels in Triton's interpreter would take most of the time
    hybrid = Server("hybrid", ["--enable-metrics", "--max-running-requests", str(CLIENTS)],
                    {TORCH_ATTENTION_ENV: "1"})
    plain = Server("plain", ["--no-speculation"], {})
    try:
        deadline = time.monotonic() + START_GUARD_S
        hybrid.wait_ready(deadline)
        plain.wait_ready(deadline)
        yield hybrid, plain
    finally:
        hybrid.stop()
        plain.stop()


# -- requests ---------------------------------------------------------------------------------------------------------
def _request(prompt: int, *, stream: bool, max_tokens: int = NEW_TOKENS, disconnect: bool = False) -> dict:
    """A greedy request on one of the shipped prompts: code edits (raw text) through /v1/completions, the chat
    (messages) through /v1/chat/completions. One that disconnects asks for DISCONNECT_TOKENS, end-of-sequence
    ignored."""
    if disconnect:
        max_tokens = DISCONNECT_TOKENS
    return {"prompt": prompt, "stream": stream, "max_tokens": max_tokens, "disconnect": disconnect}


def _send(server: Server, client, req: dict, spec_details: bool, first_text: threading.Event | None = None) -> dict:
    """Send ``req``; returns the text, finish reason, completion tokens and SGLang's speculative details (``sglext``),
    or, for a request that disconnects, what was read before it closed the stream. ``first_text`` is set once a
    streaming answer has produced text (the request is decoding)."""
    line = PROMPTS[req["prompt"]]
    extra = {"return_spec_tokens_details": True} if spec_details else {}
    if req["disconnect"]:
        extra["ignore_eos"] = True
    common = dict(model=server.model, max_tokens=req["max_tokens"], temperature=0, stream=req["stream"],
                  extra_body=extra or None)
    chat = "messages" in line
    if req["stream"]:
        common["stream_options"] = {"include_usage": True}
    if chat:
        resp = client.chat.completions.create(messages=line["messages"], **common)
    else:
        resp = client.completions.create(prompt=line["prompt"], **common)
    if not req["stream"]:
        choice = resp.choices[0]
        return {"text": choice.message.content if chat else choice.text, "finish": choice.finish_reason,
                "tokens": resp.usage.completion_tokens, "spec": _spec((resp.model_extra or {}).get("sglext"))}
    out = {"text": "", "finish": None, "tokens": None, "spec": None, "chunks": 0}
    for chunk in resp:
        for choice in chunk.choices:
            out["text"] += (choice.delta.content or "") if chat else choice.text
            out["finish"] = choice.finish_reason or out["finish"]
        if chunk.usage is not None:
            out["tokens"] = chunk.usage.completion_tokens
        out["spec"] = _spec((chunk.model_extra or {}).get("sglext")) or out["spec"]
        out["chunks"] += 1
        if out["text"] and first_text is not None:
            first_text.set()
        if req["disconnect"] and out["text"]:
            resp.close()          # the client goes away mid-stream
            break
    return out


def _spec(sglext) -> dict | None:
    details = (sglext or {}).get("spec_tokens_details")
    return details[0] if isinstance(details, list) else details


class References:
    """The plain server's greedy answers, one per prompt and length (non-streaming: a stream yields the same text
    and count)."""

    def __init__(self, plain: Server):
        self.plain, self.cache = plain, {}

    def __call__(self, req: dict) -> dict:
        key = (req["prompt"], req["max_tokens"])
        if key not in self.cache:
            self.cache[key] = _send(self.plain, self.plain.client(), dict(req, stream=False), spec_details=False)
        return self.cache[key]


def _same(got: dict, ref: dict) -> bool:
    return (got["text"], got["finish"], got["tokens"]) == (ref["text"], ref["finish"], ref["tokens"])


def _concurrently(fn, items: list, guard_s: float = RUN_GUARD_S) -> list:
    """``fn(item)`` for every item in its own thread; results in order (an exception comes back as the result)."""
    results: list = [None] * len(items)

    def run(i):
        try:
            results[i] = fn(items[i])
        except Exception as e:          # reported by the caller with the request it belongs to
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(items))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + guard_s
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0))
    assert not any(t.is_alive() for t in threads), f"requests still running after {guard_s} s (hang guard)"
    return results


# -- metrics ----------------------------------------------------------------------------------------------------------
def _scrape(server: Server) -> dict:
    """``/metrics`` as ``{(sample name, sorted labels without model_name): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(server.get("/metrics")):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = out.get((s.name, labels), 0.0) + s.value
    return out


def _total(scrape: dict, name: str, label: str | None = None):
    """Sum of ``name`` over its series, or ``{label value: summed value}`` when ``label`` is given."""
    if label is None:
        return sum(v for (n, _), v in scrape.items() if n == name)
    out: dict = {}
    for (n, labels), v in scrape.items():
        if n == name:
            key = dict(labels)[label]
            out[key] = out.get(key, 0.0) + v
    return out


def _delta(after: dict, before: dict, name: str, label: str | None = None):
    if label is None:
        return _total(after, name) - _total(before, name)
    a, b = _total(after, name, label), _total(before, name, label)
    return {k: a[k] - b.get(k, 0.0) for k in a}


# -- bad input --------------------------------------------------------------------------------------------------------
BAD_INPUT = [
    # (what, path, body: bytes as they are, or a dict sent as JSON ("chat": True = a one-turn chat), words the
    # message must contain)
    ("invalid JSON", "/v1/completions", b'{"model": "m", "prompt": "hi",', ["JSON decode error"]),
    ("invalid JSON", "/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user"', ["JSON decode error"]),
    ("negative max_tokens", "/v1/completions", {"prompt": "hi", "max_tokens": -1}, ["max_tokens must be positive"]),
    ("negative max_tokens", "/v1/chat/completions", {"chat": True, "max_tokens": -1},
     ["max_new_tokens must be at least 0, got -1"]),
    ("huge max_tokens", "/v1/completions", {"prompt": "hi", "max_tokens": 10**9},
     ["exceeds the model's maximum context length of 1024 tokens"]),
    ("huge max_tokens", "/v1/chat/completions", {"chat": True, "max_tokens": 10**9},
     ["max_completion_tokens is too large"]),
    ("huge max_tokens, streaming", "/v1/completions", {"prompt": "hi", "max_tokens": 10**9, "stream": True},
     ["maximum context length"]),
    ("prompt longer than the context", "/v1/completions", {"prompt": "hello world " * 1500, "max_tokens": 4},
     ["is longer than the model's context length (1024 tokens)"]),
    ("prompt longer than the context", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hello world " * 1500}], "max_tokens": 4, "stream": True},
     ["is longer than the model's context length (1024 tokens)"]),
    ("empty messages", "/v1/chat/completions", {"messages": [], "max_tokens": 4}, ["Messages cannot be empty"]),
    ("negative temperature", "/v1/completions", {"prompt": "hi", "max_tokens": 4, "temperature": -1},
     ["temperature must be a non-negative"]),
    ("negative temperature", "/v1/chat/completions", {"chat": True, "max_tokens": 4, "temperature": -0.5},
     ["temperature must be a non-negative"]),
    ("top_p above 1", "/v1/completions", {"prompt": "hi", "max_tokens": 4, "top_p": 1.5},
     ["top_p must be in (0, 1]"]),
    ("top_p 0", "/v1/chat/completions", {"chat": True, "max_tokens": 4, "top_p": 0}, ["top_p must be in (0, 1]"]),
]
#: the server does not serve this name: OpenAI's 404 (``sglang_hybrid/http_guard.py``), every other refusal a 400
UNKNOWN_MODEL = "unknown model name"
BAD_INPUT += [
    # SGLang 0.5.23 would serve these two kinds; the request guard of ``serve`` refuses them as OpenAI's API does
    ("temperature 3, above OpenAI's maximum of 2", "/v1/completions",
     {"prompt": "hi", "max_tokens": 1, "temperature": 3}, ["temperature must be in [0, 2]", "got 3"]),
    ("temperature 2.5, streaming", "/v1/chat/completions",
     {"chat": True, "max_tokens": 1, "temperature": 2.5, "stream": True}, ["temperature must be in [0, 2]"]),
    (UNKNOWN_MODEL, "/v1/completions", {"prompt": "hi", "max_tokens": 1, "model": "no-such-model"},
     ["The model 'no-such-model' does not exist", "GET /v1/models"]),
    (UNKNOWN_MODEL, "/v1/chat/completions", {"chat": True, "max_tokens": 1, "model": "no-such-model"},
     ["The model 'no-such-model' does not exist"]),
]


def _raw(server: Server, path: str, body) -> tuple[int, dict | str]:
    """POST ``body`` over plain HTTP; returns (status, decoded JSON body, or the text when it is not JSON)."""
    if isinstance(body, dict):
        body = dict(body)
        if body.pop("chat", False):
            body["messages"] = [{"role": "user", "content": "hi"}]
        body.setdefault("model", server.model)
        body = json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_GUARD_S) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


# -- the runs ---------------------------------------------------------------------------------------------------------
def _load_plan() -> list:
    """8 clients x 3 requests: the code edits and the chat in turn, streaming and not; clients 0, 4 and 5 disconnect
    mid-stream on their second request (the chat, and a code edit each)."""
    plan = []
    for c in range(CLIENTS):
        reqs = []
        for j in range(REQUESTS_PER_CLIENT):
            drop = j == 1 and c in DISCONNECTING_CLIENTS
            reqs.append(_request((c + j) % len(PROMPTS), stream=drop or (c + j) % 2 == 1, max_tokens=LOAD_TOKENS,
                                 disconnect=drop))
        plan.append(reqs)
    return plan


@pytest.fixture(scope="module")
def load_run(servers):
    """The load, run once, with the malformed requests sent (and answered) while it is in flight; ``/metrics`` is
    scraped before and after."""
    hybrid, _ = servers
    before = _scrape(hybrid)
    plan = _load_plan()
    decoding, done = threading.Event(), threading.Event()

    def client_run(reqs):
        client = hybrid.client()
        return [_send(hybrid, client, r, spec_details=True, first_text=decoding) for r in reqs]

    def bad_input_run():
        assert decoding.wait(RUN_GUARD_S), "no load request ever produced text"
        rejected = [(what, path, *_raw(hybrid, path, body)) for what, path, body, _ in BAD_INPUT]
        return {"rejected": rejected, "in_flight": not done.is_set()}

    answers: list = []
    bad = threading.Thread(target=lambda: answers.append(_guarded(bad_input_run)), daemon=True)
    bad.start()
    clients = _concurrently(client_run, plan)
    done.set()
    bad.join(RUN_GUARD_S)
    assert not bad.is_alive(), f"malformed requests unanswered after {RUN_GUARD_S} s (hang guard)\n{hybrid.tail()}"
    return {"plan": plan, "results": clients, "bad": answers[0], "before": before, "after": _scrape(hybrid)}


def _guarded(fn):
    try:
        return fn()
    except Exception as e:          # reported by the test that reads it
        return e


@pytest.fixture(scope="module")
def next_run(servers, load_run):
    """After the load: a code edit through /v1/completions and the chat through /v1/chat/completions, streaming,
    in flight together, with ``/metrics`` scraped just before and after (nothing else runs then)."""
    hybrid, _ = servers
    with urllib.request.urlopen(hybrid.url + "/health", timeout=REQUEST_GUARD_S) as r:
        health = r.status
    reqs = [_request(CODE, stream=True), _request(CHAT, stream=True)]
    before = _scrape(hybrid)
    results = _concurrently(lambda r: _send(hybrid, hybrid.client(), r, spec_details=True), reqs)
    return {"health": health, "reqs": reqs, "results": results, "before": before, "after": _scrape(hybrid)}


@pytest.fixture(scope="module")
def references(servers):
    return References(servers[1])


# -- cases ------------------------------------------------------------------------------------------------------------
def test_server_load_with_disconnects_equal_plain_server(servers, load_run, references):
    """8 concurrent clients, 24 requests (code edits through /v1/completions and the chat through
    /v1/chat/completions, each streaming and not), 3 clients dropping their stream after its first text: every
    completed response equals the plain server's greedy answer, and speculation ran on each."""
    hybrid, _ = servers
    log = hybrid.log.read_text(errors="replace")
    assert all(twin in log for twin in TWIN_LOGS)                   # the twins ran, as asked
    completed, kinds = 0, set()
    for c, (reqs, res) in enumerate(zip(load_run["plan"], load_run["results"])):
        assert not isinstance(res, Exception), f"client {c}: {res!r}\n{hybrid.tail()}"
        for req, got in zip(reqs, res):
            if req["disconnect"]:
                assert got["text"] and got["finish"] is None, got          # left mid-stream
                continue
            ref = references(req)
            assert _same(got, ref), (c, req, got, ref)
            assert got["spec"] is not None and got["spec"]["spec_verify_ct"] >= 1, got   # speculation ran on it
            completed += 1
            kinds.add(("chat" if "messages" in PROMPTS[req["prompt"]] else "completions", req["stream"]))
    assert completed == CLIENTS * REQUESTS_PER_CLIENT - len(DISCONNECTING_CLIENTS)
    assert kinds == {(e, s) for e in ("chat", "completions") for s in (False, True)}


def test_server_bad_input_answered_4xx_while_requests_in_flight(load_run):
    """Malformed requests over raw HTTP, sent while the load was decoding: each answered 400 (an unknown model 404)
    with a message naming the problem (never a 500 or a hang), all of them before the load ended, so the load's
    requests (checked above) were in flight throughout."""
    bad = load_run["bad"]
    assert not isinstance(bad, Exception), repr(bad)
    assert bad["in_flight"], "the load ended before the malformed requests were answered"
    for (what, path, status, answer), (_, _, _, words) in zip(bad["rejected"], BAD_INPUT):
        assert status == (404 if what == UNKNOWN_MODEL else 400), (what, path, status, answer)
        if isinstance(answer, dict):        # SGLang's error body, or OpenAI's (``{"error": {...}}``) for the 404
            message = answer.get("message") or answer["error"]["message"]
        else:
            message = answer
        assert all(w in message for w in words), (what, path, message)


def test_server_healthy_after_load_serves_the_next_requests_equal_plain_server(servers, next_run, references):
    """After the load the server is healthy and serves the next requests (a code edit and the chat, 8 new tokens,
    streamed in pieces), each equal to the plain server and speculated on."""
    hybrid, _ = servers
    assert next_run["health"] == 200
    for req, res in zip(next_run["reqs"], next_run["results"]):
        assert not isinstance(res, Exception), f"{req}: {res!r}\n{hybrid.tail()}"
        ref = references(req)
        assert _same(res, ref), (req, res, ref)
        assert res["spec"] is not None and res["spec"]["spec_verify_ct"] >= 1, (req, res)
        assert res["chunks"] > 2, res


def test_server_metrics_add_up_to_the_responses(next_run, load_run):
    """HYBRID's counters on /metrics against what the responses report. Over the requests after the load, exactly:
    requests verified (all sources) = the responses' verify steps = SGLang's own ``sglang:spec_verify_calls_total``;
    accepted drafts = the responses' correct drafts; steps per width and per depth each sum to the decode steps;
    each verify step emits its accepted drafts plus one token (the prefill emits the first). Over the load, the three
    dropped requests add steps and drafts no response reports: fewer steps than one of them would have taken had it
    run to its end (so SGLang dropped them all), each step accepting at most MAX_DRAFTS_PER_STEP drafts."""
    got = next_run["results"]
    assert not any(isinstance(r, Exception) for r in got), got
    before, after = next_run["before"], next_run["after"]
    verify = sum(r["spec"]["spec_verify_ct"] for r in got)
    correct = sum(r["spec"]["spec_num_correct_drafts"] for r in got)
    steps = _delta(after, before, "sglang_hybrid_request_steps_total", "source")
    accepted = _delta(after, before, "sglang_hybrid_accepted_draft_tokens_total", "source")
    assert set(steps) == set(accepted) == SOURCES, (steps, accepted)
    assert sum(steps.values()) == verify > 0, (steps, got)
    assert sum(accepted.values()) == correct, (accepted, got)
    assert _delta(after, before, "sglang:spec_verify_calls_total") == verify
    emitted = sum(r["tokens"] - 1 for r in got)
    assert verify <= emitted <= verify + correct, (verify, correct, emitted)
    decode = _delta(after, before, "sglang_hybrid_decode_steps_total")
    assert max(r["spec"]["spec_verify_ct"] for r in got) <= decode <= verify
    assert sum(_delta(after, before, "sglang_hybrid_width_steps_total", "width").values()) == decode
    assert sum(_delta(after, before, "sglang_hybrid_depth_steps_total", "depth").values()) == decode
    assert _delta(after, before, "sglang_hybrid_ragged_verify_steps_total") <= decode
    ragged = {k: _delta(after, before, f"sglang_hybrid_ragged_{k}_total")
              for k in ("verify_tokens", "verify_rows", "padded_tokens")}
    assert ragged["verify_tokens"] <= min(ragged["padded_tokens"], ragged["verify_rows"]), ragged
    assert _total(after, "sglang_hybrid_fallbacks_total", "cause") == {cause: 0 for cause in FALLBACKS}
    assert 0 <= _total(after, "sglang_hybrid_padded_slot_fraction") < 1
    # each drafter's chain outcome: every verify tests each request's first EAGLE token (drafted at depth 1 or more,
    # and the target commits at least one token); of what was tested, no more accepted, nor priced, than tested
    chain = {k: _delta(after, before, f"sglang_hybrid_chain_tokens_{k}_total", "side")
             for k in ("tested", "accepted", "priced")}
    assert all(set(v) == {"model", "ngram"} for v in chain.values()), chain
    assert chain["tested"]["model"] >= sum(steps.values()), (chain, steps)
    for side in ("model", "ngram"):
        assert 0 <= chain["accepted"][side] <= chain["tested"][side], chain
        assert 0 <= chain["priced"][side] <= chain["tested"][side] + 1e-6, chain

    done = [g for reqs, res in zip(load_run["plan"], load_run["results"]) for r, g in zip(reqs, res)
            if not r["disconnect"]]
    load_verify = sum(g["spec"]["spec_verify_ct"] for g in done)
    load_correct = sum(g["spec"]["spec_num_correct_drafts"] for g in done)
    load_steps = _delta(load_run["after"], load_run["before"], "sglang_hybrid_request_steps_total")
    load_accepted = _delta(load_run["after"], load_run["before"], "sglang_hybrid_accepted_draft_tokens_total")
    dropped_steps = load_steps - load_verify
    # a dropped request left running decodes DISCONNECT_TOKENS tokens, at most 1 + MAX_DRAFTS_PER_STEP per step
    full_run_steps = -(-(DISCONNECT_TOKENS - 1) // (1 + MAX_DRAFTS_PER_STEP))
    assert 0 <= dropped_steps < full_run_steps, (load_verify, load_steps)
    assert 0 <= load_accepted - load_correct <= dropped_steps * MAX_DRAFTS_PER_STEP, (load_correct, load_accepted)
