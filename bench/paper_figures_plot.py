"""The PNG of bench/paper_figures.py: Fig. 7a's step throughput per configuration, Table 3's
routing ablation, Fig. 14's rollout time against the serving-GPU quota, and the sensitivity of
ROSE / fixed to the trajectory-level spread, each with the paper's figure named in its title.

    python bench/paper_figures_plot.py [bench/results/paper_figures.json]   # writes the PNG beside it
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "paper_figures.json"


def plot(doc: dict, png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4.6), constrained_layout=True)
    e2e = doc["fig7a"]
    names = list(e2e)
    ax = axes[0]
    ax.bar(names, [(e2e[n]["tokens_per_s"] or 0) / 1e3 for n in names],
           color=["tab:gray", "silver", "tab:red", "tab:blue", "tab:green", "tab:purple", "salmon"][:len(names)])
    lo, hi = doc["paper"]["grpo_vs_roll"][0]
    base = e2e["fixed"]["tokens_per_s"] or 0
    ax.axhspan(lo * base / 1e3, hi * base / 1e3, color="tab:red", alpha=0.12, label=f"paper: ROSE {lo}-{hi}x ROLL")
    ax.set_title("Fig. 7a (GRPO, Qwen3-8B): step throughput")
    ax.set_ylabel("thousand tokens/s")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8)
    t3 = doc["table3"]
    axes[1].bar(list(t3), [t3[m]["rollout_s_mean"] for m in t3], color="tab:red")
    axes[1].set_title("Table 3: ROSE routing, rollout s")
    axes[1].set_ylabel("rollout seconds per step")
    q = {int(n): r for n, r in doc["fig14"].items()}
    xs = sorted(q)
    axes[2].plot(xs, [q[n]["rollout_s_mean"] for n in xs], marker="s", color="tab:red")
    axes[2].set_xticks(xs)
    axes[2].set_title("Fig. 14: rollout time vs serving-GPU quota")
    axes[2].set_xlabel("borrowed serving GPUs")
    axes[2].set_ylabel("rollout seconds per step")
    for env in sorted({s["env_s"] for s in doc["sensitivity"]}):
        rows = [s for s in doc["sensitivity"] if s["env_s"] == env]
        axes[3].plot([s["trajectory_sigma"] for s in rows], [s["rose_vs_fixed"] or 0 for s in rows], marker="o",
                     label=f"env {env:g} s/step")
    axes[3].axhline(1.0, color="black", linestyle=":", linewidth=0.8)
    axes[3].set_title("Sensitivity: ROSE / fixed")
    axes[3].set_xlabel("trajectory-level response sigma (not published)")
    axes[3].legend(fontsize=8)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.suptitle("ROSE paper figures, simulated (sim/, H100 profiles + long-context terms, "
                 "workload_paper_qwen3_8b_frozenlake); 16 GPUs (8 rollout, 8 train) + up to 16 serving GPUs",
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
