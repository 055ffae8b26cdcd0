"""The PNGs of bench/sim/paper_figures.py, one per figure, each with the paper's figure named in its
title and the paper's range drawn where it gives one: Fig. 7a's step throughput per
configuration, Fig. 8b's allocation overhead, Table 3's routing ablation, Fig. 14's rollout time
against the serving-GPU quota, and the sensitivity of ROSE / fixed to the unpublished parameters.

    python -m bench.sim.paper_figures_plot [bench/results/paper_figures.json]   # writes them beside it
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from bench.lib.results import RESULTS

DEFAULT_JSON = RESULTS / "paper_figures.json"
FIGURES = ("fig7a", "fig8b", "table3", "fig14", "sensitivity")


def png_names() -> list[str]:
    return [f"paper_figures_{f}.png" for f in FIGURES]


def plot(doc: dict, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, draw in zip(FIGURES, (_fig7a, _fig8b, _table3, _fig14, _sensitivity)):
        fig, ax = plt.subplots(figsize=(9 if name == "fig7a" else 6, 4.6), constrained_layout=True)
        draw(ax, doc)
        ax.grid(True, alpha=0.3)
        path = directory / f"paper_figures_{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        out.append(path)
    return out


def _fig7a(ax, doc: dict) -> None:
    e2e = doc["fig7a"]
    names = list(e2e)
    colors = ["tab:red" if n.startswith("rose") or n == "rollpacker_rose" else "tab:gray" for n in names]
    ax.bar(names, [(e2e[n]["tokens_per_s"] or 0) / 1e3 for n in names], color=colors)
    lo, hi = doc["paper"]["grpo_vs_roll"][0]
    base = e2e["fixed"]["tokens_per_s"] or 0
    ax.axhspan(lo * base / 1e3, hi * base / 1e3, color="tab:red", alpha=0.12, label=f"paper: ROSE {lo}-{hi}x ROLL")
    ax.set_title("Fig. 7a (GRPO, Qwen3-8B, 16 GPUs + 16 serving): step throughput, simulated")
    ax.set_ylabel("thousand tokens/s")
    ax.tick_params(axis="x", rotation=40, labelsize=8)
    ax.legend(fontsize=8)


def _fig8b(ax, doc: dict) -> None:
    rows = {n: r for n, r in doc["fig7a"].items() if n.startswith("elastic_") and n != "elastic_free"}
    names = list(rows) + ["rose"]
    ax.bar(names, [100 * rows[n]["allocation_share"] for n in rows] + [0.0],
           color=["tab:gray"] * len(rows) + ["tab:red"])
    lo, hi = doc["paper"]["allocation_share"][0]
    ax.axhspan(100 * lo, 100 * hi, color="tab:gray", alpha=0.15, label="paper: RLBoost+ / serverless")
    ax.axhline(0.5, color="tab:red", linestyle=":", label="paper: ROSE < 0.5%")
    ax.set_title("Fig. 8b: allocation overhead, % of the step")
    ax.set_ylabel("% of step time")
    ax.legend(fontsize=8)


def _table3(ax, doc: dict) -> None:
    t3 = doc["table3"]
    names = {"pinned": "pinned\n(dedicated)", "pinned_borrowing": "pinned\n(+ borrowed)",
             "turnwise": "turn-wise", "turnwise_affinity": "turn-wise\n+ affinity"}
    ax.bar([names.get(m, m) for m in t3], [(t3[m]["tokens_per_s"] or 0) / 1e3 for m in t3], color="tab:red")
    paper = " < ".join(f"{x:.2f}" for x in doc["paper"]["table3"][0])
    ax.set_title(f"Table 3, 8B routing ablation (paper, vs pinned: {paper})", fontsize=10)
    ax.set_ylabel("thousand tokens/s")


def _fig14(ax, doc: dict) -> None:
    q = {int(n): r for n, r in doc["fig14"].items()}
    xs = sorted(q)
    ax.plot(xs, [q[n]["rollout_s_mean"] for n in xs], marker="s", color="tab:red")
    ax.set_xticks(xs)
    ax.set_title("Fig. 14: rollout time vs serving-GPU quota (paper's values lost in extraction)")
    ax.set_xlabel("borrowed serving GPUs")
    ax.set_ylabel("rollout seconds per step")


def _sensitivity(ax, doc: dict) -> None:
    for env in sorted({s["env_s"] for s in doc["sensitivity"]}):
        rows = [s for s in doc["sensitivity"] if s["env_s"] == env]
        ax.plot([s["trajectory_sigma"] for s in rows], [s["rose_vs_fixed"] or 0 for s in rows], marker="o",
                label=f"env {env:g} s/step")
    ax.axhline(1.0, color="black", linestyle=":", linewidth=0.8)
    ax.set_title("Sensitivity: ROSE / fixed against unpublished workload parameters")
    ax.set_xlabel("trajectory-level response sigma (not published)")
    if doc["sensitivity"]:
        ax.legend(fontsize=8)


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_JSON
    print("wrote " + ", ".join(str(p) for p in plot(json.loads(path.read_text()), path.parent)))


if __name__ == "__main__":
    main()
