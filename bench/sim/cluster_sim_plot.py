"""The PNG of bench/sim/cluster_sim.py's sweep: per configuration against the RL job's GPUs, end-to-end
step throughput, its ratio to fixed rollout GPUs, serving P99 TTFT and TPOT against the SLO, SLO
attainment, the borrowed share of rollout tokens and the KV-affinity hit rate.

    python -m bench.sim.cluster_sim_plot [bench/results/cluster_sim.json]   # writes cluster_sim.png beside it

Rows plotted: each configuration with turn-wise + affinity routing at the SLO the fixed
configuration set (the README's headline table); ablations and the profile-SLO rows are left out.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from bench.lib.results import RESULTS

DEFAULT_JSON = RESULTS / "cluster_sim.json"
STYLE = {"fixed": ("fixed rollout GPUs", "tab:gray", "o"), "rose": ("ROSE", "tab:red", "s"),
         "slo_unaware": ("SLO-unaware multiplexing", "tab:blue", "^"),
         "static": ("static 50/50 partition", "tab:green", "D")}
PANELS = (  # (title, value of a row, y label, log scale)
    ("End-to-end step throughput", lambda r: r["tokens_per_s"], "tokens/s", True),
    ("Throughput vs fixed rollout GPUs", lambda r: r.get("speedup_vs_fixed", 1.0), "x fixed", False),
    ("Serving P99 / SLO: TTFT solid, TPOT dotted", lambda r: r["ttft_p99_s"] / r["slo_ttft_s"], "P99 / SLO", False),
    ("Serving SLO attainment", lambda r: 100 * (r["slo_attainment"] or 0.0), "% requests in SLO", False),
    ("Borrowed share of rollout tokens", lambda r: 100 * r["borrowed_share"], "%", False),
    ("KV-affinity hit rate (later turns)", lambda r: 100 * r["affinity_hit_rate"], "%", False),
)


def headline(rows: list[dict]) -> dict[str, list[dict]]:
    """config -> its headline rows, by GPUs."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        if r["mode"] == "turnwise_affinity" and not r.get("slo_rule"):
            out.setdefault(r["config"], []).append(r)
    return {c: sorted(rs, key=lambda r: r["gpus"]) for c, rs in out.items()}


def plot(result: dict, png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = headline(result["rows"])
    gpus = sorted({r["gpus"] for rs in series.values() for r in rs})
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), constrained_layout=True)
    for ax, (title, value, ylabel, log) in zip(axes.flat, PANELS):
        for config, rs in series.items():
            label, color, marker = STYLE.get(config, (config, None, "x"))
            ax.plot([r["gpus"] for r in rs], [value(r) for r in rs], marker=marker, color=color, label=label)
            if title.startswith("Serving P99"):
                ax.plot([r["gpus"] for r in rs], [r["tpot_p99_s"] / r["slo_tpot_s"] for r in rs], marker=marker,
                        color=color, linestyle=":", markerfacecolor="none")
        if title.startswith("Serving P99"):
            ax.legend(handles=[ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label="SLO")],
                      fontsize=8, loc="upper right")
        if title.startswith("Throughput vs"):
            ax.axhline(1.0, color="black", linestyle=":", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.minorticks_off()
        if log:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("RL job GPUs")
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(loc="upper left", fontsize=9)
    fig.supxlabel("RL job GPUs: half train, half roll out; the serving fleet lent to it = as many GPUs as roll out",
                  fontsize=10)
    a, fleet = result.get("args", {}), result.get("fleet")
    rate = fleet["settings"]["serving_rate"] if fleet else a.get("rate") or 6.0
    engines = (f"fleet {a.get('fleet')} (engines measured on the GPU, {a.get('workload')} turns)" if fleet
               else "every engine the local CPU models' measured profile, not a GPU kind")
    fig.suptitle(f"ROSE cluster simulation (sim/): {engines}; {a.get('steps', '?')} RL steps, seed "
                 f"{a.get('seed', '?')}, serving trace x{rate:.3g} per serving GPU; SLO = 2x fixed's P99 per scale",
                 fontsize=10)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_JSON
    print(f"wrote {plot(json.loads(path.read_text()), path.with_suffix('.png'))}")


if __name__ == "__main__":
    main()
