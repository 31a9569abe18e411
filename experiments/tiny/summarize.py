"""Table and plot of the tiny comparison: held-out pass@1 against rollouts consumed.

    python experiments/tiny/summarize.py runs/tiny_comparison --out experiments/tiny

Reads every Hydra job directory below the given paths (a job = a directory holding
`.hydra/config.yaml` and TensorBoard events), groups jobs into arms by (algo, group size, delta,
policy lag), and writes `results.md` (mean and spread over seeds), `results.json` (the same numbers
per arm and per seed, with each job's wall time and peak memory: the docs quote them from there)
and `results.png` (mean curve, min-max band). Only the metric names of `molt_flashreinforce.metrics`
are read, so the same script works on any run of the local backend.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from collections import defaultdict
from pathlib import Path

from omegaconf import OmegaConf

from molt_flashreinforce import metrics as tags
from molt_flashreinforce.report.events import read_scalars

EVAL = tags.eval_pass1("tiny")
HEADER = """# Tiny comparison: held-out pass@1 against rollouts consumed

Produced by `bash experiments/tiny/run.sh`: two Hydra multiruns of `molt-flashreinforce experiment=tiny`, then
`experiments/tiny/summarize.py`. pass@1 is `eval/eval_tiny_pass1`: 512 held-out problems, one sample each at
temperature 1. Values are mean ± sample std over seeds. Every arm uses 128 rollouts per update.
"Gain" is end minus start. Acceptance is the trust region's admitted fraction, averaged over updates.

"""


def _arm(cfg) -> tuple:
    algo = cfg.algo
    delta = algo.get("delta") if algo.name == "flashreinforce" else None
    return algo.name, int(algo.get("group_size", 1)), delta, int(cfg.local.policy_lag)


def _label(arm: tuple) -> str:
    name, group, delta, lag = arm
    if name == "grpo":
        return f"GRPO G={group}, lag {lag}"
    return f"FlashREINFORCE δ={'∞' if delta == float('inf') else f'{delta:g}'}, lag {lag}"


def collect(paths: list[Path]) -> dict[tuple, list[dict]]:
    arms: dict[tuple, list[dict]] = defaultdict(list)
    for root in paths:
        for config_file in sorted(root.rglob(".hydra/config.yaml")):
            job = config_file.parent.parent
            cfg = OmegaConf.load(config_file)
            scalars = read_scalars(job)
            consumed = dict(scalars[tags.ROLLOUTS_CONSUMED])
            curve = [(consumed[step], value) for step, value in scalars[EVAL]]
            acceptance = [v for _, v in scalars.get(tags.ACCEPTANCE_RATE, ())]
            summary_file = job / "summary.json"
            job_summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
            arms[_arm(cfg)].append({
                "seed": int(cfg.seed),
                "wall_s": job_summary.get("wall_s"),
                "peak_rss_mib": job_summary.get("peak_rss_mib"),
                "curve": curve,
                "acceptance": statistics.fmean(acceptance) if acceptance else None,
                "lag": max(v for _, v in scalars[tags.POLICY_LAG_MAX]),
            })
    return arms


def _arm_id(arm: tuple) -> str:
    name, group, delta, lag = arm
    return f"grpo_g{group}_lag{lag}" if name == "grpo" else f"flashreinforce_delta{delta:g}_lag{lag}"


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def summarize(arms: dict[tuple, list[dict]]) -> dict:
    """Per arm (lag first, FlashREINFORCE before GRPO): the spread over seeds and every seed's numbers."""
    out = {}
    for arm in sorted(arms, key=lambda a: (a[3], a[0] != "flashreinforce", str(a[2]))):
        runs = sorted(arms[arm], key=lambda r: r["seed"])
        half = len(runs[0]["curve"]) // 2
        start = [r["curve"][0][1] for r in runs]
        end = [r["curve"][-1][1] for r in runs]
        acceptance = [r["acceptance"] for r in runs if r["acceptance"] is not None]
        walls = [r["wall_s"] for r in runs if r["wall_s"] is not None]
        memory = [r["peak_rss_mib"] for r in runs if r["peak_rss_mib"] is not None]
        out[_arm_id(arm)] = {
            "label": _label(arm),
            "seeds": [r["seed"] for r in runs],
            "rollouts": int(runs[0]["curve"][-1][0]),
            "half_rollouts": int(runs[0]["curve"][half][0]),
            "start": _spread(start),
            "half": _spread([r["curve"][half][1] for r in runs]),
            "end": _spread(end),
            "gain": _spread([e - s for s, e in zip(start, end)]),
            "per_seed": {str(r["seed"]): {"start": s, "end": e} for r, s, e in zip(runs, start, end)},
            "acceptance": statistics.fmean(acceptance) if acceptance else None,
            "max_lag": max(r["lag"] for r in runs),
            "wall_s": _spread(walls) if walls else None,
            "peak_rss_mib": _spread(memory) if memory else None,
        }
    walls = [r["wall_s"] for runs in arms.values() for r in runs if r["wall_s"] is not None]
    return {"measured": datetime.date.today().isoformat(), "jobs": sum(map(len, arms.values())),
            "jobs_wall_s": sum(walls), "arms": out}


def _mean_sd(spread: dict) -> str:
    return f"{spread['mean']:.3f} ± {spread['std']:.3f}"


def table(summary: dict) -> str:
    lines = [
        "| arm | seeds | rollouts | pass@1 start | pass@1 at half budget | pass@1 end | gain "
        "| mean acceptance | max lag |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in summary["arms"].values():
        acceptance = "n/a" if arm["acceptance"] is None else f"{arm['acceptance']:.3f}"
        lines.append(
            f"| {arm['label']} | {len(arm['seeds'])} | {arm['rollouts']:,} | {_mean_sd(arm['start'])} | "
            f"{_mean_sd(arm['half'])} (at {arm['half_rollouts']:,}) | {_mean_sd(arm['end'])} | {_mean_sd(arm['gain'])} | "
            f"{acceptance} | {arm['max_lag']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(arms: dict[tuple, list[dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lags = sorted({arm[3] for arm in arms})
    families = sorted({arm[:3] for arm in arms}, key=str)  # one colour per method across the lag panels
    colours = {family: f"C{i}" for i, family in enumerate(families)}
    fig, axes = plt.subplots(1, len(lags), figsize=(6 * len(lags), 4.2), sharey=True, squeeze=False)
    fig.suptitle("tiny: mean over seeds, band = min-max; every arm 128 rollouts per update", fontsize=9)
    for ax, lag in zip(axes[0], lags):
        for arm in sorted((a for a in arms if a[3] == lag), key=lambda a: (a[0], str(a[2]))):
            runs = arms[arm]
            xs = [x for x, _ in runs[0]["curve"]]
            ys = [[r["curve"][i][1] for r in runs] for i in range(len(xs))]
            colour = colours[arm[:3]]
            ax.plot(xs, [statistics.fmean(y) for y in ys], color=colour, label=f"{_label(arm)} ({len(runs)} seeds)")
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=colour, alpha=0.15)
        ax.set_title(f"policy lag {lag}")
        ax.set_xlabel("rollouts consumed")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[0][0].set_ylabel("held-out pass@1 (eval/eval_tiny_pass1)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="Hydra sweep or run directories")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent, help="where results.md/png go")
    args = parser.parse_args()
    arms = collect(args.paths)
    if not arms:
        raise SystemExit(f"no Hydra jobs (.hydra/config.yaml) below {', '.join(map(str, args.paths))}")
    args.out.mkdir(parents=True, exist_ok=True)
    summary = summarize(arms)
    (args.out / "results.md").write_text(HEADER + table(summary))
    (args.out / "results.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    plot(arms, args.out / "results.png")
    print(table(summary))


if __name__ == "__main__":
    main()
