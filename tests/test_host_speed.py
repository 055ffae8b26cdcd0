"""This host's coding speed (storage/delta/host_speed.py) in the time model: the probe times
the codec itself, the costs scale by what it found, and a publisher with measure_cpu chooses
by them."""
from __future__ import annotations

import statistics
import time

import pytest

from core.config import PublishConfig
from storage.delta import bits, encode_delta, host_speed, time_model as tm
from storage.relay.filesystem import FilesystemRelay
from storage.weights.receiver import WeightReceiver
from storage.weights.sparse_publisher import SparsePublisher

FAST = tm.HostSpeed(tuple((m, 10.0, 10.0) for m in tm.COSTS))  # a host 10x the fitted VM


def test_costs_scale_by_the_hosts_factors():
    speed = tm.HostSpeed((("ef", 2.0, 4.0),))
    ef, fitted = speed.cost("ef"), tm.COSTS["ef"]
    assert ef.encode_gbps == 2 * fitted.encode_gbps and ef.apply_gbps == 4 * fitted.apply_gbps
    assert ef.encode_fixed_s == fitted.encode_fixed_s / 2
    assert ef.apply_fixed_s == fitted.apply_fixed_s / 4
    assert speed.cost("ternary") == tm.COSTS["ternary"]  # not measured: as fitted
    link = tm.Link(10.0, 1, speed)
    assert tm.tensor_s("ef", 8 << 20, 1 << 20, link) < tm.tensor_s("ef", 8 << 20, 1 << 20,
                                                                  tm.Link(10.0))
    assert speed.as_dict() == {"ef": [2.0, 4.0]} and tm.HostSpeed().as_dict() is None
    assert tm.Link(10.0).cost("raw") == tm.COSTS["raw"]


def test_bad_factors_are_refused_by_name():
    with pytest.raises(ValueError, match="'zip'"):
        tm.HostSpeed((("zip", 1.0, 1.0),))
    with pytest.raises(ValueError, match="ternary"):
        tm.HostSpeed((("ternary", 0.0, 1.0),))
    with pytest.raises(ValueError, match="repeat"):
        host_speed.probe(repeat=0)


def test_probe_covers_every_costed_method_and_lands_in_each_regime():
    speed = host_speed.probe(repeat=1, numel=1 << 18)
    factors = {m: (e, a) for m, e, a in speed.factors}
    assert set(factors) == set(tm.COSTS)
    lo, hi = host_speed.CLAMP
    assert all(lo <= f <= hi for pair in factors.values() for f in pair)
    coded = [factors[m] for m in host_speed.STEPS]  # raw, memory-bound, is not a coding's
    assert factors["coo"] == factors["xor_zstd"] == tuple(
        min(max(statistics.median(f[i] for f in coded), lo), hi) for i in (0, 1))
    for method, step in host_speed.STEPS.items():  # each step's delta codes as its method
        base, new = host_speed._versions(step, 1 << 18, seed=0)
        payload = encode_delta(new, base, name="probe", base_version=0, target_version=1)
        assert host_speed._coded_method(payload, 1 << 18) == method


def test_probe_follows_a_slower_codec(monkeypatch):
    """An encoder that also waits its fitted time is slower than the fitted VM: the probe's
    encode factors fall below 1, whatever this host's own speed."""
    real = host_speed.encode_delta

    def slow(new, base, **kw):
        out = real(new, base, **kw)
        cost = tm.COSTS[host_speed._coded_method(out, new.numel())]
        time.sleep(cost.encode_fixed_s + new.numel() * 2 / (cost.encode_gbps * 1e9))
        return out
    monkeypatch.setattr(host_speed, "encode_delta", slow)
    factors = {m: e for m, e, _ in host_speed.probe(repeat=1, numel=1 << 18).factors}
    assert all(factors[m] < 1.0 for m in host_speed.STEPS)


def test_measured_probes_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(host_speed, "_result", None)
    monkeypatch.setattr(host_speed, "probe", lambda: calls.append(1) or FAST)
    assert host_speed.measured() is FAST and host_speed.measured() is FAST
    assert calls == [1]


def test_a_faster_host_codes_what_the_fitted_costs_send_raw(tmp_path, monkeypatch):
    """At 5 Gbps a 2 MB tensor where ~40% of the elements moved goes raw at the fitted costs;
    on a host that codes 10x as fast, coding it reaches the receiver first. The publisher with
    measure_cpu takes the host's speed, the receiver's weights are bit-exact either way."""
    base, new = host_speed._versions(3e-5, 1 << 20, seed=0)
    density = bits.estimated_density(bits.to_bits(new), bits.to_bits(base))
    assert tm.raw_before_scan(2 << 20, 2, density, tm.Link(5.0))
    assert not tm.raw_before_scan(2 << 20, 2, density, tm.Link(5.0, 1, FAST))
    monkeypatch.setattr(host_speed, "measured", lambda: FAST)
    relay = FilesystemRelay(tmp_path / "relay")
    reports = {}
    for run, measure in (("fitted", False), ("host", True)):
        pub = SparsePublisher(relay, run, link_gbps=5.0, workers=1, measure_cpu=measure)
        pub.publish(0, {"w": base})
        reports[run] = pub.publish(1, {"w": new})
        rx = WeightReceiver(relay, run, workers=1)
        rx.pull(0)
        assert rx.pull(1).mode == "delta"
        assert bits.to_bits(rx.tensors["w"]).tobytes() == bits.to_bits(new).tobytes()
    assert [t.encoding for t in reports["fitted"].tensors] == ["raw"]
    assert reports["host"].tensors[0].encoding not in ("raw", "dense")
    assert reports["host"].pushed_bytes < reports["fitted"].pushed_bytes / 2
    assert reports["host"].summary()["cpu_speed"]["ternary"] == [10.0, 10.0]
    assert reports["fitted"].summary()["cpu_speed"] is None


def test_measure_cpu_is_on_by_default():
    assert PublishConfig().measure_cpu is True
    assert PublishConfig(measure_cpu=False).measure_cpu is False
