"""Rich tables of bench/transfer/transfer.py: the codec/shard comparison and the end-to-end runs."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_cases(console: Console, summaries: list[dict]) -> None:
    table = Table(title="Bytes per publish and CPU time (1 thread) per method; x bound = size / "
                        "entropy bound")
    for col in ("case", "density", "method", "MB", "x bound", "x smaller than dense",
                "encode s", "decode s", "encode GB/s", "decode GB/s"):
        table.add_column(col, justify="left" if col in ("case", "method") else "right")
    for s in summaries:
        table.add_row(s["case"], f"{s['density']:.2%}", "entropy bound",
                      f"{s['bound_bytes'] / 1e6:.3f}", "1.00",
                      f"{s['dense_bytes'] / max(s['bound_bytes'], 1):.1f}", "", "", "", "")
        for name, m in s["methods"].items():
            style = "bold" if name == "ours" else None
            table.add_row("", "", name, f"{m['bytes'] / 1e6:.3f}", f"{m['ratio_to_bound']:.2f}",
                          f"{m['compression_vs_dense']:.1f}", f"{m['encode_s']:.2f}",
                          f"{m['decode_s']:.2f}", f"{m['encode_gbps']:.2f}",
                          f"{m['decode_gbps']:.2f}", style=style)
        table.add_section()
    console.print(table)
    for s in summaries:
        ours, xor = s["methods"]["ours"], s["methods"]["xor_zstd1"]
        picks = ", ".join(f"{k} x{v}" for k, v in sorted(s["ours_encodings"].items()))
        speed = xor["encode_s"] / ours["encode_s"] if ours["encode_s"] else float("inf")
        console.print(f"{s['case']}: ours {ours['ratio_to_bound']:.2f}x bound (target <= 1.25), "
                      f"encode {speed:.2f}x xor_zstd1's speed (target >= 1); "
                      f"tensors by encoding: {picks}", highlight=False)


def _paired(row: dict) -> str:
    if "paired_median_speedup" not in row:
        return ""
    low, high = row.get("paired_ci95", (None, None))
    ci = f" ({low:.2f}-{high:.2f})" if low is not None else ""  # older files: no interval
    return f"{row['paired_median_speedup']:.2f}x{ci}"


def print_e2e(console: Console, rows: list[dict]) -> None:
    sizes = {r["workload"]: r["bytes"] for r in rows if r["method"] == "dense"}
    table = Table(title="Publish-to-applied through Mooncake, sender paced to the link rate "
                        "(emulated token bucket; loopback = unpaced); wall seconds; models: "
                        + ", ".join(f"{w} = {b / 1e6:.1f} MB bf16" for w, b in sizes.items())
                        + "; model = max(bytes / rate, sender CPU s / cores, receiver CPU s / "
                        "cores); shared = the same with both on the same cores, max(bytes / "
                        "rate, (sender + receiver CPU s) / cores), as here; paired = median "
                        "of dense / ours over the back-to-back runs (its 95% bootstrap interval)")
    for col in ("workload", "Gbps", "method", "MB sent", "raw/tensors", "encode", "push",
                "pull", "apply", "total", "speedup", "paired", "model", "x model", "x shared"):
        table.add_column(col, justify="left" if col in ("workload", "method") else "right")
    dense = {(r["workload"], r["gbps"]): r for r in rows if r["method"] == "dense"}
    last = None
    for r in rows:
        if last is not None and (r["workload"], r["gbps"]) != last:
            table.add_section()
        last = (r["workload"], r["gbps"])
        base = dense.get(last)
        speedup = f"{base['total_s'] / r['total_s']:.2f}x" if base else ""
        gbps = f"{r['gbps']:g}" if r["gbps"] else f"loopback ({r.get('model_gbps', 0):.1f})"
        mix = f"{r['raw_tensors']}/{r['tensors']}" if "tensors" in r else ""
        table.add_row(r["workload"], gbps, r["method"], f"{r['bytes'] / 1e6:.2f}", mix,
                      f"{r['encode_s']:.3f}", f"{r['push_s']:.3f}", f"{r['fetch_s']:.3f}",
                      f"{r['apply_s']:.3f}", f"{r['total_s']:.3f}", speedup,
                      _paired(r),
                      f"{r.get('model_s', 0):.3f}", f"{r.get('over_model', 0):.2f}",
                      f"{r.get('over_shared_model', 0):.2f}", style="bold" if r["method"] == "ours" else None)
    console.print(table)
