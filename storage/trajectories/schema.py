"""The trajectory dataset's schema: one row per turn, versioned (docs/trajectory_schema.md).

Bump SCHEMA_VERSION on any change a reader could notice (a field added, removed, retyped or
given a new meaning); every row carries the version it was written with.
"""
from __future__ import annotations

import math
import numbers
from datetime import datetime, timezone
from typing import Any, NamedTuple

import pyarrow as pa

SCHEMA_VERSION = 1
STATUSES = ("ok", "invalid_action", "truncated", "aborted", "rerouted")
WORKER_KINDS = ("rollout", "serving")


class Field(NamedTuple):
    name: str
    type: pa.DataType
    doc: str
    nullable: bool = False


_I32_LIST = pa.list_(pa.int32())
FIELDS: tuple[Field, ...] = (
    Field("schema_version", pa.int32(), "schema version the row was written with (filled in)"),
    Field("run", pa.string(), "run id; also the Hive partition key (directory run=...)"),
    Field("step", pa.int64(), "RL step; also the Hive partition key (directory step=...)"),
    Field("policy_version", pa.int64(), "weights version that generated the turn"),
    Field("group", pa.int32(), "GRPO group within the step (trajectories share the initial state)"),
    Field("trajectory", pa.string(), "global trajectory id, e.g. s3-g2-t5"),
    Field("turn", pa.int32(), "turn index within the trajectory, from 0"),
    Field("env", pa.string(), "environment name, e.g. frozenlake"),
    Field("prompt_ids", _I32_LIST, "token ids fed to the model for this turn"),
    Field("response_ids", _I32_LIST, "token ids the model generated"),
    Field("prompt_text", pa.string(), "prompt_ids decoded"),
    Field("response_text", pa.string(), "response_ids decoded"),
    Field("logprobs", pa.list_(pa.float32()), "sampling logprob of each response token"),
    Field("reward", pa.float64(), "the environment's reward for this turn"),
    Field("trajectory_reward", pa.float64(), "the whole trajectory's reward, on all its rows"),
    Field("advantage", pa.float64(), "GRPO advantage when known (null until training)", True),
    Field("done", pa.bool_(), "true on the turn that ended the episode"),
    Field("status", pa.string(), "one of: " + ", ".join(STATUSES)),
    Field("worker", pa.string(), "Dask worker that served the turn, e.g. rollout-0"),
    Field("worker_kind", pa.string(), "one of: " + ", ".join(WORKER_KINDS)),
    Field("queued_s", pa.float64(), "seconds the turn waited: in the rollout scheduler's "
          "queue (no worker had room) plus in the engine's queue before its prefill"),
    Field("prefill_s", pa.float64(), "seconds to first token"),
    Field("decode_s", pa.float64(), "seconds from first to last token"),
    Field("env_s", pa.float64(), "seconds the environment took to answer the turn"),
    Field("num_prompt_tokens", pa.int32(), "prompt tokens the engine processed for the turn"),
    Field("num_cached_tokens", pa.int32(), "prompt tokens served from the prefix cache"),
    Field("finished_at", pa.timestamp("us", tz="UTC"), "when the turn finished (UTC)"),
)
FIELD_NAMES = tuple(f.name for f in FIELDS)
TURN_SCHEMA = pa.schema(
    [pa.field(f.name, f.type, nullable=f.nullable, metadata={"doc": f.doc}) for f in FIELDS],
    metadata={"rose.schema_version": str(SCHEMA_VERSION)},
)
_TIMINGS = ("queued_s", "prefill_s", "decode_s", "env_s")


class SchemaError(ValueError):
    """A row does not match the trajectory schema; the message names the row and field."""


def trajectory_id(step: int, group: int, index: int) -> str:
    """The global id of trajectory `index` of `group` in `step`: s<step>-g<group>-t<index>."""
    return f"s{step}-g{group}-t{index}"


def _check_row(i: int, row: dict[str, Any]) -> None:
    def bad(field: str, why: str) -> SchemaError:
        return SchemaError(f"row {i}: field '{field}' {why}")

    if not isinstance(row, dict):
        raise SchemaError(f"row {i}: expected a dict, got {type(row).__name__}")
    unknown = sorted(set(row) - set(FIELD_NAMES))
    if unknown:
        raise bad(unknown[0], "is not in the trajectory schema v%d" % SCHEMA_VERSION)
    for f in FIELDS:
        if row.get(f.name) is None and not f.nullable:
            raise bad(f.name, "is missing" if f.name not in row else "is null")
    if row["status"] not in STATUSES:
        raise bad("status", f"is {row['status']!r}, expected one of {', '.join(STATUSES)}")
    if row["worker_kind"] not in WORKER_KINDS:
        raise bad("worker_kind", f"is {row['worker_kind']!r}, expected rollout or serving")
    for name in _TIMINGS:
        v = row[name]
        number = isinstance(v, numbers.Real) and not isinstance(v, bool)
        if not (number and math.isfinite(v) and v >= 0):
            raise bad(name, f"must be a finite number of seconds >= 0, got {v!r}")
    for name in ("prompt_ids", "response_ids", "logprobs"):
        if isinstance(row[name], (str, bytes)) or not hasattr(row[name], "__len__"):
            raise bad(name, f"must be a list, got {type(row[name]).__name__}")
    if len(row["logprobs"]) != len(row["response_ids"]):
        raise bad("logprobs", f"has {len(row['logprobs'])} values for "
                              f"{len(row['response_ids'])} response tokens")
    for name in ("num_prompt_tokens", "num_cached_tokens", "turn", "group", "step"):
        if isinstance(row[name], numbers.Integral) and row[name] < 0:
            raise bad(name, f"must be >= 0, got {row[name]}")
    cached, prompt = row["num_cached_tokens"], row["num_prompt_tokens"]
    if isinstance(cached, numbers.Integral) and isinstance(prompt, numbers.Integral) \
            and cached > prompt:
        raise bad("num_cached_tokens", f"({row['num_cached_tokens']}) exceeds "
                                       f"num_prompt_tokens ({row['num_prompt_tokens']})")


def _timestamp(v: Any) -> Any:
    # Epoch seconds are accepted for convenience; Arrow wants datetimes for timestamp columns.
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return datetime.fromtimestamp(v, tz=timezone.utc)
    return v


def rows_to_table(rows: list[dict[str, Any]], run: str, step: int) -> pa.Table:
    """Validate rows of one (run, step) and build the Arrow table; SchemaError names the field.

    schema_version, run and step may be omitted (they are filled in); if given they must match.
    """
    fixed = {"schema_version": SCHEMA_VERSION, "run": run, "step": step}
    full = []
    for i, row in enumerate(rows):
        for name, want in fixed.items():
            if isinstance(row, dict) and name in row and row[name] != want:
                raise SchemaError(f"row {i}: field '{name}' is {row[name]!r}, expected {want!r}")
        row = {**fixed, **row} if isinstance(row, dict) else row
        _check_row(i, row)
        full.append(row)
    columns = {}
    for f in FIELDS:
        values = [r.get(f.name) for r in full]
        if f.name == "finished_at":
            values = [_timestamp(v) for v in values]
        columns[f.name] = _column(f, values)
    return pa.table(columns, schema=TURN_SCHEMA)


def _fits(have: pa.DataType, want: pa.DataType) -> bool:
    """Whether an inferred type converts to the schema's type without losing meaning."""
    if pa.types.is_null(have):
        return True
    if pa.types.is_list(want):
        return pa.types.is_list(have) and _fits(have.value_type, want.value_type)
    if pa.types.is_integer(want):
        return pa.types.is_integer(have)  # a float here would be silently truncated
    if pa.types.is_floating(want):
        return pa.types.is_integer(have) or pa.types.is_floating(have)
    if pa.types.is_string(want):
        return pa.types.is_string(have) or pa.types.is_large_string(have)
    if pa.types.is_timestamp(want):
        return pa.types.is_timestamp(have)
    return have == want


def _convert(value: Any, f: Field) -> pa.Array:
    arr = pa.array(value)
    if not _fits(arr.type, f.type):
        raise TypeError(f"got {arr.type}")
    return arr.cast(f.type, safe=True)


def _column(f: Field, values: list[Any]) -> pa.Array:
    try:
        return _convert(values, f)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    for i, v in enumerate(values):  # slow path, only to name the offending row
        try:
            _convert([v], f)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            raise SchemaError(f"row {i}: field '{f.name}' is not {f.type} "
                              f"({str(e).splitlines()[0]}): {v!r:.80}") from None
    raise SchemaError(f"field '{f.name}': values of mixed types, expected {f.type}")


def empty_table() -> pa.Table:
    return TURN_SCHEMA.empty_table()


def schema_markdown() -> str:
    """The field table of docs/trajectory_schema.md, generated from FIELDS."""
    lines = ["| field | type | nullable | meaning |", "|---|---|---|---|"]
    lines += [f"| `{f.name}` | `{f.type}` | {'yes' if f.nullable else 'no'} | {f.doc} |"
              for f in FIELDS]
    return "\n".join(lines)


if __name__ == "__main__":  # regenerate the table in docs/trajectory_schema.md
    print(schema_markdown())
