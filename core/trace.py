"""A serving trace (Azure LLM inference, BurstGPT, Mooncake or a generic CSV) and the plan to replay a window of it.

Trace time is seconds since the trace's first request. A replay takes a window of trace time,
optionally keeps a seeded random fraction of its requests (`sample`, burst shape preserved in
expectation), then maps each request to
  send_at    = (arrival - window start) * time_scale      (replay seconds; 0.125 = 8x faster)
  prompt_len = clamp(round(ContextTokens * length_scale), 1, max_model_len - 1)
  max_tokens = clamp(round(GeneratedTokens * output_scale), 1, max_model_len - prompt_len)
and is sent with EOS ignored, so it generates exactly max_tokens. The trace's attribution
(NOTICE.md next to it) travels with everything derived from it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Shipped in the repository (traces/), with its NOTICE.md (CC BY 4.0 attribution) beside it.
DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "traces" / "azure2023_code.csv"


@dataclass(frozen=True)
class Trace:
    arrival_s: np.ndarray  # float64, seconds since the trace's first request, non-decreasing
    context_tokens: np.ndarray  # int64 prompt lengths
    generated_tokens: np.ndarray  # int64 output lengths
    source: str = ""

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0

    def window(self, start_s: float, duration_s: float) -> "Trace":
        """Requests arriving in [start_s, start_s + duration_s); trace times are kept."""
        if duration_s <= 0:
            raise ValueError(f"window duration must be > 0 s, got {duration_s}")
        lo, hi = np.searchsorted(self.arrival_s, [start_s, start_s + duration_s], side="left")
        return Trace(self.arrival_s[lo:hi], self.context_tokens[lo:hi],
                     self.generated_tokens[lo:hi], self.source)


# Public trace formats, by their column names: (arrival, prompt tokens, output tokens). Arrival
# is a date-time string or a number of seconds (milliseconds where the format says so).
FORMATS = {
    "Azure LLM inference 2023/2024": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "BurstGPT": ("Timestamp", "Request tokens", "Response tokens"),
    "Mooncake (JSONL, ms)": ("timestamp", "input_length", "output_length"),
    "generic": ("arrival_s", "prompt_tokens", "output_tokens"),
}
MILLISECONDS = {"Mooncake (JSONL, ms)"}


def load_trace(path: str | Path = DEFAULT_TRACE) -> Trace:
    """A serving trace from a CSV or JSON-lines file in one of FORMATS (told apart by columns)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace {path} not found")
    table = _read_table(path)
    names = set(table.column_names)
    found = [(fmt, cols) for fmt, cols in FORMATS.items() if set(cols) <= names]
    if not found:
        known = "; ".join(f"{fmt}: {', '.join(cols)}" for fmt, cols in FORMATS.items())
        raise ValueError(f"trace {path} has columns {sorted(names)}, none of the known formats ({known})")
    fmt, (t_col, ctx_col, gen_col) = found[0]
    if table.num_rows == 0:
        raise ValueError(f"trace {path} has no requests")
    arrival = _seconds(table[t_col], path, scale=1e-3 if fmt in MILLISECONDS else 1.0)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order] - arrival[order][0]
    try:
        ctx = np.asarray(table[ctx_col].to_pylist(), dtype=np.int64)[order]
        gen = np.asarray(table[gen_col].to_pylist(), dtype=np.int64)[order]
    except (TypeError, ValueError) as e:
        raise ValueError(f"trace {path}: token counts in {ctx_col!r}/{gen_col!r} are not integers ({e})") from e
    if (ctx < 0).any() or (gen < 0).any():
        raise ValueError(f"trace {path} has negative token counts")
    return Trace(arrival, ctx, gen, str(path))


def _read_table(path: Path):
    """The file as an Arrow table; arrival columns read as written (strings stay strings)."""
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson

    lines = path.suffix in (".jsonl", ".json")
    try:
        if lines:
            return pjson.read_json(path)
        return pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(
            column_types={"TIMESTAMP": "string"}))  # 100 ns resolution: parsed exactly below
    except Exception as e:  # pyarrow's own errors name the line; keep the file's name with them
        raise ValueError(f"trace {path} cannot be read as {'JSON lines' if lines else 'CSV'}: {e}") from e


def _seconds(column, path: Path, scale: float) -> np.ndarray:
    """Arrival times in seconds: date-time strings ("2023-11-16 18:17:03.9799600", exact to the
    ns) or numbers (times `scale`)."""
    values = column.to_pylist()
    if any(v is None for v in values):
        raise ValueError(f"trace {path} has requests without an arrival time")
    if isinstance(values[0], str):
        try:
            stamps = np.array(values, dtype="datetime64[ns]")
        except ValueError:
            try:
                return np.asarray(values, dtype=np.float64) * scale
            except ValueError as e:
                raise ValueError(f"trace {path}: arrival times are neither date-times nor numbers ({e})") from e
        return (stamps - stamps.min()).astype(np.int64) / 1e9
    return np.asarray(values, dtype=np.float64) * scale


def busiest_bin(trace: Trace, bin_s: float = 1.0) -> tuple[float, int]:
    """(start, count) of the busiest fixed bin [k*bin_s, (k+1)*bin_s) of trace time: the
    largest burst. Ties go to the earliest bin."""
    if bin_s <= 0:
        raise ValueError(f"bin must be > 0 s, got {bin_s}")
    counts = np.bincount(np.floor(trace.arrival_s / bin_s).astype(np.int64))
    k = int(np.argmax(counts))
    return k * bin_s, int(counts[k])


def peak_window_start(trace: Trace, duration_s: float, bin_s: float = 1.0) -> float:
    """Start of the `duration_s` window centred on the busiest bin, kept inside the trace."""
    peak, _ = busiest_bin(trace, bin_s)
    start = peak + bin_s / 2 - duration_s / 2
    return float(min(max(start, 0.0), max(trace.span_s - duration_s, 0.0)))


@dataclass(frozen=True)
class Scaling:
    time_scale: float = 1.0  # replay seconds per trace second
    length_scale: float = 1.0  # prompt tokens per trace ContextTokens
    output_scale: float | None = None  # output tokens per GeneratedTokens (default: length_scale)
    sample: float = 1.0  # fraction of the window's requests kept (seeded)
    max_model_len: int = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("time_scale", "length_scale", "output_scale"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number, got {v}")
        if not 0 < self.sample <= 1:
            raise ValueError(f"sample must be in (0, 1], got {self.sample}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")

    @property
    def outputs(self) -> float:
        return self.length_scale if self.output_scale is None else self.output_scale


@dataclass(frozen=True)
class ReplayRequest:
    index: int  # position in the replay
    trace_row: int  # position in the window
    trace_arrival_s: float
    send_at_s: float  # replay time, from the replay's start
    prompt_len: int
    max_tokens: int
    context_tokens: int  # as in the trace
    generated_tokens: int


def plan(window: Trace, scaling: Scaling, start_s: float | None = None) -> list[ReplayRequest]:
    """The requests of `window`, scaled. `start_s` (default: the first arrival) is replay t=0."""
    if len(window) == 0:
        return []
    rows = np.arange(len(window))
    if scaling.sample < 1:
        keep = np.random.default_rng(scaling.seed).random(len(window)) < scaling.sample
        rows = rows[keep]
    t0 = float(window.arrival_s[0]) if start_s is None else float(start_s)
    ctx_cap = scaling.max_model_len - 1  # room for at least one generated token
    out: list[ReplayRequest] = []
    for i, row in enumerate(rows):
        ctx, gen = int(window.context_tokens[row]), int(window.generated_tokens[row])
        prompt = min(max(round(ctx * scaling.length_scale), 1), ctx_cap)
        tokens = min(max(round(gen * scaling.outputs), 1), scaling.max_model_len - prompt)
        arrival = float(window.arrival_s[row])
        out.append(ReplayRequest(i, int(row), arrival, (arrival - t0) * scaling.time_scale,
                                 prompt, tokens, ctx, gen))
    return out


def synthetic_prompt(request: ReplayRequest, vocab_size: int, seed: int = 0,
                     low: int = 0) -> list[int]:
    """Random token ids in [low, vocab_size), one seeded stream per request: reproducible and
    with no shared prefixes (the trace has no contents to reuse)."""
    if not 0 <= low < vocab_size:
        raise ValueError(f"token id range [{low}, {vocab_size}) is empty")
    rng = np.random.default_rng([seed, request.trace_row, request.index])
    return rng.integers(low, vocab_size, size=request.prompt_len).tolist()


def trace_notice(trace_path: str | Path, required: bool = True) -> str:
    """The trace's attribution (NOTICE.md beside it), marked as modified: we slice and rescale.
    Not required (a user's own trace): a missing NOTICE.md is said in the text instead."""
    notice = Path(trace_path).with_name("NOTICE.md")
    if not notice.is_file() and not required:
        return f"No NOTICE.md beside {Path(trace_path).name}: its source and terms are not recorded here."
    if not notice.is_file():
        raise FileNotFoundError(f"no NOTICE.md beside trace {trace_path}: its attribution must "
                                "travel with anything derived from it")
    return (notice.read_text() + "\nModified by ROSE: a time window of the trace, sampled, "
            "time- and length-scaled, replayed with synthetic prompts.\n")
