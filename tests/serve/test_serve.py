"""`specq serve` against a live server on 127.0.0.1, called with the official openai client.

The server runs in a thread of this process (uvicorn on a free port) over tiny saved models, so
the tests can slow down or hold its workers (wrapping the engine's `step`) to test batching,
cancellation, timeouts and the queue bound. One test starts the real `specq serve` command in a
subprocess.
"""

from __future__ import annotations

import collections
import gc
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import specq
from specq.cli import main
from specq.core.decode import Sequence
from specq.drafters import TreeShape
from specq.loading.formats.save import save_native
from specq.model.llama import KVCache
from specq.serve.server import ServeConfig, build_app
from specq.serve import engine as engine_module

from conftest import perturbed, serve_in_thread, tiny_model

KEY = "sk-test-key"
OTHER_KEY = "sk-other-key"  # a second namespace: its requests never see KEY's
MAX_BATCH = 3
TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"  # the tiny vocabulary's "chat"
PROMPT = "t1 t2 t3"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    target = tiny_model(scale=3.0)
    target.tokenizer.chat_template = TEMPLATE
    save_native(target, root / "target")
    save_native(perturbed(target, 0.1), root / "draft")  # accepts some, rejects some
    return root


@pytest.fixture(scope="module")
def server(dirs):
    """(port, app) of a live server: the tiny target at fp32 and bf16 with the perturbed draft,
    decoding up to MAX_BATCH requests together per precision, open to two API keys."""
    config = ServeConfig(target=str(dirs / "target"), precisions=("fp32", "bf16"),
                         draft=str(dirs / "draft"), api_keys=(KEY, OTHER_KEY), queue=2,
                         timeout_s=30, max_batch=MAX_BATCH)
    app = build_app(config)
    port, stop = serve_in_thread(app)
    yield port, app
    stop()


@pytest.fixture(scope="module")
def models(dirs):
    """The same models loaded in-process, for `specq.generate`'s own outputs."""
    return {"fp32": specq.load(str(dirs / "target")), "bf16": specq.load(f"{dirs / 'target'}@bf16"),
            "draft": specq.load(str(dirs / "draft"))}


def client(port: int, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0,
                         timeout=30)


def name(dirs, precision: str = "fp32") -> str:
    return f"{dirs / 'target'}@{precision}"


def post(port: int, path: str, body, key: str | None = KEY) -> tuple[int, dict, dict]:
    """A raw request (bodies the openai client would refuse to send)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"}
                                                      if key else {})
    conn.request("POST", path, data, headers)
    response = conn.getresponse()
    return response.status, json.loads(response.read()), dict(response.getheaders())


def metric(port: int, family: str, **labels) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == family and labels.items() <= s.labels.items())


@pytest.fixture
def slow_steps(monkeypatch):
    """Every decoding step of the server's engines sleeps `delay[0]` seconds first; `delay[1:]`
    records how many requests each step advanced."""
    real, delay = engine_module.step, [0.05]

    def slow(sequences, **options):
        time.sleep(delay[0])
        delay.append(len(sequences))
        speculated.append((len(sequences), options.get("speculate", True)))
        return real(sequences, **options)

    speculated = slow.speculated = []

    monkeypatch.setattr(engine_module, "step", slow)
    # (requests, speculate) per step
    monkeypatch.setattr(engine_module, "speculated", speculated, raising=False)
    return delay


def test_models_health_and_bare_name(server, dirs):
    port, _ = server
    assert [m.id for m in client(port).models.list().data] == [name(dirs, "fp32"),
                                                               name(dirs, "bf16")]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    out = client(port).completions.create(model=str(dirs / "target"), prompt=PROMPT, max_tokens=3,
                                          temperature=0)
    assert out.model == name(dirs, "fp32")  # the bare target name is the first precision


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_greedy_equals_generate_token_for_token(server, dirs, models, precision):
    port, _ = server
    c = client(port)
    want = specq.generate(models[precision], PROMPT, models["draft"], max_new_tokens=20)
    plain = specq.generate(models[precision], PROMPT, None, max_new_tokens=20)
    assert want.token_ids == plain.token_ids
    out = c.completions.create(model=name(dirs, precision), prompt=PROMPT, max_tokens=20,
                               temperature=0)
    assert out.choices[0].text == want.text and out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(want.prompt_ids), 20)
    # speculative, both outcomes
    assert 0 < out.model_extra["specq"]["accepted"] < out.model_extra["specq"]["drafted"]
    streamed = c.completions.create(model=name(dirs, precision), prompt=PROMPT, max_tokens=20,
                                    temperature=0, stream=True)
    chunks = list(streamed)
    assert "".join(ch.choices[0].text for ch in chunks) == want.text and len(chunks) > 2
    assert chunks[-1].choices[0].finish_reason == "length"
    chat = specq.generate(models[precision], PROMPT, models["draft"], max_new_tokens=20, chat=True)
    messages = [{"role": "user", "content": PROMPT}]
    out = c.chat.completions.create(model=name(dirs, precision), messages=messages, max_tokens=20,
                                    temperature=0)
    assert (out.choices[0].message.content == chat.text
            and out.choices[0].message.role == "assistant")
    parts = list(c.chat.completions.create(model=name(dirs, precision), messages=messages,
                                           max_tokens=20, temperature=0, stream=True,
                                           stream_options={"include_usage": True}))
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == chat.text
    assert parts[-1].choices == [] and parts[-1].usage.completion_tokens == 20


def test_gamma_auto_learns_across_requests(server, dirs):
    """A served target keeps gamma auto's estimates across its requests (its engine's memory, the
    pool's for that precision): each greedy request's run keeps what it learned for the next."""
    port, app = server
    engine = app.state.engines[name(dirs)]
    assert engine.gamma_memory is engine.pool.gamma_memory("fp32")
    before = dict(engine.gamma_memory._kept)  # the warm-up's
    client(port).completions.create(model=name(dirs), prompt=PROMPT, max_tokens=8, temperature=0)
    after = engine.gamma_memory._kept
    assert after and any(before.get(key) is not chooser for key, chooser in after.items())


def test_request_extensions_keep_the_output(server, dirs, models):
    port, _ = server
    c = client(port)
    want = specq.generate(models["fp32"], PROMPT, None, max_new_tokens=16).text
    for extra in ({"speculative": False}, {"draft": None}, {"gamma": 4}, {"gamma": "auto"},
                  {"tree": 6, "tree_depth": 3, "tree_topk": 2},
                  {"draft": str(dirs / "draft"), "gamma": 1}):
        out = c.completions.create(model=name(dirs), prompt=PROMPT, max_tokens=16, temperature=0,
                                   extra_body=extra)
        assert out.choices[0].text == want, extra
        assert ((out.model_extra["specq"]["draft"] is None)
                == (extra in ({"speculative": False}, {"draft": None})))


def test_sampling_follows_the_seed(server, dirs, models):
    port, _ = server
    want = specq.generate(models["fp32"], PROMPT, models["draft"], max_new_tokens=16,
                          temperature=0.9, top_p=0.95, top_k=8, seed=7).text
    for _ in range(2):
        out = client(port).completions.create(model=name(dirs), prompt=PROMPT, max_tokens=16,
                                              temperature=0.9, top_p=0.95, seed=7,
                                              extra_body={"top_k": 8})
        assert out.choices[0].text == want


def test_stop_strings_cut_streamed_and_whole_text(server, dirs, models):
    port, _ = server
    c = client(port)
    text = specq.generate(models["fp32"], PROMPT, None, max_new_tokens=20).text
    stop = text.split()[6]
    want = text[:text.find(stop)]  # up to the stop string's first occurrence
    assert want
    out = c.completions.create(model=name(dirs), prompt=PROMPT, max_tokens=20, temperature=0,
                               stop=[stop])
    assert out.choices[0].text == want and out.choices[0].finish_reason == "stop"
    chunks = list(c.completions.create(model=name(dirs), prompt=PROMPT, max_tokens=20,
                                       temperature=0, stop=stop, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


BAD = [  # (endpoint, body, status, the param or code the error names)
    ("completions", {"model": "no-such-model", "prompt": "t1"}, 404, "model_not_found"),
    ("completions", {"model": "M", "prompt": "t1", "max_tokens": -5}, 400, "max_tokens"),
    ("completions", b'{"model": "M", "prompt": "t1"', 400, "invalid_json"),
    ("completions", {"model": "M", "prompt": "t1", "max_tokens": "5"}, 400, "max_tokens"),
    ("completions", {"model": "M", "prompt": "t1", "temperature": "hot"}, 400, "temperature"),
    ("completions", {"model": "M", "prompt": 42}, 400, "prompt"),
    ("completions", {"model": "M", "prompt": " ".join(["t5"] * 600), "max_tokens": 4}, 400,
     "context_length_exceeded"),
    ("completions", {"model": "M", "prompt": "t1", "logit_bias": {"5": 1}}, 400, "logit_bias"),
    ("completions", {"model": "M", "prompt": "t1", "n": 2}, 400, "n"),
    ("completions", {"model": "M", "prompt": "t1", "gamma": 0}, 400, "gamma"),
    ("completions", {"model": "M", "prompt": "t1", "draft": "/etc"}, 400, "draft_not_found"),
    ("completions", {"model": "M", "prompt": "t1", "tree": 4, "gamma": 2}, 400, "gamma"),
    ("completions", {"model": "M", "prompt": "   "}, 400, None),
    ("completions", {"model": "M", "prompt": [3, 999]}, 400, None),
    ("completions", [1, 2], 400, None),
    ("chat/completions", {"model": "M"}, 400, "messages"),
    ("chat/completions", {"model": "M", "messages": []}, 400, "messages"),
    ("chat/completions", {"model": "M", "messages": [{"role": "tool", "content": "x"}]}, 400,
     "messages.0.role"),
    ("chat/completions",
     {"model": "M", "messages": [{"role": "user", "content": "t1"}], "tools": []}, 400, "tools"),
    ("completions", {"model": "M", "prompt": "t1", "temperature": float("nan")}, 400,
     "temperature"),
    ("completions", {"model": "M", "prompt": "t1", "top_p": float("inf")}, 400, "top_p"),
    ("chat/completions",
     {"model": "M", "messages": [{"role": "user", "content": "t1"}], "max_tokens": 2,
      "max_completion_tokens": 2}, 400, "max_tokens"),
    ("completions", {"model": "M", "prompt": "t1", "speculative": False, "gamma": 2}, 400,
     "speculative"),
    ("completions", {"model": "M", "prompt": "t1", "tree_depth": 2}, 400, "tree"),
]


@pytest.mark.parametrize("endpoint,body,status,names", BAD)
def test_bad_requests_get_openai_errors_and_the_server_stays_up(server, dirs, endpoint, body,
                                                                status, names):
    port, _ = server
    if isinstance(body, dict):
        body = {k: name(dirs) if v == "M" else v for k, v in body.items()}
    got, reply, _ = post(port, f"/v1/{endpoint}", body)
    assert got == status, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert isinstance(error["code"], str) and error["code"], error  # a client can branch on it
    assert names is None or names in (error["param"], error["code"]), error
    out = client(port).completions.create(model=name(dirs), prompt=PROMPT, max_tokens=2,
                                          temperature=0)
    assert out.usage.completion_tokens == 2


def test_a_number_that_is_not_finite_is_named_as_such(server, dirs):
    port, _ = server
    got, reply, _ = post(port, "/v1/completions",
                         {"model": name(dirs), "prompt": "t1", "temperature": float("nan")})
    assert (got == 400 and "finite" in reply["error"]["message"]
            and "nan" in reply["error"]["message"]), reply
    assert "100" not in reply["error"]["message"]


def test_errors_outside_the_routes_carry_a_code_too(server):
    port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/v1/no-such-route", headers={"Authorization": f"Bearer {KEY}"})
    response = conn.getresponse()
    assert response.status == 404 and json.loads(response.read())["error"]["code"] == "not_found"


def test_a_broken_model_folder_is_refused_before_the_server_binds(dirs, tmp_path, capsys):
    import shutil

    shutil.copytree(dirs / "target", tmp_path / "broken")
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"\x00" * 64)
    for args in (["--target", tmp_path / "broken"],
                 ["--target", dirs / "target", "--draft", tmp_path / "broken"]):
        assert main(["serve", *map(str, args), "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not a readable safetensors file" in err, err


def test_the_client_raises_its_usual_errors(server, dirs):
    port, _ = server
    with pytest.raises(openai.NotFoundError):
        client(port).completions.create(model="gpt-4", prompt="t1")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client(port).chat.completions.create(model=name(dirs),
                                             messages=[{"role": "user", "content": "t1"}],
                                             max_tokens=-1)


def test_api_key_is_required(server, dirs):
    port, _ = server
    for key in (None, "wrong"):
        status, reply, _ = post(port, "/v1/completions", {"model": name(dirs), "prompt": "t1"},
                                key=key)
        assert status == 401 and reply["error"]["code"] == "invalid_api_key"
    status, _, _ = post(port, "/v1/completions", b"{not json", key=None)
    assert status == 401  # before the body is read
    with pytest.raises(openai.AuthenticationError):
        client(port, key="wrong").models.list()
    with pytest.raises(openai.AuthenticationError):  # both keys in one is neither
        client(port, key=f"{KEY},{OTHER_KEY}").models.list()
    assert client(port, key=OTHER_KEY).models.list().data  # either key opens the server


def test_a_client_that_disconnects_cancels_its_generation(server, dirs, slow_steps):
    port, _ = server
    aborted = metric(port, "specq:request_success_total", finished_reason="abort")
    started = time.monotonic()
    stream = client(port).completions.create(model=name(dirs), prompt=PROMPT, max_tokens=400,
                                             temperature=0, stream=True,
                                             extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    while metric(port, "specq:request_success_total", finished_reason="abort") == aborted:
        assert time.monotonic() - started < 10, "the generation was not cancelled"
        time.sleep(0.05)
    assert time.monotonic() - started < 400 * slow_steps[0] / 3  # far from running its 400 tokens
    # not streamed: hang up while it runs
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/completions",
                 json.dumps({"model": name(dirs), "prompt": PROMPT, "max_tokens": 400,
                             "ignore_eos": True}),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    time.sleep(0.3)
    conn.close()
    started = time.monotonic()
    while metric(port, "specq:request_success_total", finished_reason="abort") == aborted + 1:
        assert time.monotonic() - started < 5, "the generation was not cancelled"
        time.sleep(0.05)
    slow_steps[0] = 0
    out = client(port).completions.create(model=name(dirs), prompt=PROMPT, max_tokens=2,
                                          temperature=0)
    assert out.usage.completion_tokens == 2


def test_timeout_ends_whole_and_streamed_requests(server, dirs, slow_steps):
    port, app = server
    engine = app.state.engines[name(dirs)]
    engine.timeout_s = 0.3
    try:
        status, reply, _ = post(port, "/v1/completions",
                                {"model": name(dirs), "prompt": PROMPT, "max_tokens": 200})
        assert status == 504 and reply["error"]["code"] == "timeout"
        with pytest.raises(openai.APIError, match="timeout"):
            for _ in client(port).completions.create(model=name(dirs), prompt=PROMPT,
                                                     max_tokens=200, stream=True):
                pass
    finally:
        engine.timeout_s = 30


def test_a_full_queue_answers_429(server, dirs, monkeypatch):
    """Requests beyond the running ones (at most MAX_BATCH) and the queue's 2 get a 429."""
    port, app = server
    engine = app.state.engines[name(dirs)]
    gate, real = threading.Event(), engine_module.step
    monkeypatch.setattr(engine_module, "step",
                        lambda sequences, **options: gate.wait(30) and real(sequences, **options))
    request = dict(model=name(dirs), prompt=PROMPT, max_tokens=3, temperature=0)
    with ThreadPoolExecutor(MAX_BATCH + 2) as pool:
        accepted = []
        for _ in range(MAX_BATCH + 3):  # one at a time, each running or queued before the next
            accepted.append(pool.submit(client(port).completions.create, **request))
            while (len(engine.running) + len(engine.waiting) < len(accepted)
                   and not accepted[-1].done()):
                time.sleep(0.01)
            if accepted[-1].done():
                break
        with pytest.raises(openai.RateLimitError):
            accepted.pop().result()
        assert 1 <= len(engine.running) <= MAX_BATCH and len(engine.waiting) == 2
        assert metric(port, "specq:num_requests_waiting", model=name(dirs)) == 2
        status, reply, headers = post(port, "/v1/completions", request)
        assert (status == 429 and reply["error"]["code"] == "queue_full"
                and headers["retry-after"] == "1")
        gate.set()
        assert [f.result().usage.completion_tokens for f in accepted] == [3] * len(accepted)


def test_a_client_that_leaves_the_queue_gives_its_place_to_the_next(server, dirs, monkeypatch):
    """A running request held in its step (the worker admits none meanwhile), the queue's 2
    places taken by clients that then hang up: the next request waits in their place (no 429)
    and runs once the worker moves on."""
    port, app = server
    engine = app.state.engines[name(dirs)]
    gate, real = threading.Event(), engine_module.step
    monkeypatch.setattr(engine_module, "step",
                        lambda sequences, **options: gate.wait(30) and real(sequences, **options))
    request = dict(model=name(dirs), prompt=PROMPT, max_tokens=3, temperature=0)
    left = metric(port, "specq:request_rejected_total", model=name(dirs), reason="abort")
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(client(port).completions.create, **request)
        while not engine.running:
            time.sleep(0.01)
        leaving = []
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/v1/completions", json.dumps(request),
                         {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
            leaving.append(conn)
        while len(engine.waiting) < 2:
            time.sleep(0.01)
        for conn in leaving:
            conn.close()
        started = time.monotonic()
        while not all(job.cancelled for job in list(engine.waiting)):  # seen within a poll
            assert time.monotonic() - started < 5, "the server did not see the clients leave"
            time.sleep(0.05)
        last = pool.submit(client(port).completions.create, **request)
        while not last.done() and len(engine.waiting) != 1:
            time.sleep(0.01)
        assert not last.done(), last.exception()  # waiting, not refused
        assert metric(port, "specq:request_rejected_total", model=name(dirs),
                      reason="abort") == left + 2
        gate.set()
        assert [f.result().usage.completion_tokens for f in (running, last)] == [3, 3]
    assert metric(port, "specq:num_requests_waiting", model=name(dirs)) == 0


def live_requests() -> collections.Counter:
    """What requests' state is alive in this process: the engine's requests, their sequences,
    drafters and KV caches (targets' and drafts')."""
    return collections.Counter(type(o).__name__ for o in gc.get_objects()
                               if type(o) in (engine_module.Running, Sequence, KVCache)
                               or str(type(o).__module__).startswith("specq.drafters."))


def test_requests_that_end_free_their_caches_at_once(server, dirs, monkeypatch):
    """A batch of requests (completed, hung up mid-stream, refused with a 429) leaves none of its
    sequences and caches alive once the server is idle, with the garbage collector off: each is
    freed as it ends (kept until a full collection, which a server with large models loaded
    seldom makes, each request's caches would grow the server's memory)."""
    port, app = server
    engine = app.state.engines[name(dirs)]
    stepping, gate, real = threading.Event(), threading.Event(), engine_module.step

    def held(sequences, **options):  # each step waits for the gate, then a little
        stepping.set()
        gate.wait(30)
        time.sleep(0.02)
        return real(sequences, **options)

    monkeypatch.setattr(engine_module, "step", held)
    request = dict(model=name(dirs), prompt=PROMPT, max_tokens=3, temperature=0)
    gate.set()
    client(port).completions.create(**request)  # the key's first request makes what all keep
    gc.collect()
    before, collecting = live_requests(), gc.isenabled()
    assert not before["Sequence"], before  # an idle server holds no request, not even its last
    gc.disable()
    try:
        aborted = metric(port, "specq:request_success_total", finished_reason="abort")
        stream = client(port).completions.create(**request | {"max_tokens": 400}, stream=True,
                                                 extra_body={"ignore_eos": True})
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()
        started = time.monotonic()
        while metric(port, "specq:request_success_total", finished_reason="abort") == aborted:
            assert time.monotonic() - started < 10, "the generation was not cancelled"
            time.sleep(0.05)
        gate.clear()
        stepping.clear()
        with ThreadPoolExecutor(3) as pool:
            accepted = [pool.submit(client(port).completions.create, **request)]
            assert stepping.wait(10)  # the worker holds it in a step: the next two wait
            accepted += [pool.submit(client(port).completions.create, **request)
                         for _ in range(2)]
            while len(engine.waiting) < 2:
                assert not any(f.done() for f in accepted)
                time.sleep(0.01)
            with pytest.raises(openai.RateLimitError):
                client(port).completions.create(**request)
            gate.set()
            assert [f.result().usage.completion_tokens for f in accepted] == [3, 3, 3]
        started = time.monotonic()
        while (alive := live_requests()) != before:  # the worker may still be ending the last
            assert time.monotonic() - started < 10, (alive, before)
            time.sleep(0.05)
    finally:
        if collecting:
            gc.enable()


def test_concurrent_requests_are_batched_and_each_gets_its_own_output(server, dirs, models,
                                                                      slow_steps):
    """Greedy requests with different prompts, lengths, gammas and drafts (plain, chains, gamma
    auto, a token tree), sent at once: the engine steps them together, and each gets exactly what
    `specq.generate` gives it alone."""
    port, _ = server
    target, draft = models["fp32"], models["draft"]
    prompts = ["t1 t2 t3", "t9 t4", "t5 t5 t5 t6 t7", "t30 t2", "t11 t12 t13 t14"]
    cases = [({"speculative": False}, dict(draft=None)), ({}, dict(draft=draft)),
             ({"gamma": 1}, dict(draft=draft, gamma=1)), ({"gamma": 4}, dict(draft=draft, gamma=4)),
             ({"gamma": "auto"}, dict(draft=draft, gamma="auto")),
             ({"tree": 6, "tree_depth": 3}, dict(draft=draft, tree=TreeShape(6, 3, 2)))]
    jobs = [(prompts[i % len(prompts)], 12 + 5 * i, extra, options)
            for i, (extra, options) in enumerate(cases)]
    want = [specq.generate(target, prompt, max_new_tokens=n, **options).text
            for prompt, n, _, options in jobs]
    slow_steps[0] = 0.02

    def ask(job) -> str:  # more requests than running + queued: a 429 is retried after a second
        prompt, n, extra, _ = job
        out = client(port).with_options(max_retries=5).completions.create(
            model=name(dirs), prompt=prompt, max_tokens=n, temperature=0, extra_body=extra)
        return out.choices[0].text

    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(ask, jobs))
    assert got == want
    # steps advanced several requests at once, never more than the cap
    assert max(slow_steps[1:]) == MAX_BATCH


def test_spec_max_batch_makes_larger_steps_plain(server, dirs, models, slow_steps):
    """`--spec-max-batch 1`: a step of two or more requests decodes plainly, a lone request still
    speculates, and every greedy request gets `specq.generate`'s output."""
    port, app = server
    engine = app.state.engines[name(dirs)]
    target, draft = models["fp32"], models["draft"]
    jobs = [("t1 t2 t3", 14), ("t9 t4", 20), ("t5 t5 t5 t6 t7", 26)]
    want = [specq.generate(target, prompt, draft, max_new_tokens=n).text for prompt, n in jobs]
    slow_steps[0] = 0.02
    default, engine.spec_max_batch = engine.spec_max_batch, 1
    try:
        with ThreadPoolExecutor(len(jobs)) as pool:
            got = list(pool.map(lambda job: client(port).completions.create(
                model=name(dirs), prompt=job[0], max_tokens=job[1], temperature=0).choices[0].text,
                                jobs))
    finally:
        engine.spec_max_batch = default
    assert got == want
    steps = engine_module.speculated
    assert {n > 1 for n, _ in steps} == {True, False}  # both kinds of step happened
    assert all(speculate == (n == 1) for n, speculate in steps)


def test_metrics_count_drafted_and_accepted_tokens(server, dirs):
    port, _ = server
    labels = dict(model=name(dirs), draft=str(dirs / "draft"))
    before = {m: metric(port, m, **labels) for m in ("specq:spec_decode_num_draft_tokens_total",
                                                     "specq:spec_decode_num_accepted_tokens_total",
                                                      "specq:spec_decode_num_accepted_tokens_per_"
                                                      "pos_total",
                                                     "specq:generation_tokens_total",
                                                     "specq:e2e_request_latency_seconds_count")}
    client(port).completions.create(model=name(dirs), prompt=PROMPT, max_tokens=24, temperature=0,
                                    # greedy's default, auto, may find drafting does not pay
                                    extra_body={"gamma": 2})
    after = {m: metric(port, m, **labels) for m in before}
    assert all(after[m] > before[m] for m in before), (before, after)
    assert after["specq:generation_tokens_total"] - before["specq:generation_tokens_total"] == 24
    grew = {m.removeprefix("specq:spec_decode_num_"): after[m] - before[m] for m in before}
    assert grew["accepted_tokens_total"] == grew["accepted_tokens_per_pos_total"]


def test_the_serve_command(dirs):
    env = dict(os.environ, SPECQ_API_KEY=KEY)
    proc = subprocess.Popen([sys.executable, "-m", "specq.cli", "serve", "--target",
                             str(dirs / "target"), "--port", "0", "--threads", "1"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        port = None
        for line in proc.stderr:
            if m := re.search(r"on http://127\.0\.0\.1:(\d+)", line):
                port = int(m.group(1))
            if "startup complete" in line:
                break
        assert port, "the server did not start"
        out = client(port).chat.completions.create(model=str(dirs / "target"), temperature=0,
                                                   max_tokens=5,
                                                   messages=[{"role": "user", "content": PROMPT}])
        # no registered draft, no smaller model with its tokenizer: the n-gram lookup
        assert out.usage.completion_tokens == 5
        assert out.model_extra["specq"]["draft"] == "ngram:n=2-3:k=4:c=16"
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_port_in_use_is_one_line_before_any_model_loads(capsys):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        code = main(["serve", "--target", "smollm2-135m", "--port", str(held.getsockname()[1])])
    err = capsys.readouterr().err
    assert code == 2 and "cannot listen" in err and err.count("\n") == 1


def byte_tokenizer():
    """One token per byte, decoded as GPT-2 style byte-level tokenizers do (half
    a character: U+FFFD)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.mark.parametrize("text,stop,sent", [
    ("café au lait ☕ done", None, "café au lait ☕ done"),
    ("one two, three", ["o, th"], "one tw"),  # the stop string spans tokens
    ("aab aab aac", ["aac", "zz"], "aab aab "),  # "aa" is held back twice, then sent
])
def test_streamed_text_never_sends_what_it_must_take_back(text, stop, sent):
    from specq.core.stopping import trim_at_stop
    from specq.serve.text import TextStream

    tok = byte_tokenizer()
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and len(ids) == len(text.encode())
    stream, deltas = TextStream(tok, stop), []
    for i in ids:  # one token per step
        deltas.append(stream.push([i]))
        assert "\ufffd" not in deltas[-1]
        assert not any(s in "".join(deltas) for s in stop or [])
    deltas.append(stream.finish(trim_at_stop(text, stop)))
    assert "".join(deltas) == sent


def test_concurrent_requests_to_both_precisions(server, dirs, models):
    port, _ = server
    want = {p: specq.generate(models[p], PROMPT, models["draft"], max_new_tokens=30).text
            for p in ("fp32", "bf16")}

    def ask(precision: str) -> str:
        out = client(port).completions.create(model=name(dirs, precision), prompt=PROMPT,
                                              max_tokens=30, temperature=0)
        return out.choices[0].text

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(ask, ["fp32", "bf16", "bf16", "fp32"]))
    assert got == [want["fp32"], want["bf16"], want["bf16"], want["fp32"]]
