"""SLO admission at the serving endpoint (executors/policies/endpoint_admission.py): a request
is refused exactly when the profile's predicted TTFT (prefill of the prompt tokens still
waiting plus its own) exceeds the TTFT SLO, or when one more decoding request would leave the
batch where the decode step meets the TPOT SLO, or past the hard cap."""
from __future__ import annotations

import pytest

from executors.policies.endpoint_admission import EndpointAdmission
from executors.policies.latency_profile import Curve, LatencyProfile
from executors.policies.slo_admission import SLOConfig


def linear_profile() -> LatencyProfile:
    """P(L) = 1 ms per token, D(B) = 1 ms per request in the batch, measured up to B = 64."""
    prefill = Curve((1.0, 1000.0), (0.001, 1.0))
    return LatencyProfile(prefill, prefill, Curve((1.0, 64.0), (0.001, 0.064)))


SLO = SLOConfig(ttft_s=0.1, tpot_s=0.02)  # 100 prompt tokens; a decode batch of 20


def test_refuses_exactly_when_the_predicted_ttft_exceeds_the_slo():
    a = EndpointAdmission(linear_profile(), SLO, hard_cap=256)
    for waiting in (1, 10, 50, 89):
        for prompt in (1, 5, 10, 11, 40):
            d = a.decide(prompt, waiting, in_flight=1)
            predicted = 0.001 * (waiting + prompt)
            assert d.predicted_ttft_s == pytest.approx(predicted)
            assert d.admitted == (d.predicted_ttft_s <= SLO.ttft_s), (waiting, prompt)
            assert d.reason == ("admitted" if d.admitted else "ttft")
    assert a.decide(10, 90, 1).admitted and not a.decide(11, 90, 1).admitted  # the boundary


def test_a_request_alone_is_admitted_whatever_its_prefill():
    a = EndpointAdmission(linear_profile(), SLO, hard_cap=256)
    assert a.decide(500, 0, 0).admitted  # refusing it cannot make it faster
    assert not a.decide(500, 1, 1).admitted


def test_the_measured_slowdown_scales_every_prediction():
    a = EndpointAdmission(linear_profile(), SLO, hard_cap=256)
    assert a.decide(40, 40, 1, slowdown=1.0).admitted
    d = a.decide(40, 40, 1, slowdown=2.0)
    assert not d.admitted and d.predicted_ttft_s == pytest.approx(0.16)
    for k in (0.5, 1.0, 2.0, 3.0):  # the largest batch whose k * D(B) meets the TPOT SLO
        b = a.batch_limit(k)
        assert k * a.profile.decode_step(b) <= SLO.tpot_s < k * a.profile.decode_step(b + 1)
    assert a.batch_limit(0.5) > a.batch_limit(2.0) and a.batch_limit(100.0) == 1


def test_decode_batch_and_hard_cap():
    a = EndpointAdmission(linear_profile(), SLO, hard_cap=256)
    assert a.decide(1, 0, 19).admitted  # D(20) = 20 ms meets the TPOT SLO
    assert a.decide(1, 0, 20).reason == "decode_batch"  # D(21) does not
    loose = EndpointAdmission(linear_profile(), SLOConfig(ttft_s=10.0, tpot_s=10.0), hard_cap=256)
    assert loose.max_batch == 64 and loose.decide(1, 0, 63).admitted  # the profiled batch
    assert loose.decide(1, 0, 64).reason == "decode_batch"  # queued behind whole requests
    capped = EndpointAdmission(linear_profile(), SLOConfig(ttft_s=10.0, tpot_s=10.0),
                               hard_cap=8, max_batch=100)
    assert capped.decide(1, 0, 7).admitted and capped.decide(1, 0, 8).reason == "hard_cap"


def test_bad_inputs_are_refused_loudly():
    a = EndpointAdmission(linear_profile(), SLO, hard_cap=256)
    with pytest.raises(ValueError):
        a.decide(0, 0, 0)
    with pytest.raises(ValueError):
        a.decide(1, -1, 0)
    with pytest.raises(ValueError):
        a.decide(1, 0, 0, slowdown=float("nan"))
    with pytest.raises(ValueError):
        EndpointAdmission(linear_profile(), SLO, hard_cap=0)


def _endpoint(tmp_path, worker: str, token_s: float):
    """A stand-in executor with a serving profile and SLO behind a real endpoint."""
    from executors.coserving.endpoint.app import start_endpoint
    from fake_serving import FakeServingExecutor, fake_model_dir

    ex = FakeServingExecutor(token_s=token_s)
    ex.serving_profile, ex.slo = linear_profile(), SLO
    ep = start_endpoint(ex, fake_model_dir(tmp_path / "tiny-serving", context=256), worker=worker)
    return ep, ex, ep.app.state.endpoint


def _settled(state, timeout_s: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while state.admitted or state.waiting or state.waiting_tokens:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_endpoint_refuses_beyond_the_predicted_ttft_and_serves_what_it_admitted(tmp_path):
    """30-token prompts at a TTFT SLO of 100 prompt tokens: while the first ones wait for their
    first token (0.3 s), a fourth would be predicted past the SLO and is answered 503 +
    Retry-After at once; every admitted request is served whole; nothing stays counted."""
    from executors.coserving.endpoint.app import stop_endpoint
    from fake_serving import post_all

    ep, ex, state = _endpoint(tmp_path, "slo-0", token_s=0.3)
    bodies = [{"model": "tiny-serving", "prompt": [5] * 29 + [i % 50 + 7], "max_tokens": 3,
               "ignore_eos": True, "stream": i % 2 == 0} for i in range(20)]
    try:
        ok, refused = post_all(ep.url + "/v1/completions", bodies)
        assert 3 <= len(ok) < 20
        assert all(a[1] == "1" and "predicting a TTFT of 0.120 s against its SLO of 0.100 s"
                   in a[2] for a in refused), refused[:1]
        assert all('"finish_reason":"length"' in a[2].replace(" ", "") for a in ok)
        assert len(ex.submitted) == len(ok)  # a refused request never reached the engine
        assert _settled(state)
    finally:
        stop_endpoint("slo-0")


def test_waiting_tokens_are_released_on_first_token_finish_error_and_disconnect(tmp_path):
    import httpx

    from executors.coserving.endpoint.app import stop_endpoint
    from fake_serving import FAIL_ID

    ep, ex, state = _endpoint(tmp_path, "leak-0", token_s=0.2)
    url, body = ep.url + "/v1/completions", {"model": "tiny-serving", "prompt": [5, 6, 7],
                                             "max_tokens": 20, "ignore_eos": True}
    try:
        with httpx.Client(timeout=30) as client:
            with client.stream("POST", url, json={**body, "stream": True}) as r:
                assert r.status_code == 200 and state.waiting_tokens == 3  # no token yet
            assert _settled(state)  # client gone before its first token
            with client.stream("POST", url, json={**body, "stream": True}) as r:
                lines = r.iter_lines()
                assert '"choices"' in next(line for line in lines if line.startswith("data:"))
                assert state.waiting_tokens == 0 and len(state.admitted) == 1  # first token in
            assert _settled(state)  # client gone mid-stream
            assert len(ex.aborted) == 2
            failed = client.post(url, json={**body, "prompt": [FAIL_ID, 6]})
            assert failed.status_code == 500 and _settled(state)  # the engine failed it
            done = client.post(url, json={**body, "max_tokens": 2})
            assert done.status_code == 200 and _settled(state, timeout_s=0)  # finished
    finally:
        stop_endpoint("leak-0")
