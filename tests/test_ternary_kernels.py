"""The ternary encoding's compiled kernels against a plain numpy reference of its format, and
the chooser's short ways for small tensors: no change scan where most elements moved, and a
sampled xor_zstd trial."""
import numpy as np
import pytest
import torch

from storage.delta import bits, encode_delta, read_header, apply_delta, ternary_kernels

DTYPES = [np.uint16, np.uint32, np.uint64]


def _pair(n: int, dtype, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unchanged, +-1 and larger moves (both signs, wrapping at either end) in equal shares."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
    base[:2] = [0, np.iinfo(dtype).max]  # wraps both ways below
    step = rng.choice(np.array([0, 1, -1, 2, -7, 300, -300]), n)
    step[:2] = [-1, 1]
    return (base + step.astype(np.int64).astype(dtype)).astype(dtype), base


def _reference(new: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The format written out in numpy: symbol min(d + 1, 3) four to a byte (LSB first, the
    last byte padded with 1 = unchanged), escapes as d zigzagged."""
    d = new - base  # wraps
    symbols = np.minimum(d + new.dtype.type(1), 3).astype(np.uint8)
    symbols = np.concatenate([symbols, np.ones(-symbols.size % 4, np.uint8)]).reshape(-1, 4)
    packed = (symbols << np.array([0, 2, 4, 6], np.uint8)).sum(axis=1, dtype=np.uint8)
    signed = d[symbols.reshape(-1)[:d.size] == 3].view(f"i{new.itemsize}")
    zigzag = ((signed << 1) ^ (signed >> (8 * new.itemsize - 1))).view(new.dtype)
    return packed, zigzag


def _planes(escapes: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(escapes.view(np.uint8).reshape(-1, escapes.itemsize).T).reshape(-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [2, 3, 4, 5, 4097])
def test_symbols_and_apply_match_the_format(dtype, n):
    new, base = _pair(n, dtype)
    packed, escapes = ternary_kernels.symbols(new, base)
    want_packed, want_escapes = _reference(new, base)
    assert np.array_equal(packed, want_packed)
    assert escapes.dtype == new.dtype and np.array_equal(escapes, want_escapes)
    out = ternary_kernels.apply(packed, _planes(escapes), base)
    assert np.array_equal(out, new) and out is not base
    held = base.copy()
    assert ternary_kernels.apply(packed, _planes(escapes), held, in_place=True) is held
    assert np.array_equal(held, new)


def test_apply_refuses_symbols_and_escapes_that_disagree():
    new, base = _pair(1000, np.uint16)
    packed, escapes = ternary_kernels.symbols(new, base)
    assert escapes.size > 2
    with pytest.raises(ValueError, match="more"):  # the symbols call for one more than stored
        ternary_kernels.apply(packed, _planes(escapes[:-1]), base)
    with pytest.raises(ValueError, match="stored"):  # one stored that no symbol calls for
        ternary_kernels.apply(packed, _planes(np.append(escapes, escapes[:1])), base)
    with pytest.raises(ValueError, match="cover"):
        ternary_kernels.apply(packed[:-1], _planes(escapes), base)


def test_small_tensor_where_most_moved_goes_ternary_without_a_change_scan(monkeypatch):
    """Below the sampling size the chooser counts what moved exactly; where most did, it
    codes ternary straight away, as for a large tensor, and never scans for the changes."""
    g = torch.Generator().manual_seed(0)
    base = (0.02 * torch.randn(384, 128, generator=g)).to(torch.bfloat16)
    new = (base.float() * (1 + 0.01 * torch.randn(base.shape, generator=g))).to(torch.bfloat16)
    moved = bits.estimated_density(bits.to_bits(new), bits.to_bits(base))
    assert moved > 0.5 and bits.sampled_density(bits.to_bits(new), bits.to_bits(base)) is None

    def no_scan(*args, **kwargs):
        raise AssertionError("the change scan ran")
    monkeypatch.setattr(bits, "changes", no_scan)
    payload = encode_delta(new, base, name="w", base_version=0, target_version=1)
    assert read_header(payload).encoding == "ternary"
    out = apply_delta(payload, base, base_version=0)
    assert torch.equal(out.view(torch.int16), new.view(torch.int16))


@pytest.mark.parametrize("shape", [(384, 128), (64, 64)])
def test_small_tensor_still_finds_xor_where_it_wins(shape):
    """The xor_zstd trial of a small tensor is a sample (a quarter of it), or the whole body of
    a tiny one, kept and not built twice. Where one mantissa bit flipped everywhere, XOR is
    the same word for every element and ternary a coin-flip sign per escape: xor_zstd wins,
    and is chosen either way."""
    g = torch.Generator().manual_seed(1)
    base = (0.02 * torch.randn(shape, generator=g)).to(torch.bfloat16)
    new = bits.from_bits(bits.to_bits(base) ^ np.uint16(4), torch.bfloat16, shape)
    payload = encode_delta(new, base, name="w", base_version=0, target_version=1)
    ternary = encode_delta(new, base, name="w", base_version=0, target_version=1,
                           force="ternary")
    assert read_header(payload).encoding == "xor_zstd" and len(payload) < len(ternary) // 4
    out = apply_delta(payload, base, base_version=0)
    assert torch.equal(out.view(torch.int16), new.view(torch.int16))
