"""sim/paper_figures.py's figures as markdown tables beside the paper's numbers (printed by
the bench, and docs/results.md's section through bench/results_doc.py)."""
from __future__ import annotations

from sim.report import speedup


def report(doc: dict) -> str:
    """The figures as markdown tables beside the paper's numbers (also docs/results.md's section)."""
    f1, P, lines = doc["fig1"], doc["paper"], []
    if f1:
        lines += ["| Fig. 1 statistic | simulated | paper |", "| --- | --- | --- |",
                  f"| rollout share of the step | {f1['rollout_share']:.0%} | > {P['rollout_share_min'][0]:.0%} |",
                  f"| P75 trajectory / rollout time | {f1['p75_share']:.0%} | <= {P['p75_share_max'][0]:.0%} |",
                  f"| prefill tokens / all tokens | {f1['prefill_share']:.0%} (fitted) | {P['prefill_share'][0]:.0%} |",
                  f"| rollout s, 8 rollout GPUs | {f1['rollout_s_8']:.0f} (fitted) | {P['rollout_s_8'][0]:.0f} |",
                  f"| rollout s, 16 rollout GPUs | {f1['rollout_s_16']:.0f} | {P['rollout_s_16'][0]:.0f} |", "",
                  *_train_tokens_table(doc, "8B")]
    if doc["fig7a"]:
        lines += _fig7a(doc)
    if doc.get("fig7_dapo"):
        lo, hi = P["dapo_vs_roll"][0]
        lines += ["| Fig. 7 (DAPO, 8B): valid groups | launched / step | fixed tokens/s | ROSE tokens/s | ROSE / fixed "
                  "| fixed / ROSE rollout s | borrowed | serving SLO met |", "| --- " * 8 + "|"]
        for d in doc["fig7_dapo"]:
            f, r = d["fixed"], d["rose"]
            cells = [f"{d['valid_share']:.0%} (chosen)", f"{d['launched_per_step']:.0f}", _num(f["tokens_per_s"]),
                     _num(r["tokens_per_s"]), _x(d["rose_vs_fixed"]),
                     f"{f['rollout_s_mean']:.0f} / {r['rollout_s_mean']:.0f}", f"{r['borrowed_share']:.0%}",
                     pct(r["slo_attainment"])]
            lines.append("| " + " | ".join(cells) + " |")
        lines += [f"| paper: ROSE vs ROLL | | | | {lo:.2f}-{hi:.2f}x | | | 100% |", ""]
    if doc["table3"]:
        lines += table3_rows(doc["table3"], P, "8B")
    if doc["fig14"]:
        lines += ["| Fig. 14 serving GPUs | rollout s | reduction vs no serving GPU |", "| --- | --- | --- |"]
        fig14 = {int(n): r for n, r in doc["fig14"].items()}  # JSON keys are strings
        base = fig14[0]["rollout_s_mean"]
        for n, r in sorted(fig14.items()):
            lines.append(f"| {n} | {r['rollout_s_mean']:.0f} | {1 - r['rollout_s_mean'] / base:+.0%} |")
        lines += [f"| paper | {P['fig14'][0]} | |", ""]
    lines += _overhead(doc) + _rollpacker(doc) + _concurrency(doc) + _scale(doc)
    if doc["sensitivity"]:
        lines += ["| trajectory sigma | env s/step | fixed rollout s | ROSE rollout s | ROSE / fixed | borrowed |",
                  "| --- " * 6 + "|"]
        for s in doc["sensitivity"]:
            lines.append(f"| {s['trajectory_sigma']:g} | {s['env_s']:g} | {s['fixed_rollout_s']:.0f} | "
                         f"{s['rose_rollout_s']:.0f} | {_x(s['rose_vs_fixed'])} | {s['borrowed_share']:.0%} |")
    lines += _tail_shapes(doc)
    return "\n".join(lines + [""] + report_32b(doc))


def _tail_shapes(doc: dict) -> list[str]:
    """Fig. 1b's statistics, Fig. 1c's 8 -> 16 GPU rollout and ROSE / fixed per tail shape."""
    rows, P = doc.get("tail_shapes"), doc["paper"]
    if not rows:
        return []
    lo, hi = P["grpo_vs_roll"][0]
    lines = ["", "| Fig. 1b tail shape (chosen) | response median | P75 / rollout | P75 s | longest s | rollout s, "
             "8 GPUs | 16 GPUs | 8 / 16 | ROSE / fixed | borrowed |", "| --- " * 10 + "|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['response_median']:.0f} | {r['p75_share']:.0%} | {r['p75_s']:.0f} | "
                     f"{r['max_s']:.0f} | {r['rollout_s_8']:.0f} | {r['rollout_s_16']:.0f} | "
                     f"{_x(r['rollout_s_8'] / r['rollout_s_16'])} | {_x(r['rose_vs_fixed'])} | "
                     f"{r['borrowed_share']:.0%} |")
    p75_lo, p75_hi = P["p75_s"][0]
    return lines + [f"| paper | | <= {P['p75_share_max'][0]:.0%} | {p75_lo:.0f}-{p75_hi:.0f} | "
                    f"> {P['tail_s_min'][0]:.0f} | {P['rollout_s_8'][0]:.0f} | {P['rollout_s_16'][0]:.0f} | "
                    f"{_x(P['rollout_s_8'][0] / P['rollout_s_16'][0])} | {lo:.2f}-{hi:.2f}x | |"]


def _fig7a(doc: dict) -> list[str]:
    """Fig. 7a's rows (GRPO, 8B) beside the paper's ratios to ROLL and AReaL."""
    P = doc["paper"]
    lo, hi = P["grpo_vs_roll"][0]
    lines = ["| Fig. 7a (GRPO, 8B) | tokens/s | vs fixed (turn-wise) | vs fixed (pinned) | rollout s | "
             "borrowed | serving SLO met |", "| --- " * 7 + "|"]
    for name, r in doc["fig7a"].items():
        lines.append(f"| {name} | {_num(r['tokens_per_s'])} | {_x(r['vs_fixed'])} | {_x(r['vs_fixed_pinned'])} | "
                     f"{r['rollout_s_mean']:.0f} | {r['borrowed_share']:.0%} | {pct(r['slo_attainment'])} |")
    lines += [f"| paper: ROSE vs ROLL | | {lo:.2f}-{hi:.2f}x | | | | 100% |"]
    areal = doc["fig7a"].get("areal_style")
    if areal:
        lo, hi = P["vs_areal"][0]
        lines += [f"| ROSE / AReaL-style | | {_x(speedup(doc['fig7a']['rose'], areal))} | | | | |",
                  f"| ROSE one-step off-policy / AReaL-style | | "
                  f"{_x(speedup(doc['fig7a']['rose_off_policy'], areal))} | | | | |",
                  f"| paper: ROSE vs AReaL | | {lo:.2f}-{hi:.2f}x | | | | |"]
    return lines + [""]


def _overhead(doc: dict) -> list[str]:
    """Fig. 8b: the resource-elastic baselines' allocation share of the step beside ROSE's."""
    rows = {n: r for n, r in doc["fig7a"].items() if n.startswith("elastic_") and n != "elastic_free"}
    if not rows:
        return []
    lo, hi = doc["paper"]["allocation_share"][0]
    lines = ["| Fig. 8b allocation overhead | allocation s / step | share of the step | vs fixed |",
             "| --- | --- | --- | --- |"]
    for name, r in rows.items():
        lines.append(f"| {name} | {name.removeprefix('elastic_')} (chosen) | {r['allocation_share']:.1%} | "
                     f"{_x(r['vs_fixed'])} |")
    free = doc["fig7a"].get("elastic_free")
    if free:
        lines.append(f"| elastic_free: 16 external GPUs from the step's start | 0 | 0% | {_x(free['vs_fixed'])} |")
    lines += ["| ROSE | none modelled (serving GPUs pull the policy in the background) | 0% | "
              f"{_x(doc['fig7a']['rose']['vs_fixed'])} |",
              f"| paper | | RLBoost+ / serverless {lo:.1%}-{hi:.1%}, ROSE < 0.5% | |", ""]
    return lines


def _rollpacker(doc: dict) -> list[str]:
    e = doc["fig7a"]
    if "rollpacker" not in e:
        return []
    lo, hi = doc["paper"]["rollpacker_vs_verl"][0]
    base = e["fixed_4_steps"]
    lines = ["| Tail batching (4 steps: 3 short rounds, 1 long) | tokens/s | vs fixed, 4 steps | rollout s | "
             "borrowed | long rounds |", "| --- " * 6 + "|"]
    for name in ("fixed_4_steps", "rollpacker", "rollpacker_rose"):
        r = e[name]
        lines.append(f"| {name} | {_num(r['tokens_per_s'])} | {_x(speedup(r, base))} | {r['rollout_s_mean']:.0f} | "
                     f"{r['borrowed_share']:.0%} | {r.get('long_rounds', 0)} |")
    lines += [f"| paper (RollPacker's own, over veRL, Qwen2.5) | | {lo:.2f}-{hi:.2f}x | | | |", ""]
    return lines


def _concurrency(doc: dict) -> list[str]:
    rows = doc.get("concurrency")
    if not rows:
        return []
    lines = ["| trajectories per GPU at once (not published) | fixed rollout s | fixed tokens/s | ROSE tokens/s | "
             "ROSE / fixed | 16 external GPUs / fixed | ROSE borrowed | ROSE SLO met |", "| --- " * 8 + "|"]
    for r in rows:
        lines.append(f"| {r['cap']} | {r['fixed_rollout_s']:.0f} | {_num(r['fixed_tokens_per_s'])} | "
                     f"{_num(r['rose_tokens_per_s'])} | {_x(r['rose_vs_fixed'])} | {_x(r['elastic_free_vs_fixed'])} | "
                     f"{r['rose_borrowed_share']:.0%} | {pct(r['rose_slo_attainment'])} |")
    return lines + [""]


def _scale(doc: dict) -> list[str]:
    sc = doc.get("scale")
    if not sc:
        return []
    lines = ["| Scale (ROSE) | GPUs | steps | events | wall s | CPU s | tokens/s | rollout s | serving SLO met |",
             "| --- " * 9 + "|"]
    for name in ("per_iteration", "jump", "large"):
        r = sc[name]
        lines.append(f"| {name.replace('_', '-')} | {r['gpus']} (+{r['serving_gpus']} serving) | {r['steps']} | "
                     f"{r['events']:,} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {_num(r['tokens_per_s'])} | "
                     f"{r['rollout_s_mean']:.0f} | {pct(r['slo_attainment'])} |")
    lines += [f"| bound (the issue) | 1,024 | 5 | | < {doc['paper']['scale_s'][0]:.0f} | | | | |", ""]
    return lines


def report_32b(doc: dict) -> list[str]:
    """sim/paper_figures_32b.py's rows beside the paper's 32B numbers."""
    d = doc.get("qwen3_32b")
    if not d:
        return []
    P, f1, e = d["paper"], d["fig1"], d["fig7a"]
    s = d["setting"]
    lines = [f"Qwen3-32B on ALFWorld: {s['rollout_engines']} rollout engines at TP {s['tp']} "
             f"({s['rollout_engines'] * s['tp']} GPUs), {s['train_gpus']} trainer GPUs, up to "
             f"{s['serving_engines']} serving engines ({s['serving_engines'] * s['tp']} GPUs), "
             f"{s['trajectories_per_step']:,} trajectories a step, {s['steps']} RL steps per run "
             f"(`python -m bench.sim.paper_figures --only-32b`, {d.get('total_s', 0) / 60:.1f} min).", "",
             "| Fig. 1 statistic (32B, fixed) | §6 setting | §2 setting (256 trajectories, 8 + 8 GPUs) | paper |",
             "| --- | --- | --- | --- |",
             f"| rollout share of the step | {pct(f1['rollout_share'])} | {pct(f1.get('s2_rollout_share'))} | "
             f"> {P['rollout_share_min'][0]:.0%} |",
             f"| P75 trajectory / rollout time | {pct(f1['p75_share'])} | {pct(f1.get('s2_p75_share'))} | "
             f"<= {P['p75_share_max'][0]:.0%} |",
             f"| prefill tokens / all tokens | {pct(f1['prefill_share'])} (fitted) | | {P['prefill_share'][0]:.0%} |",
             f"| ROSE rollout s | {e['rose']['rollout_s_mean']:.0f} (fitted, one step) | | "
             f"{P['rose_rollout_s'][0]:g} |", "", *_train_tokens_table(d),
             "| Fig. 7a-c (32B) | tokens/s | vs fixed | rollout s | borrowed | serving SLO met | paper |",
             "| --- " * 7 + "|"]
    paper = {"rose": f"{P['grpo_vs_roll'][0]:.2f}x over ROLL (GRPO)"}
    for name, r in e.items():
        lines.append(f"| {name} | {_num(r['tokens_per_s'])} | {_x(r['vs_fixed'])} | {r['rollout_s_mean']:.0f} | "
                     f"{r['borrowed_share']:.0%} | {pct(r['slo_attainment'])} | {paper.get(name, '')} |")
    lines.append(f"| ROSE / AReaL-style | | {_x(speedup(e['rose'], e['areal_style']))} | | | | "
                 f"{P['vs_areal'][0]:.2f}x |")
    dp = d["dapo"]
    lines.append(f"| DAPO ({dp['valid_share']:.0%} valid groups, chosen): ROSE / fixed | "
                 f"{_num(dp['rose']['tokens_per_s'])} | {_x(dp['rose_vs_fixed'])} | "
                 f"{dp['rose']['rollout_s_mean']:.0f} | {dp['rose']['borrowed_share']:.0%} | "
                 f"{pct(dp['rose']['slo_attainment'])} | {P['dapo_vs_roll'][0]:.2f}x over ROLL (DAPO) |")
    ttft, tpot = P["serving_p99_ms"][0]
    r = e["rose"]
    lines += [f"| ROSE serving P99 TTFT / TPOT ms | {r['ttft_p99_s'] * 1e3:.0f} / {r['tpot_p99_s'] * 1e3:.0f} | | | | "
              f"SLO {r['slo_ttft_s'] * 1e3:.0f} / {r['slo_tpot_s'] * 1e3:.0f} | {ttft:g} / {tpot:g} "
              "(SLO 1000 / 450) |", ""]
    if d.get("cap_sensitivity"):
        lines += ["| 32B trajectories at once per engine ('per-device ... 16', read per GPU or per engine) | "
                  "fixed rollout s | ROSE rollout s | ROSE / fixed | borrowed | serving SLO met |", "| --- " * 6 + "|"]
        lines += [f"| {c['per_engine']} | {c['fixed_rollout_s']:.0f} | {c['rose_rollout_s']:.0f} | "
                  f"{_x(c['rose_vs_fixed'])} | {c['borrowed_share']:.0%} | {pct(c['slo_attainment'])} |"
                  for c in d["cap_sensitivity"]] + [""]
    if d.get("table3"):
        lines += table3_rows(d["table3"], d["paper"], "32B")
    if d.get("table3_no_preemption"):
        u = d["table3_no_preemption"]
        lines += table3_rows(u["modes"], d["paper"], f"32B, {u['per_engine']} an engine: fixed preempted "
                                                     f"{u['fixed']['preempted']}")
    return lines + _findings_32b(d)


TABLE3_MODES = {"pinned": "pinned, on dedicated GPUs (the paper's baseline)",
                "pinned_borrowing": "pinned, borrowed serving GPUs too"}


def table3_rows(t3: dict, P: dict, model: str) -> list[str]:
    """Table 3's routing ablation: each mode's throughput, its speed-up over pinned, and where its
    turns ran (borrowed share, prefix-cache hits), beside the paper's order."""
    lines = [f"| Table 3 routing (ROSE, {model}) | tokens/s | vs pinned | rollout s | borrowed | prefix hits "
             "| route P99 ms |", "| --- " * 7 + "|"]
    for mode, r in t3.items():
        p99 = "-" if r.get("route_p99_ms") is None else f"{r['route_p99_ms']:.3f}"
        lines.append(f"| {TABLE3_MODES.get(mode, mode)} | {_num(r['tokens_per_s'])} | {_x(speedup(r, t3['pinned']))} | "
                     f"{r['rollout_s_mean']:.0f} | {r['borrowed_share']:.0%} | {pct(r['prefix_hit_tokens'])} | {p99} |")
    paper = " < ".join(f"{x:.2f}x" for x in P["table3"][0])
    return lines + [f"| paper (pinned < turn-wise < + affinity) | | {paper} | | | | "
                    f"< {P.get('route_p99_ms', (10.0,))[0]:g} |", ""]


TRAIN_TOKENS_TEXT = {"final_sequence": "each trajectory's final sequence once (the paper's reading)",
                    "every_turn": "every turn's whole context"}


def _train_tokens_table(d: dict, model: str = "32B") -> list[str]:
    """Fig. 1's statistics and ROSE / fixed with the trainer charged each way (SimConfig.train_tokens)."""
    rows, P = d["fig1"].get("train_tokens"), d["paper"]
    if not rows:
        return []
    vs_roll = P["grpo_vs_roll"][0]
    vs_roll = f"{vs_roll[0]:.2f}-{vs_roll[1]:.2f}" if isinstance(vs_roll, (list, tuple)) else f"{vs_roll:.2f}"
    lines = [f"| {model} trainer charged for (§6 setting) | train s a step | rollout share | P75 trajectory / rollout "
             "| ROSE / fixed |", "| --- " * 5 + "|"]
    lines += [f"| {TRAIN_TOKENS_TEXT.get(k, k)} | {r['train_s']:.0f} | {pct(r['rollout_share'])} | "
              f"{pct(r['p75_share'])} | {_x(r['rose_vs_fixed'])} |" for k, r in rows.items()]
    return lines + [f"| paper | | > {P['rollout_share_min'][0]:.0%} | <= {P['p75_share_max'][0]:.0%} | "
                    f"{vs_roll}x over ROLL (GRPO) |", ""]


def _findings_32b(d: dict) -> list[str]:
    """What decides the 32B rollout share and the P75 share, from this run's numbers."""
    f1 = d["fig1"]
    ratio, rows = f1.get("turn_tokens_per_sequence_token"), f1.get("train_tokens")
    if not ratio or not rows or not {"final_sequence", "every_turn"} <= set(rows):
        return []
    once, every = rows["final_sequence"], rows["every_turn"]
    s = d["setting"]
    comm = (f"The trainer's seconds include (TP, PP, CP) = ({', '.join(map(str, s['train_parallelism']))})'s "
            f"communication, {s['train_comm_share']:.0%} of them (TP all-reduces over NVLink, the CP ring over "
            "InfiniBand, not overlapped: sim/train_parallel.py). ") if s.get("train_parallelism") else ""
    return [f"The trainer's token model decides the 32B rollout share: on this workload every turn's whole context "
            f"is {ratio:.1f}x the tokens of the trajectories' final sequences, so a trainer charged for it spends "
            f"{every['train_s']:.0f} s a step (32 GPUs) and leaves rollout {pct(every['rollout_share'])} of the "
            f"step, against {once['train_s']:.0f} s and {pct(once['rollout_share'])} when each final sequence is "
            f"trained once. {comm}The paper does not say which its ROLL does; it describes a trajectory as one "
            "sequence of actions and feedback that training consumes, and trains 32B with context parallelism, so the "
            "figures use the final sequence (sim/paper_workloads.py PAPER_TRAIN_TOKENS). The P75 trajectory's "
            "share is measured from the step's launch: 1,024 trajectories on 4 engines at 64 each run in waves, "
            "so it counts the wait for a slot; ROSE, which places the waiting ones on serving engines, has "
            f"{pct(d['fig7a']['rose']['trajectory_p75_share'])}.", "",
            *areal_finding(d["fig7a"], "32B", d["paper"]["grpo_vs_roll"][0], d["paper"]["vs_areal"][0])]


def from_second_step(r: dict) -> float | None:
    """Tokens a second after the first step (the steady state of a run the paper trains 40-100
    steps): a one-step-ahead run's first step has no training to hide its generation behind."""
    steps = r.get("per_step") or []
    if len(steps) < 2:
        return None
    return sum(s["tokens"] for s in steps[1:]) / (steps[-1]["end_s"] - steps[0]["end_s"])


def areal_finding(e: dict, model: str, vs_roll: float, vs_areal: float) -> list[str]:
    """Why ROSE / AReaL-style misses the paper's ratio, from one model's Fig. 7a rows' per-step
    records (`e`: rows by name; `vs_roll`, `vs_areal`: the paper's ratios for that model)."""
    if not {"fixed", "rose", "areal_style", "rose_off_policy"} <= set(e):
        return []
    fixed, rose, areal = e["fixed"], e["rose"], e["areal_style"]
    steady = {k: from_second_step(e[k]) for k in ("fixed", "rose", "areal_style")}
    if None in steady.values():
        return []
    f_steps, a_steps = fixed["per_step"][1:], areal["per_step"][1:]
    hidden = sum(s["train_s"] + s["publish_s"] for s in f_steps) / len(f_steps)
    f_step = sum(s["step_s"] for s in f_steps) / len(f_steps)
    a_step = (a_steps[-1]["end_s"] - areal["per_step"][0]["end_s"]) / len(a_steps)
    a_roll = sum(s["rollout_s"] for s in a_steps) / len(a_steps)
    return [f"ROSE / AReaL-style, {model} ({_x(speedup(rose, areal))}; the paper {vs_areal:.2f}x): the AReaL-style "
            "configuration is the fixed system's GPUs and engines with generation one step ahead of training, so "
            "all it gains is the training it hides. From the per-step records: from the second step on, its steps "
            f"take {a_step:.0f} s (its rollout, {a_roll:.0f} s) against the fixed system's {f_step:.0f} s, of which "
            f"{hidden:.0f} s train and publish, {steady['areal_style'] / steady['fixed']:.2f}x; over all "
            f"{len(fixed['per_step'])} steps, whose first has nothing to overlap, "
            f"{_x(speedup(areal, fixed))}. ROSE / AReaL-style is ROSE / fixed ({_x(speedup(rose, fixed))}) "
            f"divided by that ({steady['rose'] / steady['areal_style']:.2f}x from the second step on). The "
            f"paper's own ratios put its AReaL below its ROLL: {vs_roll:.2f} / {vs_areal:.2f} = "
            f"{vs_roll / vs_areal:.2f}x ROLL's throughput, which no configuration of one engine on the same GPUs "
            "gives, since generating ahead never lengthens a step; what slows the paper's AReaL (its own "
            "inference and training stack, its GPU split and staleness bound for these runs, none published) is "
            "outside the simulator, and its per-step rollout and train seconds would settle it. The paper runs "
            "its ROLL baselines one-step off-policy ('we adopt one-step off-policy training for most baselines', "
            "§6), which is this AReaL-style configuration: ROSE one-step off-policy is "
            f"{_x(speedup(e['rose_off_policy'], areal))} that.", ""]


def _num(x) -> str:
    return "unfinished" if x is None else f"{x:,.0f}"


def _x(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"
