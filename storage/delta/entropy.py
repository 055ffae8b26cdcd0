"""The information-theoretic yardstick for a delta, in bits.

entropy_bound_bits(new, base) = positions + values, where, with n elements of which k differ
in any bit (p = k / n):
  positions = n * H(p), H the binary entropy: the cost of the change set if every element
              changed independently with probability p (a coder that exploits clustering, such
              as xor_zstd on embedding rows, can go below it);
  values    = k * H0(d): the order-0 empirical entropy of the changed elements' symbol
              d = new - base of their bit patterns (mod 2**w, w the dtype width), i.e. the sum
              over changes of -log2(freq(d) / k). It excludes the cost of describing the
              distribution and any context (sign, exponent), so it is a per-tensor order-0 bound.
With no base the tensor is a snapshot and the bound is n * H0(bits of new), the order-0 entropy
of its bit patterns. Headers and checksums are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from storage.delta import bits


@dataclass(frozen=True)
class EntropyBound:
    numel: int
    changed: int
    position_bits: float
    value_bits: float

    @property
    def bits(self) -> float:
        return self.position_bits + self.value_bits

    @property
    def density(self) -> float:
        return self.changed / self.numel if self.numel else 0.0


def binary_entropy(p: float) -> float:
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return float(-(p * np.log2(p) + (1 - p) * np.log2(1 - p)))


def order0_bits(symbols: np.ndarray) -> float:
    """Sum over the symbols of -log2(empirical frequency): n * H0."""
    if symbols.size == 0:
        return 0.0
    if symbols.itemsize <= 2:
        counts = np.bincount(symbols.astype(np.int64), minlength=1)
        counts = counts[counts > 0]
    else:
        counts = np.unique(symbols, return_counts=True)[1]
    total = symbols.size
    return float(total * np.log2(total) - np.sum(counts * np.log2(counts)))


def entropy_bound(new: torch.Tensor, base: torch.Tensor | None) -> EntropyBound:
    """Position and value bits of the delta base -> new (see the module docstring)."""
    new_u = bits.to_bits(new)
    if base is None:
        return EntropyBound(new_u.size, new_u.size, 0.0, order0_bits(new_u))
    if base.shape != new.shape or base.dtype != new.dtype:
        raise ValueError(f"base {base.dtype}{tuple(base.shape)} does not match new "
                         f"{new.dtype}{tuple(new.shape)}")
    base_u = bits.to_bits(base)
    change = bits.changes(new_u, base_u)
    n, k = new_u.size, change.positions.size
    position_bits = n * binary_entropy(k / n) if n else 0.0
    return EntropyBound(n, k, position_bits, order0_bits(change.diff))


def entropy_bound_bits(new: torch.Tensor, base: torch.Tensor | None) -> float:
    return entropy_bound(new, base).bits
