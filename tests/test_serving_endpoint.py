"""The OpenAI-compatible serving endpoint: the real `openai` client against it (completions,
chat, streaming), malformed and oversized requests -> 4xx naming the problem, a failing
request leaves the server up. Fast tests use a stand-in executor (tests/fake_serving.py);
the slow one runs the real co-serving executor with the tiny serving model."""
from __future__ import annotations

import json
import shutil
import time

import httpx
import openai
import pytest

from executors.coserving.endpoint.app import endpoint_address, start_endpoint, stop_endpoint
from tests.stack_fixtures import shared_models
from fake_serving import FAIL_ID, FakeServingExecutor, expected_ids, fake_model_dir, post_all

CONTEXT = 256


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    ex = FakeServingExecutor()
    model = fake_model_dir(tmp_path_factory.mktemp("m") / "tiny-serving", context=CONTEXT)
    from transformers import AutoTokenizer

    ep = start_endpoint(ex, model, worker="fake-0")
    yield ep, ex, AutoTokenizer.from_pretrained(str(model))
    stop_endpoint("fake-0")


@pytest.fixture()
def client(fake):
    return openai.OpenAI(base_url=fake[0].url + "/v1", api_key="unused", max_retries=0)


def test_address_is_reported_for_the_plugin(fake):
    ep = fake[0]
    assert endpoint_address("fake-0") == ep.url and endpoint_address() is not None
    assert endpoint_address("no-such-worker") is None
    assert ep.url.startswith("http://127.0.0.1:")
    assert httpx.get(ep.url + "/health").json()["status"] == "ok"


def test_completion_with_token_ids_and_text(fake, client):
    _, ex, tok = fake
    r = client.completions.create(model="tiny-serving", prompt=[5, 6, 9], max_tokens=4,
                                  temperature=0.0, extra_body={"ignore_eos": True})
    ids = expected_ids([5, 6, 9], 4)
    assert r.choices[0].text == tok.decode(ids, skip_special_tokens=True)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 4)
    assert ex.submitted[-1] == ([5, 6, 9], 4, True, 0.0)
    client.completions.create(model="tiny-serving", prompt="hello world", max_tokens=2)
    assert ex.submitted[-1][0] == tok.encode("hello world", add_special_tokens=False)
    assert ex.submitted[-1][3] == 1.0  # OpenAI's default temperature


def test_chat_uses_the_chat_template(fake, client):
    _, ex, tok = fake
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    r = client.chat.completions.create(model="tiny-serving", messages=msgs, max_tokens=3)
    text = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n" \
           "<|im_start|>assistant\n"
    prompt = tok.encode(text, add_special_tokens=False)
    assert ex.submitted[-1][:2] == (prompt, 3)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == tok.decode(expected_ids(prompt, 3),
                                                      skip_special_tokens=True)
    # No max_tokens in a chat: the rest of the context (vLLM's rule).
    client.chat.completions.create(model="tiny-serving", messages=msgs)
    assert ex.submitted[-1][1] == CONTEXT - len(prompt)


def test_streaming_sends_one_chunk_per_token(fake, client):
    _, _, tok = fake
    chunks = list(client.completions.create(model="tiny-serving", prompt=[5, 6, 9], max_tokens=5,
                                            stream=True, stream_options={"include_usage": True}))
    token_chunks = [c for c in chunks if c.choices and c.choices[0].finish_reason is None]
    assert len(token_chunks) == 5
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == tok.decode(expected_ids([5, 6, 9], 5), skip_special_tokens=True)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 5
    chat = list(client.chat.completions.create(
        model="tiny-serving", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        stream=True))
    assert chat[0].choices[0].delta.role == "assistant"
    assert chat[-1].choices[0].finish_reason == "length"
    assert sum(1 for c in chat if c.choices[0].finish_reason is None) == 3


BAD = [  # (raw body, status, words the message must contain)
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"model": "tiny-serving"}), 400, "missing required field 'prompt'"),
    (json.dumps({"model": "gpt-4", "prompt": "hi"}), 404, "model 'gpt-4' does not exist"),
    (json.dumps({"model": "tiny-serving", "prompt": "hi", "max_tokens": 0}), 400,
     "max_tokens must be at least 1"),
    (json.dumps({"model": "tiny-serving", "prompt": "hi", "max_tokens": "5"}), 400,
     "invalid 'max_tokens'"),
    (json.dumps({"model": "tiny-serving", "prompt": [1, 2], "max_tokens": CONTEXT}), 400,
     "max_tokens is too large"),
    (json.dumps({"model": "tiny-serving", "prompt": [3] * CONTEXT}), 400, "prompt is too long"),
    (json.dumps({"model": "tiny-serving", "prompt": [1, 300]}), 400, "outside the vocabulary"),
    (json.dumps({"model": "tiny-serving", "prompt": ""}), 400, "prompt is empty"),
    (json.dumps({"model": "tiny-serving", "prompt": "hi", "temperature": "hot"}), 400,
     "invalid 'temperature'"),
    (json.dumps({"model": "tiny-serving", "prompt": "hi", "temperature": 3}), 400,
     "invalid 'temperature'"),
    (json.dumps({"model": "tiny-serving", "prompt": "hi", "stream": "yes"}), 400, "invalid 'stream'"),
    (json.dumps({"model": "tiny-serving", "prompt": "hi", "n": 2}), 400, "'n'=2 is not supported"),
    (json.dumps({"model": "tiny-serving", "prompt": ["a", "b"]}), 400, "batched prompts"),
]


@pytest.mark.parametrize("body,status,words", BAD)
def test_bad_completion_requests_get_openai_errors(fake, body, status, words):
    r = httpx.post(fake[0].url + "/v1/completions", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert words in err["message"] and err["type"] == "invalid_request_error"


def test_bad_chat_requests(fake, client):
    url = fake[0].url + "/v1/chat/completions"
    r = httpx.post(url, json={"model": "tiny-serving", "messages": []})
    assert r.status_code == 400 and "invalid 'messages'" in r.json()["error"]["message"]
    r = httpx.post(url, json={"model": "tiny-serving", "messages": [{"role": "bot", "content": "x"}]})
    assert r.status_code == 400 and "messages.0.role" in r.json()["error"]["message"]
    long = [{"role": "user", "content": "hello world " * CONTEXT}]
    with pytest.raises(openai.BadRequestError, match="prompt is too long"):
        client.chat.completions.create(model="tiny-serving", messages=long, max_tokens=1)
    r = httpx.get(fake[0].url + "/v1/nothing-here")
    assert r.status_code == 404 and "error" in r.json()


def test_a_failing_request_does_not_kill_the_server(fake, client):
    with pytest.raises(openai.InternalServerError, match="simulated engine failure"):
        client.completions.create(model="tiny-serving", prompt=[FAIL_ID, 1], max_tokens=2)
    stream = client.completions.create(model="tiny-serving", prompt=[FAIL_ID, 1], max_tokens=2,
                                       stream=True)
    with pytest.raises(openai.APIError, match="simulated engine failure"):
        list(stream)
    r = client.completions.create(model="tiny-serving", prompt=[5], max_tokens=2)
    assert r.choices[0].finish_reason == "length"


def test_metrics_in_prometheus_text(fake, client):
    client.completions.create(model="tiny-serving", prompt=[5, 6], max_tokens=3)
    httpx.post(fake[0].url + "/v1/completions", content=b"{bad")
    text = httpx.get(fake[0].url + "/metrics").text
    lines = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
             if ln and not ln.startswith("#")}
    assert lines['rose_serving_requests_total{route="/v1/completions",status="200"}'] >= 1
    assert lines['rose_serving_requests_total{route="/v1/completions",status="400"}'] >= 1
    assert lines["rose_serving_ttft_seconds_count"] >= 1
    assert lines["rose_coserving_rollout_tokens"] == 123  # from executor.metrics()
    assert lines["rose_coserving_admission_refused"] == 2


def test_a_client_leaving_mid_stream_aborts_its_request(fake):
    ep, ex, _ = fake
    body = {"model": "tiny-serving", "prompt": [5], "max_tokens": 200, "stream": True}
    token_s, ex.token_s = ex.token_s, 0.05  # 10 s of tokens: the request outlives the server's noticing
    try:
        with httpx.stream("POST", ep.url + "/v1/completions", json=body) as resp:
            first = next(resp.iter_lines())
            rid = json.loads(first[len("data: "):])["id"]
        deadline = time.monotonic() + 10
        while rid not in ex.aborted and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        ex.token_s = token_s
    assert rid in ex.aborted
    assert ex.futures[rid].result().finish_reason == "abort"


@pytest.mark.slow
@pytest.mark.models
def test_real_executor_behind_the_endpoint(tmp_path_factory):
    """The tiny serving model in a serving-only co-serving executor, through the openai client."""
    from executors.coserving.executor import CoServingConfig, CoServingExecutor

    src = shared_models(tmp_path_factory)  # built once per session
    models = tmp_path_factory.mktemp("endpoint-models")  # a copy: the executor profiles into it
    policy, serving = (shutil.copytree(src / name, models / name) for name in ("policy", "serving"))
    cfg = CoServingConfig(serving, policy, mode="serving_only", max_model_len=512,
                          chunk_tokens=256, max_num_seqs=8, profile_repeats=1)
    ex = CoServingExecutor(cfg, worker="real-0")
    try:
        ep = start_endpoint(ex, serving, worker="real-0")
        client = openai.OpenAI(base_url=ep.url + "/v1", api_key="unused", max_retries=0)
        r = client.completions.create(model="serving", prompt=[5, 6, 7], max_tokens=6,
                                      temperature=0.0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"
        again = client.completions.create(model="serving", prompt=[5, 6, 7], max_tokens=6,
                                          temperature=0.0, extra_body={"ignore_eos": True})
        assert again.choices[0].text == r.choices[0].text  # greedy: same engine, same text
        chunks = list(client.chat.completions.create(
            model="serving", messages=[{"role": "user", "content": "Where is the goal?"}],
            max_tokens=5, stream=True, extra_body={"ignore_eos": True}))
        assert sum(1 for c in chunks if c.choices[0].finish_reason is None) == 5
        with pytest.raises(openai.BadRequestError, match="max_tokens is too large"):
            client.completions.create(model="serving", prompt=[5] * 500, max_tokens=100)
        deadline = time.monotonic() + 10  # the executor refreshes its snapshot every ~50 ms
        while "rose_coserving_serving_finished 3.0" not in (
                text := httpx.get(ep.url + "/metrics").text) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "rose_coserving_serving_finished 3.0" in text
    finally:
        stop_endpoint("real-0")
        ex.close()


def test_a_flood_is_answered_503_with_retry_after_and_the_admitted_are_served(tmp_path):
    """Beyond max_in_flight the endpoint answers at once (503 + Retry-After) instead of
    queueing; every admitted request, streamed or not, completes, and the slots come back."""
    ex = FakeServingExecutor(token_s=0.02)  # 32 tokens: ~0.6 s a request
    ep = start_endpoint(ex, fake_model_dir(tmp_path / "tiny-serving", context=CONTEXT),
                        worker="flood-0", max_in_flight=4)
    bodies = [{"model": "tiny-serving", "prompt": [5, 6, i % 50 + 7], "max_tokens": 32,
               "ignore_eos": True, "stream": i % 2 == 0} for i in range(40)]
    try:
        ok, refused = post_all(ep.url + "/v1/completions", bodies)
        assert 4 <= len(ok) < 40
        assert all(a[1] == "1" and "limit of 4 requests in flight" in a[2] for a in refused)
        assert all("[DONE]" in a[2] or '"choices"' in a[2] for a in ok)
        again = httpx.post(ep.url + "/v1/completions", timeout=30, json={
            "model": "tiny-serving", "prompt": [5, 6], "max_tokens": 2})
        assert again.status_code == 200  # every slot came back
    finally:
        stop_endpoint("flood-0")


def test_http_replay_reads_the_token_stream(fake):
    """The replay's SSE reader against the real endpoint: tokens counted, TTFT/TPOT taken;
    a prompt past the context is a recorded HTTP 400, not a crash of the replay."""
    from replay.replayer import replay_over_http
    from core.trace import ReplayRequest

    def req(i: int, prompt_len: int) -> ReplayRequest:
        return ReplayRequest(index=i, trace_row=i, trace_arrival_s=0.0, send_at_s=0.01 * i,
                             prompt_len=prompt_len, max_tokens=5, context_tokens=prompt_len,
                             generated_tokens=5)

    records = replay_over_http([req(0, 8), req(1, 12), req(2, CONTEXT + 10)], [fake[0].url],
                               "tiny-serving", vocab_size=300)
    ok, too_long = records[:2], records[2]
    assert all(r.ok and r.output_tokens == 5 and r.ttft_s > 0 and r.tpot_s > 0 for r in ok)
    assert not too_long.ok and too_long.error.startswith("HTTP 400")


def test_background_users_run_in_their_own_process_and_stop_on_request(fake):
    """The demo's users: a child process replays the trace against the endpoint (the driver's
    interpreter lock is not theirs to wait on); stop() ends the sending and returns the
    records of every request sent, each answered."""
    import multiprocessing

    from replay.background import BackgroundReplay, BackgroundTraffic

    users = BackgroundReplay([fake[0].url], BackgroundTraffic(sample=1.0, window_s=10_000.0))
    before = len(fake[1].submitted)
    with users:
        deadline = time.time() + 60
        while not any(p.name == "rose-serving-users" for p in multiprocessing.active_children()):
            assert time.time() < deadline, "no users' process started"
            time.sleep(0.05)
        # the child's first request can take seconds (a fresh interpreter on a busy machine)
        while len(fake[1].submitted) == before:
            assert time.time() < deadline, "the users' process sent no request"
            time.sleep(0.05)
        time.sleep(1.0)
    summary = users.summary
    planned = len(users._plan())
    assert 0 < summary["requests"] < planned  # stopped long before the window's end
    assert summary["ok"] == summary["requests"] and summary["output_tokens"] > 0
    assert all(r.endpoint == fake[0].url for r in users.records)
    assert not any(p.name == "rose-serving-users" for p in multiprocessing.active_children())
