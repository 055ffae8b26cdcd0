"""The serving endpoint fuzzed (issue 41): hypothesis draws request bodies, from arbitrary bytes
and JSON to near-valid OpenAI completions and chat requests (wrong types, out-of-range numbers,
unknown fields, token ids outside the vocabulary, streaming on and off), against a live endpoint
with API keys. Every answer is a 2xx or a 4xx with OpenAI's error body, never a 5xx (but the
stand-in engine's own failure, which the endpoint must report as one), never a hang; afterwards
the endpoint still serves a valid request."""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

import fuzz_requests
from executors.coserving.endpoint.app import start_endpoint, stop_endpoint
from fake_serving import FAIL_ID, FakeServingExecutor, fake_model_dir

KEY = "sk-fuzz"
AUTH = {"Authorization": f"Bearer {KEY}"}
VOCAB, CONTEXT = 300, 256

requests = fuzz_requests.requests("tiny-serving", VOCAB, CONTEXT)


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    model_dir = fake_model_dir(tmp_path_factory.mktemp("m") / "tiny-serving", vocab_size=VOCAB, context=CONTEXT)
    ep = start_endpoint(FakeServingExecutor(token_s=0.0), model_dir, worker="fuzz-0", api_keys=(KEY,))
    yield ep.url
    stop_endpoint("fuzz-0")


def _engine_failure(path: str, body: bytes | str) -> bool:
    """The stand-in engine fails a prompt whose first id is FAIL_ID, by design."""
    try:
        sent = json.loads(body)
    except ValueError:
        return False
    prompt = sent.get("prompt") if isinstance(sent, dict) else None
    return path == "/v1/completions" and isinstance(prompt, list) and prompt[:1] == [FAIL_ID]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(request=requests)
def test_fuzzed_requests_get_an_answer_never_a_server_error(endpoint, request) -> None:
    path, body = request
    with httpx.Client(timeout=20) as client:
        r = client.post(endpoint + path, content=body, headers={**AUTH, "Content-Type": "application/json"})
        text = r.text  # a stream is read to its end: no hang
    assert r.status_code < 500 or _engine_failure(path, body), (r.status_code, text[:300], body[:300])
    if r.status_code >= 400:
        assert "error" in json.loads(text), text[:300]
    if "text/event-stream" in r.headers.get("content-type", ""):
        assert text.rstrip().endswith("data: [DONE]")


def test_the_endpoint_still_serves_after_the_fuzz(endpoint) -> None:
    r = httpx.post(endpoint + "/v1/completions", headers=AUTH, timeout=20,
                   json={"model": "tiny-serving", "prompt": [5, 6], "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(endpoint + "/health").json()["status"] == "ok"
