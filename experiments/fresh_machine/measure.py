"""Measure the README's two fresh-machine commands: setup, then the main job, in a scratch copy.

    python experiments/fresh_machine/measure.py SCRATCH_DIR      # from the repository root

Copies the committed tree (`git archive HEAD`) into SCRATCH_DIR, which must not exist, and there
times `bash scripts/setup.sh` (a new .venv, pip's cache off, as on a fresh machine) and then
`.venv/bin/molt-flashreinforce experiment=tiny`. Writes `experiments/fresh_machine/result.json`:
the wall times, what each command printed (the job's run directory shown as
`runs/tiny/flashreinforce/<time>`; of pip's output only the block setup.sh explains), the job's
summary.json numbers and the machine. The README's
fresh-machine numbers are rendered from that file (scripts/doc_numbers.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, list[str]]:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    elapsed = time.perf_counter() - started
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed with status {done.returncode}")
    # A progress bar redraws itself with carriage returns: keep only its last state.
    lines = [part.rsplit("\r", 1)[-1].rstrip() for part in done.stdout.split("\n")]
    return elapsed, [line for line in lines if line]


# What setup.sh itself prints, and pip's expected molt-rl block it explains; the rest of pip's
# output (this machine's index and mirror warnings) is not kept.
_SETUP_LINE = re.compile(r"^(\[\d/\d\] |      done in |setup finished in |      \^ |        lists |molt-rl 0\.2\.1 requires |ERROR: pip's )")


def setup_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if _SETUP_LINE.match(line)]


def job_lines(lines: list[str], run_dir: Path) -> list[str]:
    """The warm-start line, the progress bar's final state and the summary line."""
    kept = [line.replace(str(run_dir), "runs/tiny/flashreinforce/<time>")
            for line in lines if re.match(r"(Warm start:|flashreinforce lag=0:|tiny: )", line)]
    bar = [line for line in kept if line.startswith("flashreinforce lag=0:")]
    return [line for line in kept if not line.startswith("flashreinforce lag=0:")][:1] + bar[-1:] + \
        [line for line in kept if line.startswith("tiny: ")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scratch", type=Path, help="a directory that does not exist yet")
    args = parser.parse_args()
    scratch = args.scratch.resolve()
    scratch.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_NO_CACHE_DIR"] = "1"
    load = os.getloadavg()[0]
    setup_s, printed_by_setup = _timed(["bash", "scripts/setup.sh"], scratch, env)
    job_s, job_printed = _timed([".venv/bin/molt-flashreinforce", "experiment=tiny"], scratch, env)
    (run_dir,) = (scratch / "runs" / "tiny" / "flashreinforce").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    result = {
        "measured": datetime.date.today().isoformat(),
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "load_average_before": round(load, 2),
                    "python": platform.python_version()},
        "setup_s": round(setup_s, 1),
        "job_s": round(job_s, 1),
        "total_s": round(setup_s + job_s, 1),
        "setup_printed": setup_lines(printed_by_setup),
        "job_printed": job_lines(job_printed, run_dir),
        "job": {key: summary[key] for key in ("eval_pass1_random_init", "eval_pass1_start", "eval_pass1_end",
                                              "warm_start_wall_s", "rl_wall_s", "wall_s", "peak_rss_mib")},
    }
    (HERE / "result.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {HERE / 'result.json'}: setup {setup_s:.0f} s, job {job_s:.0f} s")


if __name__ == "__main__":
    main()
