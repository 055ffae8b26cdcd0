"""The codec's compiled kernels against plain numpy references, including malformed input."""
import numpy as np
import pytest

from storage.delta import elias_fano, kernels, value_kernels
from storage.delta.bitpack import pack_bits, packed_size

DTYPES = [np.uint8, np.uint16, np.uint32, np.uint64]


def _pair(n: int, density: float, dtype, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
    new = base.copy()
    hit = rng.random(n) < density
    new[hit] += rng.integers(1, 5, int(hit.sum())).astype(dtype)  # wraps at the top
    return new, base


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 10_007])
@pytest.mark.parametrize("density", [0.0, 0.03, 0.5, 1.0])
def test_scan_matches_numpy(dtype, n, density):
    new, base = _pair(n, density, dtype)
    positions, diff = kernels.scan_changes(new, base, density)
    expect = np.flatnonzero(new != base)
    assert np.array_equal(positions, expect)
    assert diff.dtype == new.dtype and np.array_equal(diff, new[expect] - base[expect])


def test_scan_grows_past_a_low_density_estimate():
    new, base = _pair(100_000, 0.9, np.uint16)
    positions, diff = kernels.scan_changes(new, base, density=0.0)  # room for 1,024 at first
    assert positions.size == int(np.count_nonzero(new != base)) > 80_000
    assert np.array_equal(base[positions] + diff, new[positions])


def test_scan_reuse_keeps_one_scratch_per_thread():
    """reuse=True: the same answers, written into this thread's scratch (no fresh pages per
    tensor), which the next reuse scan overwrites; a scan larger than the cap keeps its own."""
    a, a_base = _pair(50_000, 0.04, np.uint16, seed=1)
    b, b_base = _pair(40_000, 0.04, np.uint16, seed=2)
    pa, da = kernels.scan_changes(a, a_base, 0.04, reuse=True)
    expect = np.flatnonzero(a != a_base)
    assert np.array_equal(pa, expect) and np.array_equal(da, a[expect] - a_base[expect])
    pb, _ = kernels.scan_changes(b, b_base, 0.04, reuse=True)
    assert np.shares_memory(pa, pb)  # the same scratch: pa is no longer a's
    assert np.array_equal(pb, np.flatnonzero(b != b_base))
    own, _ = kernels.scan_changes(b, b_base, 0.04)  # without reuse: its own arrays
    assert not np.shares_memory(own, pb)
    huge = kernels.SCRATCH_MAX_BYTES // 10 * 2  # at density 0.5, output over the cap
    c, c_base = _pair(huge, 0.5, np.uint16, seed=3)
    pc, _ = kernels.scan_changes(c, c_base, 0.5, reuse=True)
    assert pc.size == int(np.count_nonzero(c != c_base))
    pd, _ = kernels.scan_changes(b, b_base, 0.04, reuse=True)
    assert not np.shares_memory(pc, pd) and np.shares_memory(pb, pd)


def _numpy_ef_parts(positions: np.ndarray, universe: int) -> tuple[bytes, bytes]:
    low = elias_fano.low_bits(positions.size, universe)
    lows = pack_bits(positions & ((1 << low) - 1), low)
    unary = np.zeros(positions.size + ((universe - 1) >> low) + 1, np.uint8)
    unary[(positions >> low) + np.arange(positions.size)] = 1
    return lows, np.packbits(unary, bitorder="little").tobytes()


@pytest.mark.parametrize("count,universe", [(1, 1), (5, 5), (3, 1000), (1000, 1 << 20),
                                            (7, 1 << 40), (40_000, 100_000)])
def test_ef_pack_matches_the_bit_layout(count, universe):
    rng = np.random.default_rng(count)
    positions = np.sort(rng.choice(universe, count, replace=False)).astype(np.int64)
    low = elias_fano.low_bits(count, universe)
    got = kernels.ef_pack(positions, low, packed_size(count, low),
                          count + ((universe - 1) >> low) + 1)
    assert tuple(bytes(p) for p in got) == _numpy_ef_parts(positions, universe)
    decoded, u = elias_fano.decode(elias_fano.encode(positions, universe))
    assert u == universe and np.array_equal(decoded, positions)


def _apply_parts(positions: np.ndarray, universe: int):
    blob = elias_fano.encode(positions, universe)
    count, _, low, lows, unary = elias_fano.split(blob)
    return count, low, bytes(lows), bytearray(unary)


def test_ef_apply_adds_at_positions_and_leaves_base_alone():
    base = np.arange(1000, dtype=np.uint16)
    positions = np.array([0, 7, 8, 500, 999])
    diff = np.array([1, 2, 0xFFFF, 3, 4], np.uint16)  # 0xFFFF: -1, wrapping
    count, low, lows, unary = _apply_parts(positions, base.size)
    out = kernels.ef_apply(base, memoryview(lows), memoryview(unary), count, low, diff)
    expect = base.copy()
    expect[positions] += diff
    assert np.array_equal(out, expect) and np.array_equal(base, np.arange(1000, dtype=np.uint16))


def test_ef_apply_rejects_malformed_positions():
    base = np.zeros(64, np.uint16)
    positions = np.array([3, 9, 40])
    diff = np.ones(3, np.uint16)
    count, low, lows, unary = _apply_parts(positions, base.size)
    extra = bytearray(unary)
    extra[-1] |= 0x80  # one more high bit than the header's count
    with pytest.raises(ValueError, match="number of positions"):
        kernels.ef_apply(base, memoryview(lows), memoryview(extra), count, low, diff)
    with pytest.raises(ValueError, match="number of positions"):
        kernels.ef_apply(base, memoryview(lows), memoryview(unary), count + 1, low,
                         np.ones(4, np.uint16))
    with pytest.raises(ValueError, match="out of range"):
        kernels.ef_apply(np.zeros(30, np.uint16), memoryview(lows), memoryview(unary), count,
                         low, diff)
    # Both in high bucket 0: lows 1 then 0 decode to positions 1 then 0.
    count, low, lows, unary = _apply_parts(np.array([1, 2]), 4)
    with pytest.raises(ValueError, match="not increasing"):
        kernels.ef_apply(np.zeros(4, np.uint16), memoryview(lows),
                         memoryview(bytes([0b0000_0011])), count, low, np.ones(2, np.uint16))


def _numpy_symbols(diff: np.ndarray):
    signed = diff.view(f"i{diff.itemsize}")
    magnitude = np.abs(signed).view(diff.dtype)  # abs(INT_MIN) wraps to 2**(w-1)
    classes = np.minimum(magnitude - diff.dtype.type(1), 3).astype(np.uint8)
    padded = np.zeros((diff.size + 3) // 4 * 4, np.uint8)
    padded[:diff.size] = classes
    packed = np.bitwise_or.reduce(padded.reshape(-1, 4) << np.array([0, 2, 4, 6], np.uint8),
                                  axis=1).astype(np.uint8)
    return (np.packbits(signed < 0, bitorder="little"), packed,
            magnitude[classes == 3] - diff.dtype.type(4))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 4, 9, 1001])
def test_value_symbols_match_numpy(dtype, n):
    rng = np.random.default_rng(n)
    top = np.iinfo(dtype).max
    diff = rng.integers(1, top, n, dtype=dtype, endpoint=True)
    diff[: n // 3] = rng.choice(np.array([1, 2, 3, top, top - 1], dtype), n // 3)  # +-1, +-2
    diff[-1] = dtype(1) << dtype(8 * np.dtype(dtype).itemsize - 1)  # INT_MIN: magnitude 2**(w-1)
    got = value_kernels.value_symbols(diff)
    for g, want in zip(got, _numpy_symbols(diff)):
        assert g.dtype == want.dtype and np.array_equal(g, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 4, 9, 1001])
def test_decode_values_inverts_the_symbols(dtype, n):
    """Symbols back to the differences in one pass, escapes (|d| >= 4, INT_MIN) included;
    planes that do not match the classes' escapes are refused, never misread."""
    rng = np.random.default_rng(n + 7)
    top = np.iinfo(dtype).max
    diff = rng.integers(1, top, n, dtype=dtype, endpoint=True)
    diff[: n // 2] = rng.choice(np.array([1, 2, 3, 4, top, top - 3], dtype), n // 2)
    diff[-1] = dtype(1) << dtype(8 * np.dtype(dtype).itemsize - 1)
    signs, classes, escapes = value_kernels.value_symbols(diff)
    planes = np.ascontiguousarray(escapes.view(np.uint8).reshape(-1, diff.itemsize).T).reshape(-1)
    assert value_kernels.escape_count(classes, n) == escapes.size
    got = value_kernels.decode_values(signs, classes, planes, n, np.dtype(dtype))
    assert got.dtype == dtype and np.array_equal(got, diff)
    with pytest.raises(ValueError, match="do not match"):
        value_kernels.decode_values(signs, classes, planes[1:], n, np.dtype(dtype))


def test_value_symbols_refuse_a_zero_difference():
    with pytest.raises(ValueError, match="non-zero"):
        value_kernels.value_symbols(np.array([1, 0, 2], np.uint16))


def test_loaded_modules_survive_vllms_kernel_scan():
    """vLLM's CPU engine start walks every loaded module and reads vars(x).get("kernel") of
    any object with a __dict__ (vllm/triton_utils/dispatcher.py); with the codec's numba
    loaded that must still work, or no engine starts in a worker that decoded a delta."""
    import sys

    assert "llvmlite.binding.ffi" in sys.modules  # loaded by the kernels
    for module in list(sys.modules.values()):
        for obj in list((getattr(module, "__dict__", None) or {}).values()):
            if hasattr(obj, "__dict__"):
                vars(obj).get("kernel")  # raises for llvmlite's library wrapper, unpatched
