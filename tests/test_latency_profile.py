import itertools

import pytest

from executors.policies.latency_profile import Curve, LatencyProfile, profile_engine


def test_curve_interpolates_clamps_below_and_extrapolates_last_slope():
    c = Curve((1, 2, 4), (1.0, 2.0, 6.0))
    assert c(0) == pytest.approx(1.0)  # below the first point: first value
    assert c(0.5) == pytest.approx(1.0)
    assert c(1) == pytest.approx(1.0)
    assert c(1.5) == pytest.approx(1.5)
    assert c(3) == pytest.approx(4.0)  # 2 + (6-2)/2 * 1
    assert c(4) == pytest.approx(6.0)
    assert c(6) == pytest.approx(10.0)  # last slope 2 continues: 6 + 2*2


def test_curve_lifts_noisy_dip_to_stay_monotone():
    c = Curve((1, 2, 3), (1.0, 3.0, 2.0))
    assert c(2.5) == pytest.approx(3.0)  # the dip at x=3 is lifted to 3.0
    assert c(5) == pytest.approx(3.0)  # lifted last segment is flat
    xs = [0.5 * i for i in range(20)]
    ys = [c(x) for x in xs]
    assert ys == sorted(ys)


@pytest.mark.parametrize("xs, ys, msg", [
    ((1,), (1.0,), "two sample points"),
    ((1, 2), (1.0,), "sizes but"),
    ((2, 1), (1.0, 2.0), "strictly increasing"),
    ((1, 1), (1.0, 2.0), "strictly increasing"),
    ((0, 1), (1.0, 2.0), "positive"),
    ((1, 2), (1.0, -2.0), ">= 0"),
    ((1, 2), (1.0, float("nan")), ">= 0"),
])
def test_curve_rejects_bad_samples(xs, ys, msg):
    with pytest.raises(ValueError, match=msg):
        Curve(xs, ys)


def _profile() -> LatencyProfile:
    return LatencyProfile(
        monolithic=Curve((100, 1000), (0.01, 0.1)),
        chunked=Curve((128, 512, 1024), (0.02, 0.05, 0.11)),
        decode=Curve((1, 9), (0.01, 0.05)),
        chunk_size=512, name="tiny",
    )


def test_profile_lookups_by_mode_chunk_and_batch():
    p = _profile()
    assert p.prefill(550, "monolithic") == pytest.approx(0.055)
    assert p.prefill(768, "chunked") == pytest.approx(0.08)  # halfway 0.05 -> 0.11
    assert p.chunk(256) == pytest.approx(0.03)  # 0.02 + 128/384 * 0.03
    assert p.decode_step(5) == pytest.approx(0.03)
    assert p.decode_step(13) == pytest.approx(0.07)  # extrapolated: 0.05 + 4 * 0.005
    with pytest.raises(ValueError, match="outside 1..512"):
        p.chunk(513)
    with pytest.raises(ValueError, match="prefill mode"):
        p.prefill(10, "speculative")
    with pytest.raises(ValueError, match="batch"):
        p.decode_step(0)


def test_json_round_trip_and_atomic_save(tmp_path):
    p = _profile()
    q = LatencyProfile.from_json(p.to_json())
    assert q == p
    assert q.decode_step(13) == pytest.approx(p.decode_step(13))
    path = tmp_path / "cache" / "serving.json"
    p.save(path)
    assert LatencyProfile.load(path) == p
    assert [f.name for f in path.parent.iterdir()] == ["serving.json"]  # no temp left behind


@pytest.mark.parametrize("text, msg", [
    ("{not json", "not valid JSON"),
    ('{"format": 99}', "unknown format"),
    ('{"format": 1, "monolithic": {"xs": [1, 2], "ys": [1, 2]}}', "missing"),
])
def test_from_json_rejects_bad_cache(text, msg):
    with pytest.raises(ValueError, match=msg):
        LatencyProfile.from_json(text)


class FakeTimer:
    """Latency = base + per_unit * size; the 2nd call of every 4 is 10x slow (a hiccup)."""

    def __init__(self, base: float, per_unit: float):
        self.base, self.per_unit, self.calls = base, per_unit, []
        self._hiccup = itertools.cycle([False, True, False, False])

    def __call__(self, size: int) -> float:
        self.calls.append(size)
        t = self.base + self.per_unit * size
        return t * 10 if next(self._hiccup) else t


def test_profile_engine_measures_through_callables_with_median_and_warmup():
    prefill, decode = FakeTimer(0.01, 0.001), FakeTimer(0.005, 0.002)
    lengths, batches = [1024, 256, 512, 2048], [1, 4, 16]
    p = profile_engine(prefill, decode, lengths, batches, repeats=3, warmup=1, chunk_size=512)
    # each size: 1 warm-up + 3 measured calls, in ascending order
    assert prefill.calls == [L for L in sorted(lengths) for _ in range(4)]
    assert decode.calls == [b for b in batches for _ in range(4)]
    # per size: warm-up, then one slow and two normal runs; the median drops the slow one
    assert p.prefill(512) == pytest.approx(0.01 + 0.512)
    assert p.prefill(2048) == pytest.approx(0.01 + 2.048)
    assert p.decode_step(4) == pytest.approx(0.005 + 0.008)
    # chunked derived from monolithic: 4 back-to-back 512-token prefills for 2048 tokens
    assert p.prefill(2048, "chunked") == pytest.approx(4 * 0.522)
    assert p.prefill(256, "chunked") == pytest.approx(0.266)
    assert p.chunk(512) == pytest.approx(0.522)


def test_profile_engine_uses_a_measured_chunked_prefill_when_given():
    chunked = FakeTimer(0.02, 0.001)
    p = profile_engine(lambda L: 0.001 * L, lambda b: 0.01 * b, [256, 1024], [1, 2],
                       repeats=1, warmup=0, run_chunked_prefill=chunked)
    assert chunked.calls == [256, 1024]
    assert p.prefill(1024, "chunked") == pytest.approx((0.02 + 1.024) * 10)  # one run: the hiccup
    assert p.prefill(256, "chunked") == pytest.approx(0.276)


def test_profile_engine_rejects_bad_timer_and_too_few_points():
    with pytest.raises(ValueError, match="timer returned"):
        profile_engine(lambda L: -1.0, lambda b: 0.01, [1, 2], [1, 2], repeats=1)
    with pytest.raises(ValueError, match="at least two"):
        profile_engine(lambda L: 0.1, lambda b: 0.01, [128], [1, 2])
