"""The simulator's hardware affinity: the roofline-derived H20 profile and a mixed fleet whose
turns the product's TurnRouter places by environment tag."""
from dataclasses import replace

import pytest

from executors.policies.hw_affinity import HwAffinity
from sim.config import SimConfig
from sim.engine_cost import ContextCost
from sim.hw_affinity import AffinitySim, DeviceClass, _apportion
from sim.profiles import load_profile
from sim.roofline import H20, H100_SXM, H800, ModelShape, scale_profile

SHAPE = ModelShape.of("qwen3-8b")
AFFINITY = HwAffinity({"frozenlake": "compute", "default": "bandwidth"})


def test_roofline_moves_each_step_by_its_bound():
    h100 = load_profile("h100_qwen3_8b")
    h20 = scale_profile(h100, SHAPE, H100_SXM, H20)
    # decode at batch 1 reads the weights: bandwidth-bound on both, faster on the H20's HBM
    assert h20.decode(1) == pytest.approx(h100.decode(1) * H100_SXM.hbm_tb_s / H20.hbm_tb_s)
    # a long prefill is compute-bound on both: slower by the dense TFLOPS ratio
    assert h20.prefill(8176) == pytest.approx(h100.prefill(8176) * H100_SXM.tflops / H20.tflops)
    # between: a 16-token prefill still reads weights on the H20, a 512-token one is compute-bound there
    assert h20.prefill(16) < h100.prefill(16) < h100.prefill(512) < h20.prefill(512)
    # the H800 is the H100's chip and HBM: nothing moves
    same = scale_profile(h100, SHAPE, H100_SXM, H800)
    assert same.decode.ys == pytest.approx(h100.decode.ys) and same.monolithic.ys == pytest.approx(h100.monolithic.ys)


def _fleet(h800: int, h20: int) -> list[DeviceClass]:
    h100 = load_profile("h100_qwen3_8b")
    return [DeviceClass("compute", "H800", h800, h100, ContextCost.none(), None, H800.cost),
            DeviceClass("bandwidth", "H20", h20, scale_profile(h100, SHAPE, H100_SXM, H20), ContextCost.none(),
                        None, H20.cost)]


def _cfg(cap: int) -> SimConfig:
    return SimConfig(gpus=6, trainers=2, config="fixed", serving_ratio=0.0, steps=1, cap_per_rollout_gpu=cap,
                     rollout_profile="h100_qwen3_8b", serving_profile="h100_qwen2.5_7b",
                     train_s_per_token=1e-6, publish_s=1.0)


def test_affinity_places_each_environment_on_its_class_until_saturated():
    mix = {"frozenlake": 0.5, "gem_math": 0.5}
    roomy = AffinitySim(_cfg(cap=64), _fleet(2, 2), mix, 32, AFFINITY).report()
    assert roomy["finished"] and roomy["trajectories"] == 32 and roomy["in_flight"] == 0
    assert roomy["turn_share_by_class"] == {"frozenlake": {"compute": 1.0}, "gem_math": {"bandwidth": 1.0}}
    # at 2 turns per GPU the preferred class saturates: turns fall back onto the other class
    tight = AffinitySim(_cfg(cap=2), _fleet(2, 2), mix, 32, AFFINITY).report()
    assert tight["finished"] and tight["trajectories"] == 32
    assert 0 < tight["turn_share_by_class"]["frozenlake"]["compute"] < 1
    # no affinity: the least-loaded GPU whatever its class
    plain = AffinitySim(_cfg(cap=64), _fleet(2, 2), mix, 32, None).report()
    assert 0 < plain["turn_share_by_class"]["frozenlake"].get("compute", 0) < 1


def test_the_batch_is_the_same_whatever_the_fleet():
    mix = {"gem_math": 1.0}
    small = AffinitySim(_cfg(cap=64), _fleet(1, 0), mix, 12, None).report()
    large = AffinitySim(replace(_cfg(cap=64), gpus=8), _fleet(0, 6), mix, 12, None).report()
    assert small["trajectories"] == large["trajectories"] == 12
    assert _apportion({"a": 0.5, "b": 0.5}, 7) in ({"a": 4, "b": 3}, {"a": 3, "b": 4})
    with pytest.raises(ValueError, match="known tags"):
        AffinitySim(_cfg(cap=4), _fleet(1, 1), {"swe": 1.0}, 4, None)
