"""The tiny comparison's numbers, with bootstrap confidence intervals over seeds.

    python experiments/tiny/summarize.py runs/tiny_comparison --out experiments/tiny

Reads the job directories `compare.py` wrote (each holds `.hydra/config.yaml`, TensorBoard events
and `summary.json`) and its `comparison.json` (machine, calibration, eval noise), and writes:

  results.json  every arm's numbers per seed and their means with 95 % CIs, the claims' statistics,
                the calibration and the eval noise (the docs quote numbers from this file)
  results.md    the tables
  results.png   eval pass@1 against rollouts consumed, mean over seeds with a 95 % bootstrap band

Arms are keyed by (stage, algorithm, group size, delta, lag, lr). Confidence intervals are
percentile intervals of BOOTSTRAP resamples of seeds; comparisons between arms resample seeds
jointly, because the arms of one seed share their warm start (paired). Only the metric names of
`molt_flashreinforce.metrics` are read.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from molt_flashreinforce import metrics as tags
from molt_flashreinforce.report.events import read_scalars
from molt_flashreinforce.report.statistics import BOOTSTRAP, first_crossing, interval, mean_ci, resample_indices

EVAL = tags.eval_pass1("tiny")


# ── reading the jobs ──

def _arm(stage: str, cfg) -> tuple:
    algo = cfg.algo
    delta = float(algo.get("delta")) if algo.name == "flashreinforce" else None
    return stage, algo.name, int(algo.get("group_size", 1)), delta, int(cfg.local.policy_lag), float(cfg.local.lr)


def arm_id(arm: tuple) -> str:
    _, name, group, delta, lag, lr = arm
    method = f"grpo_g{group}" if name == "grpo" else f"flashreinforce_delta{delta:g}"
    return f"{method}_lag{lag}_lr{lr:g}"


def label(arm: tuple) -> str:
    _, name, group, delta, lag, lr = arm
    method = f"GRPO {128 // group}×{group}" if name == "grpo" else \
        f"FlashREINFORCE 128×1 δ={'∞' if delta == math.inf else f'{delta:g}'}"
    return f"{method}, lag {lag}, lr {lr:g}"


def collect(root: Path, stage: str = "*") -> dict[tuple, list[dict]]:
    arms: dict[tuple, list[dict]] = defaultdict(list)
    for config_file in sorted(root.glob(f"{stage}/*/.hydra/config.yaml")):
        job = config_file.parent.parent
        if not (job / "summary.json").is_file():
            continue  # unfinished
        cfg = OmegaConf.load(config_file)
        summary = json.loads((job / "summary.json").read_text())
        scalars = read_scalars(job)
        consumed = dict(scalars[tags.ROLLOUTS_CONSUMED])
        lag = int(cfg.local.policy_lag)
        # Updates before the lag is reached train on version 0 at a smaller lag.
        at_lag = lambda tag: [v for step, v in scalars.get(tag, ()) if step > lag]  # noqa: E731
        arms[_arm(job.parent.name, cfg)].append({
            "seed": int(cfg.seed),
            "curve": [(consumed[step], value) for step, value in scalars[EVAL]],
            "acceptance": statistics.fmean(at_lag(tags.ACCEPTANCE_RATE)) if tags.ACCEPTANCE_RATE in scalars else None,
            "sequence_kl": statistics.fmean(at_lag(tags.SEQUENCE_KL_MEAN)) if tags.SEQUENCE_KL_MEAN in scalars else None,
            "rl_wall_s": summary["rl_wall_s"],
            "generated_tokens": summary["generated_tokens"],
            "trained_tokens": summary["trained_tokens"],
            "peak_rss_mib": summary["peak_rss_mib"],
        })
    return arms


# ── statistics ──

def _paired(runs_a: list[dict], runs_b: list[dict]) -> tuple[list[dict], list[dict]]:
    seeds = sorted({r["seed"] for r in runs_a} & {r["seed"] for r in runs_b})
    pick = lambda runs: [next(r for r in runs if r["seed"] == s) for s in seeds]  # noqa: E731
    return pick(runs_a), pick(runs_b)


def half_the_rollouts(flash: list[dict], grpo: list[dict]) -> dict:
    """Claim 1: how many rollouts each arm needs to reach GRPO's final accuracy (the mean over
    seeds), and FlashREINFORCE's accuracy at half of GRPO's budget; seeds resampled jointly."""
    flash, grpo = _paired(flash, grpo)
    xs = np.asarray([x for x, _ in grpo[0]["curve"]])
    f_curves = np.asarray([[y for _, y in r["curve"]] for r in flash])
    g_curves = np.asarray([[y for _, y in r["curve"]] for r in grpo])
    half = int(np.argmin(np.abs(xs - xs[-1] / 2)))

    def statistics_of(index: np.ndarray) -> tuple[float, float, float, float, float]:
        f_mean, g_mean = f_curves[index].mean(axis=0), g_curves[index].mean(axis=0)
        target = g_mean[-1]
        return (first_crossing(xs, f_mean, target), first_crossing(xs, g_mean, target), f_mean[half],
                f_mean[half] - target, f_mean[-1] - target)

    point = statistics_of(np.arange(len(flash)))
    boot = np.asarray([statistics_of(index) for index in resample_indices(len(flash))])
    names = ("flashreinforce_rollouts_to_grpo_final", "grpo_rollouts_to_grpo_final", "flashreinforce_at_half_budget",
             "flashreinforce_at_half_minus_grpo_final", "flashreinforce_final_minus_grpo_final")
    out = {name: {"value": value, "ci95": interval(boot[:, k])} for k, (name, value) in enumerate(zip(names, point))}
    out.update(seeds=[r["seed"] for r in flash], grpo_budget=float(xs[-1]), half_budget=float(xs[half]),
               grpo_final=mean_ci(list(g_curves[:, -1])),
               rollouts_fraction=point[0] / xs[-1],
               seeds_flash_at_half_ge_grpo_final=int(sum(f_curves[:, half] >= g_curves[:, -1])))
    return out


def paired_difference(runs_a: list[dict], runs_b: list[dict]) -> dict:
    a, b = _paired(runs_a, runs_b)
    return mean_ci([x["curve"][-1][1] - y["curve"][-1][1] for x, y in zip(a, b)])


def summarize_arm(arm: tuple, runs: list[dict]) -> dict:
    runs = sorted(runs, key=lambda r: r["seed"])
    start = [r["curve"][0][1] for r in runs]
    end = [r["curve"][-1][1] for r in runs]
    optional = lambda key: mean_ci([r[key] for r in runs]) if runs[0][key] is not None else None  # noqa: E731
    return {
        "label": label(arm), "stage": arm[0], "algo": arm[1], "group_size": arm[2],
        "delta": None if arm[3] is None else ("inf" if arm[3] == math.inf else arm[3]),
        "lag": arm[4], "lr": arm[5], "seeds": [r["seed"] for r in runs],
        "rollouts": int(runs[0]["curve"][-1][0]),
        "start": mean_ci(start), "start_range": [min(start), max(start)], "end": mean_ci(end),
        "gain": mean_ci([e - s for s, e in zip(start, end)]),
        "acceptance": optional("acceptance"), "sequence_kl": optional("sequence_kl"),
        "rl_wall_s": mean_ci([r["rl_wall_s"] for r in runs]),
        "generated_tokens": mean_ci([r["generated_tokens"] for r in runs]),
        "trained_tokens": mean_ci([r["trained_tokens"] for r in runs]),
        "peak_rss_mib_max": max(r["peak_rss_mib"] for r in runs),
        "per_seed": {str(r["seed"]): {"start": s, "end": e, "gain": e - s, "rl_wall_s": r["rl_wall_s"],
                                      "generated_tokens": r["generated_tokens"], "trained_tokens": r["trained_tokens"],
                                      "acceptance": r["acceptance"], "sequence_kl": r["sequence_kl"],
                                      "curve": r["curve"]}
                     for r, s, e in zip(runs, start, end)},
    }


def _find(arms: dict, stage: str, name: str, lag: int, delta: float | None = None) -> tuple | None:
    return next((a for a in arms if a[0] == stage and a[1] == name and a[4] == lag
                 and (delta is None or a[3] == delta)), None)


def _cost_at(runs: list[dict], rollouts: float, key: str) -> float:
    """A run's cost up to `rollouts`, pro rata of its total (every update has the same batch)."""
    return statistics.fmean(r[key] * rollouts / r["curve"][-1][0] for r in runs)


def summarize(root: Path) -> dict:
    arms = collect(root)
    meta = json.loads((root / "comparison.json").read_text())
    out = {"measured": datetime.date.today().isoformat(), "machine": meta["machine"], "command": meta["command"],
           "comparison_wall_s": meta["wall_s"], "workers": meta["workers"], "bootstrap": BOOTSTRAP,
           "jobs": sum(map(len, arms.values())),
           "jobs_rl_wall_s": sum(r["rl_wall_s"] for runs in arms.values() for r in runs),
           "delta": meta["delta"], "default_lr": meta["default_lr"], "fast_lr": meta["fast_lr"], "lag_lr": meta["lag_lr"],
           "regime_max_rejection": meta["regime_max_rejection"], "calibration": meta["calibration"], "arms": {}}
    for a in sorted(arms, key=lambda a: (a[0], a[4], a[1] != "flashreinforce", str(a[3]))):
        out["arms"].setdefault(a[0], {})[arm_id(a)] = summarize_arm(a, arms[a])

    flash, grpo = _find(arms, "claim1", "flashreinforce", 0), _find(arms, "claim1", "grpo", 0)
    claim1 = half_the_rollouts(arms[flash], arms[grpo])
    to_target = claim1["flashreinforce_rollouts_to_grpo_final"]["value"]
    budget = claim1["grpo_budget"]
    claim1["cost"] = {key: {"flashreinforce_to_grpo_final": _cost_at(arms[flash], to_target, key)
                            if math.isfinite(to_target) else None,
                            "flashreinforce_at_half_budget": _cost_at(arms[flash], claim1["half_budget"], key),
                            "grpo_full_budget": _cost_at(arms[grpo], budget, key)}
                      for key in ("rl_wall_s", "generated_tokens", "trained_tokens")}
    for costs in claim1["cost"].values():
        costs["half_budget_fraction_of_grpo"] = costs["flashreinforce_at_half_budget"] / costs["grpo_full_budget"]
    out["claim1"] = claim1

    defaults = sorted(arms[flash], key=lambda r: r["seed"])[:5]
    gains = [r["curve"][-1][1] - r["curve"][0][1] for r in defaults]
    out["default_job"] = {"seeds": [r["seed"] for r in defaults], "gains": gains, "min_gain": min(gains),
                          "start_range": [min(r["curve"][0][1] for r in defaults),
                                          max(r["curve"][0][1] for r in defaults)],
                          "max_gain": max(gains), "mean_gain": statistics.fmean(gains)}

    comparisons = {}
    for stage in ("claim2", "fast_lr"):
        for lag in sorted({a[4] for a in arms if a[0] == stage}):
            fr, fr_inf, gr = (_find(arms, stage, "flashreinforce", lag, meta["delta"]),
                              _find(arms, stage, "flashreinforce", lag, math.inf), _find(arms, stage, "grpo", lag))
            entry = {}
            if fr and gr:
                entry["flashreinforce_minus_grpo"] = paired_difference(arms[fr], arms[gr])
            if fr and fr_inf:
                entry["delta_minus_delta_inf"] = paired_difference(arms[fr], arms[fr_inf])
            comparisons[f"{stage}_lag{lag}"] = entry
    out["lag_comparisons"] = comparisons

    noise = meta["eval_noise"]
    p = statistics.fmean(statistics.fmean(policy["pass1"]) for policy in noise["policies"])
    binomial = math.sqrt(p * (1 - p) / noise["eval_size"])
    out["eval_noise"] = {**noise, "mean_pass1": p, "binomial_std": binomial,
                         # Two independent evals of policies this good differ by more than this 5 % of the time.
                         "resolvable_difference": 1.96 * math.sqrt(2) * noise["pooled_std"]}
    return out


# ── tables and plot ──

def all_arms(summary: dict) -> list[dict]:
    return [arm for stage in summary["arms"].values() for arm in stage.values()]


def _fmt(stat: dict | None, digits: int = 3) -> str:
    if stat is None:
        return "n/a"
    low, high = stat["ci95"]
    value = stat.get("mean", stat.get("value"))
    show = lambda x: "∞" if x == math.inf else f"{x:,.{digits}f}"  # noqa: E731
    return f"{show(value)} [{show(low)}, {show(high)}]"


def arm_table(summary: dict, stages: tuple[str, ...]) -> str:
    lines = ["| arm | seeds | pass@1 start | pass@1 end | gain | acceptance | seq. KL to μ | RL wall s "
             "| generated tokens | trained tokens |", "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in all_arms(summary):
        if arm["stage"] not in stages:
            continue
        lines.append(
            f"| {arm['label']} | {len(arm['seeds'])} | {_fmt(arm['start'])} | {_fmt(arm['end'])} | {_fmt(arm['gain'])} "
            f"| {_fmt(arm['acceptance'])} | {_fmt(arm['sequence_kl'], 4)} | {arm['rl_wall_s']['mean']:.0f} "
            f"| {arm['generated_tokens']['mean']:,.0f} | {arm['trained_tokens']['mean']:,.0f} |")
    return "\n".join(lines) + "\n"


def tables(summary: dict) -> str:
    c1, noise, default = summary["claim1"], summary["eval_noise"], summary["default_job"]
    cal_rows = "\n".join(
        f"| {lr} | {v['lag1']['sequence_kl_mean']:.5f} | {v['lag1']['rejection']:.4f} "
        f"| {v['lag8']['sequence_kl_mean']:.5f} | {v['lag8']['rejection']:.4f} |"
        for lr, v in summary["calibration"].items())
    cost = c1["cost"]
    lag_rows = "\n".join(
        f"| {key} | {_fmt(v.get('flashreinforce_minus_grpo'))} | {_fmt(v.get('delta_minus_delta_inf'))} |"
        for key, v in summary["lag_comparisons"].items())
    return f"""# Tiny comparison: results

Produced by `python experiments/tiny/compare.py` ({summary['jobs']} jobs, {summary['workers']} at a time,
{summary['comparison_wall_s'] / 60:.1f} min on a {summary['machine']['cores']}-core {summary['machine']['machine']}
CPU, {summary['measured']}), then `summarize.py`. pass@1 is `eval/eval_tiny_pass1` on
{noise['eval_size']:,} held-out problems, one sample each at temperature 1. Every value is a mean over
seeds with its 95 % bootstrap interval ({summary['bootstrap']:,} resamples of seeds, arms of a seed paired).
Every update consumes 128 rollouts.

## Claim 1: GRPO's accuracy with half the rollouts (lag 0, lr {summary['default_lr']:g}, seeds {c1['seeds']})

| quantity | value [95 % CI] |
|---|---|
| GRPO 32×4 final pass@1 (at {c1['grpo_budget']:,.0f} rollouts) | {_fmt(c1['grpo_final'])} |
| rollouts FlashREINFORCE 128×1 needs to reach it | {_fmt(c1['flashreinforce_rollouts_to_grpo_final'], 0)} |
| rollouts GRPO needs to reach it (its own mean curve) | {_fmt(c1['grpo_rollouts_to_grpo_final'], 0)} |
| FlashREINFORCE pass@1 at half the budget ({c1['half_budget']:,.0f}) | {_fmt(c1['flashreinforce_at_half_budget'])} |
| FlashREINFORCE at half budget minus GRPO final | {_fmt(c1['flashreinforce_at_half_minus_grpo_final'])} |
| FlashREINFORCE final minus GRPO final (same budget) | {_fmt(c1['flashreinforce_final_minus_grpo_final'])} |
| seeds where FlashREINFORCE at half ≥ GRPO final | {c1['seeds_flash_at_half_ge_grpo_final']} of {len(c1['seeds'])} |

Cost (means over seeds): FlashREINFORCE's first half budget took {cost['rl_wall_s']['flashreinforce_at_half_budget']:.0f} s
of RL wall-clock, {cost['generated_tokens']['flashreinforce_at_half_budget']:,.0f} generated and
{cost['trained_tokens']['flashreinforce_at_half_budget']:,.0f} trained tokens, against GRPO's full budget
{cost['rl_wall_s']['grpo_full_budget']:.0f} s, {cost['generated_tokens']['grpo_full_budget']:,.0f} and
{cost['trained_tokens']['grpo_full_budget']:,.0f}: fractions {cost['rl_wall_s']['half_budget_fraction_of_grpo']:.2f} (wall),
{cost['generated_tokens']['half_budget_fraction_of_grpo']:.2f} (generated), {cost['trained_tokens']['half_budget_fraction_of_grpo']:.2f} (trained).
The warm start is shared by both arms of a seed and is not counted.

{arm_table(summary, ('claim1',))}
## Claim 2: stability under lag

The policy's movement, from the calibration runs (FlashREINFORCE at δ = {summary['delta']:g}, seeds 0 and 1,
100 updates; sequence KL = mean sampled-token Bernoulli KL between the sampling policy and the learner):

| lr | seq. KL at lag 1 | rejected at lag 1 | seq. KL at lag 8 | rejected at lag 8 |
|---|---|---|---|---|
{cal_rows}

Regime of the lag study: lr {summary['lag_lr']:g}, the largest lr above whose lag-1 gate rejects at most
{summary['regime_max_rejection']:.0%} of trajectories (the paper's math run rejects 0.13 % at δ = 3e-3).
The second regime, lr {summary['fast_lr']:g} (the first comparison's), moves the policy far more than δ during a lag of 8.

{arm_table(summary, ('claim2', 'fast_lr'))}
Paired differences of the final pass@1 (same seeds):

| stage / lag | FlashREINFORCE δ − GRPO | δ − (δ = ∞) |
|---|---|---|
{lag_rows}

## The default job and the eval

`molt-flashreinforce experiment=tiny`, seeds {default['seeds']}: gains {', '.join(f'{g:.3f}' for g in default['gains'])}
(min {default['min_gain']:.3f}, mean {default['mean_gain']:.3f}).

Eval noise: re-evaluating {len(noise['policies'])} final policies with {noise['samplings']} other sampling seeds
gives a pooled std of {noise['pooled_std']:.4f} at mean pass@1 {noise['mean_pass1']:.3f} (binomial
{noise['binomial_std']:.4f}), so two evals differ by more than {noise['resolvable_difference']:.3f} in 5 % of cases.
"""


def _plot_claim1_gap(summary: dict, ax) -> None:
    """FlashREINFORCE's pass@1 after x rollouts minus GRPO's final pass@1, seed by seed: claim 1
    holds where the band is above zero at half of GRPO's budget."""
    arms = summary["arms"]["claim1"]
    flash = next(a for a in arms.values() if a["algo"] == "flashreinforce")["per_seed"]
    grpo = next(a for a in arms.values() if a["algo"] == "grpo")["per_seed"]
    seeds = sorted(set(flash) & set(grpo), key=int)
    xs = [x for x, _ in flash[seeds[0]]["curve"]]
    gaps = np.asarray([[y - grpo[s]["curve"][-1][1] for _, y in flash[s]["curve"]] for s in seeds])
    means = gaps[resample_indices(len(gaps))].mean(axis=1)
    ax.plot(xs, gaps.mean(axis=0), color="C0", label="FlashREINFORCE(x) − GRPO final, paired")
    ax.fill_between(xs, np.percentile(means, 2.5, axis=0), np.percentile(means, 97.5, axis=0), color="C0", alpha=0.2)
    ax.axhline(0, color="black", lw=0.8)
    ax.axvline(summary["claim1"]["half_budget"], color="grey", ls="--", lw=1, label="half of GRPO's budget")
    ax.set_title(f"claim 1, paired over {len(seeds)} seeds", fontsize=9)
    ax.set_xlabel("rollouts consumed by FlashREINFORCE")
    ax.set_ylabel("pass@1 difference")
    ax.yaxis.set_tick_params(labelleft=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def plot(summary: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = [("claim1", 0, f"claim 1: lag 0, lr {summary['default_lr']:g}")]
    panels += [("claim2", lag, f"lag {lag}, lr {summary['lag_lr']:g}")
               for lag in sorted({a["lag"] for a in all_arms(summary) if a["stage"] == "claim2"})]
    panels += [("fast_lr", 8, f"lag 8, lr {summary['fast_lr']:g} (fast regime)")]
    columns = 4
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 4 * rows), squeeze=False)
    fig.suptitle(f"tiny: held-out pass@1, mean over seeds, band = 95 % bootstrap CI of the mean "
                 f"({summary['measured']})", fontsize=9)
    colours = {"flashreinforce_delta": "C0", "flashreinforce_inf": "C2", "grpo": "C1"}
    for ax, (stage, lag, title) in zip(axes.flat, panels):
        for arm in all_arms(summary):
            if arm["lag"] != lag or arm["stage"] != stage:
                continue
            curves = np.asarray([[y for _, y in s["curve"]] for s in arm["per_seed"].values()])
            xs = [x for x, _ in next(iter(arm["per_seed"].values()))["curve"]]
            means = curves[resample_indices(len(curves))].mean(axis=1)
            key = "grpo" if arm["algo"] == "grpo" else ("flashreinforce_inf" if arm["delta"] == "inf"
                                                        else "flashreinforce_delta")
            ax.plot(xs, curves.mean(axis=0), color=colours[key], label=f"{arm['label']} ({len(curves)} seeds)")
            ax.fill_between(xs, np.percentile(means, 2.5, axis=0), np.percentile(means, 97.5, axis=0),
                            color=colours[key], alpha=0.2)
        if stage == "claim1":
            c1 = summary["claim1"]
            ax.axhline(c1["grpo_final"]["mean"], color="C1", ls=":", lw=1, label="GRPO final")
            ax.axvline(c1["half_budget"], color="grey", ls="--", lw=1, label="half of GRPO's budget")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("rollouts consumed")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    _plot_claim1_gap(summary, axes.flat[len(panels)])
    for ax in axes.flat[len(panels) + 1:]:
        ax.axis("off")
    for ax in axes.flat:
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x / 1000:g}k"))
    for row in axes:
        row[0].set_ylabel("held-out pass@1")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="compare.py's --out directory")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent, help="where the results go")
    args = parser.parse_args()
    summary = summarize(args.root)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (args.out / "results.md").write_text(tables(summary), encoding="utf-8")
    plot(summary, args.out / "results.png")
    print(tables(summary))


if __name__ == "__main__":
    main()
