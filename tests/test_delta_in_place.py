"""apply_delta in place: the result is written into the base tensor itself, for every encoding."""
import pytest
import torch

from storage.delta import DeltaBaseMismatch, apply_delta, encode_delta

ENCODINGS = ["ef", "coo", "xor_zstd", "ternary", "dense"]


def _pair(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    base = (0.02 * torch.randn(300, 70, generator=g)).to(torch.bfloat16)
    new = base.clone()
    hit = torch.rand(base.shape, generator=g) < 0.05
    new[hit] = (new[hit].float() * 1.01 + 1e-3).to(torch.bfloat16)
    return base, new


@pytest.mark.parametrize("force", ENCODINGS)
def test_in_place_writes_the_result_into_the_base(force):
    base, new = _pair()
    payload = encode_delta(new, base, name="w", base_version=3, target_version=4, force=force)
    held = base.clone()
    out = apply_delta(payload, held, base_version=3, in_place=True)
    assert out is held
    assert torch.equal(held.view(torch.int16), new.view(torch.int16))
    # out of place (the default) still leaves the base alone
    other = base.clone()
    fresh = apply_delta(payload, other, base_version=3)
    assert fresh is not other and torch.equal(other.view(torch.int16), base.view(torch.int16))


def test_in_place_onto_another_base_raises_base_mismatch():
    base, new = _pair()
    payload = encode_delta(new, base, name="w", base_version=3, target_version=4, force="ef")
    wrong, _ = _pair(seed=1)
    with pytest.raises(DeltaBaseMismatch, match="result checksum"):
        apply_delta(payload, wrong, base_version=3, in_place=True)


def test_in_place_needs_a_contiguous_tensor_to_write_into():
    base, new = _pair()
    payload = encode_delta(new, base, name="w", base_version=3, target_version=4, force="ef")
    strided = base.t().contiguous().t()  # same shape and values, not contiguous
    with pytest.raises(ValueError, match="contiguous CPU"):
        apply_delta(payload, strided, base_version=3, in_place=True)
