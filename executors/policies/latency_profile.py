"""Latency profiles of one engine: prefill time P_m(L) and decode-step time D(B).

Admission predicts serving and rollout step times from these curves (paper 4.1),
so they are measured once at start-up, cached as JSON, and read many times per second.
Plain Python: the measuring is done by callables the caller passes in (vLLM-backed in the
executor, fake timers in tests).
"""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal

from storage.atomic import write_atomic

PrefillMode = Literal["monolithic", "chunked"]
PREFILL_MODES: tuple[str, ...] = ("monolithic", "chunked")
DEFAULT_CHUNK = 512  # rollout prefill chunk size (paper default)
FORMAT = 1


@dataclass(frozen=True)
class Curve:
    """Latency (s) against a size (tokens or batch), from measured sample points.

    Evaluation is monotone piecewise-linear: latency never falls as the size grows, so a
    noisy dip in the samples is lifted to the running maximum (an over-estimate keeps slack
    predictions on the safe side). Below the first point the first value holds (fixed
    overheads dominate tiny inputs); beyond the last point the last segment's slope continues.
    """

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    lifted: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        xs, ys = tuple(float(x) for x in self.xs), tuple(float(y) for y in self.ys)
        if len(xs) != len(ys):
            raise ValueError(f"curve has {len(xs)} sizes but {len(ys)} latencies")
        if len(xs) < 2:
            raise ValueError("curve needs at least two sample points")
        if any(b <= a for a, b in zip(xs, xs[1:])):
            raise ValueError(f"curve sizes must be strictly increasing, got {xs}")
        if xs[0] <= 0 or not all(math.isfinite(v) for v in xs):
            raise ValueError(f"curve sizes must be positive and finite, got {xs}")
        if any(not math.isfinite(y) or y < 0 for y in ys):
            raise ValueError(f"curve latencies must be finite and >= 0, got {ys}")
        lifted, top = [], 0.0
        for y in ys:
            top = max(top, y)
            lifted.append(top)
        object.__setattr__(self, "xs", xs)
        object.__setattr__(self, "ys", ys)
        object.__setattr__(self, "lifted", tuple(lifted))

    def __call__(self, x: float) -> float:
        if not math.isfinite(x) or x < 0:
            raise ValueError(f"size must be finite and >= 0, got {x}")
        xs, ys = self.xs, self.lifted
        if x <= xs[0]:
            return ys[0]
        # beyond the last point: extend the last segment (i = last index - 1)
        i = len(xs) - 2
        for j in range(len(xs) - 1):
            if x <= xs[j + 1]:
                i = j
                break
        slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
        return ys[i] + slope * (x - xs[i])

    def to_dict(self) -> dict:
        return {"xs": list(self.xs), "ys": list(self.ys)}

    @classmethod
    def from_dict(cls, d: dict) -> "Curve":
        return cls(tuple(d["xs"]), tuple(d["ys"]))


@dataclass(frozen=True)
class LatencyProfile:
    """Prefill curves per mode (against prompt length) and the decode-step curve (against batch)."""

    monolithic: Curve
    chunked: Curve
    decode: Curve
    chunk_size: int = DEFAULT_CHUNK
    name: str = ""

    def __post_init__(self) -> None:
        for attr in ("monolithic", "chunked", "decode"):
            if not isinstance(getattr(self, attr), Curve):
                raise TypeError(f"profile.{attr} must be a Curve")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")

    def prefill(self, prompt_len: int, mode: PrefillMode = "monolithic") -> float:
        """P_m(L): seconds to prefill a prompt of L tokens in mode m."""
        if mode not in PREFILL_MODES:
            raise ValueError(f"unknown prefill mode {mode!r}; expected one of {PREFILL_MODES}")
        return (self.monolithic if mode == "monolithic" else self.chunked)(prompt_len)

    def chunk(self, tokens: int) -> float:
        """P_chunked(c): seconds for one prefill chunk of c <= chunk_size tokens."""
        if not 0 < tokens <= self.chunk_size:
            raise ValueError(f"chunk of {tokens} tokens outside 1..{self.chunk_size}")
        return self.chunked(tokens)

    def decode_step(self, batch: int) -> float:
        """D(B): seconds for one decode step of a batch of B requests."""
        if batch < 1:
            raise ValueError(f"decode batch must be >= 1, got {batch}")
        return self.decode(batch)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "name": self.name, "chunk_size": self.chunk_size,
            "monolithic": self.monolithic.to_dict(), "chunked": self.chunked.to_dict(),
            "decode": self.decode.to_dict(),
        }, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "LatencyProfile":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"latency profile is not valid JSON: {e}") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"latency profile has unknown format (want format={FORMAT})")
        try:
            return cls(Curve.from_dict(d["monolithic"]), Curve.from_dict(d["chunked"]),
                       Curve.from_dict(d["decode"]), int(d["chunk_size"]), str(d.get("name", "")))
        except (KeyError, TypeError) as e:
            raise ValueError(f"latency profile is missing or has a bad field: {e}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (temp file + rename) so a crash never leaves a torn cache."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LatencyProfile":
        return cls.from_json(Path(path).read_text())


def _measure(fn: Callable[[int], float], size: int, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn(size)
    samples = []
    for _ in range(repeats):
        t = float(fn(size))
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"timer returned {t} s for size {size}; want a finite time >= 0")
        samples.append(t)
    return statistics.median(samples)  # median: one scheduler hiccup must not set the curve


def _chunked_from_monolithic(mono: Curve, prompt_len: int, chunk_size: int) -> float:
    full, rest = divmod(prompt_len, chunk_size)
    return full * mono(chunk_size) + (mono(rest) if rest else 0.0)


def profile_engine(
    run_prefill: Callable[[int], float],
    run_decode_step: Callable[[int], float],
    lengths: Iterable[int],
    batch_sizes: Iterable[int],
    repeats: int = 3,
    *,
    run_chunked_prefill: Callable[[int], float] | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    warmup: int = 1,
    name: str = "",
) -> LatencyProfile:
    """Measure an engine through callables that return the seconds one operation took.

    run_prefill(L): a monolithic prefill of L tokens. run_decode_step(B): one decode step of a
    batch of B. run_chunked_prefill(L): a chunked prefill of L tokens; when the engine cannot
    run one apart, the chunked curve is derived from the monolithic one as back-to-back
    prefills of chunk_size tokens plus the remainder (ignores attention to earlier chunks, so
    it under-estimates long prompts; measure it where possible). Each point is the median of
    `repeats` runs after `warmup` discarded runs.
    """
    lengths, batch_sizes = sorted(set(int(x) for x in lengths)), sorted(set(int(b) for b in batch_sizes))
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    if len(lengths) < 2 or len(batch_sizes) < 2:
        raise ValueError("profile needs at least two prompt lengths and two batch sizes")
    mono = Curve(tuple(lengths), tuple(_measure(run_prefill, L, repeats, warmup) for L in lengths))
    if run_chunked_prefill is not None:
        chunked_ys = tuple(_measure(run_chunked_prefill, L, repeats, warmup) for L in lengths)
    else:
        chunked_ys = tuple(_chunked_from_monolithic(mono, L, chunk_size) for L in lengths)
    decode = Curve(tuple(batch_sizes),
                   tuple(_measure(run_decode_step, b, repeats, warmup) for b in batch_sizes))
    return LatencyProfile(mono, Curve(tuple(lengths), chunked_ys), decode, chunk_size, name)
