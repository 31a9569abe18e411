"""The device check (scripts/device_check.py) in its `--device cpu` mode: the same comparisons as
on a GPU, at CI sizes. The GPU run itself needs a GPU box; these tests prove that the comparisons
compare (a perturbation or one flipped token fails them) and that the script needs nothing but
torch (it runs in a site that holds only torch and what torch requires, as a borrowed box has)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "device_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


device_check = load_script()


def run_check(tmp_path: Path, *arguments: str, python: list[str] | None = None, env: dict | None = None):
    out = tmp_path / "result.json"
    command = [*(python or ["bash", str(REPO / "scripts" / "device_check.sh")]), "--device", "cpu", "--out", str(out),
               *arguments]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=env or {**os.environ, "PYTHON": sys.executable})
    record = json.loads(out.read_text()) if out.is_file() else None
    return done, record


@pytest.mark.slow
def test_cpu_mode_runs_every_comparison_and_passes(tmp_path):
    done, record = run_check(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == record["verdict_line"]  # one line
    assert record["verdict"] == "PASS" and record["verdict_line"].startswith("device check cpu")
    assert list(record["parts"]) == ["loss", "entropy", "head", "molt", "bench"]
    assert set(record["tolerances"]) == {"float32", "bfloat16"}

    loss = record["parts"]["loss"]
    cases = {(case["ablation"], case["dtype"]): case for case in loss["cases"]}
    expected = [*device_check.ABLATIONS, device_check.MICRO_BATCH_FORM]
    assert set(cases) == {(name, dtype) for name in expected for dtype in ("float32", "bfloat16")}
    assert all(case["pass"] and case["loss_excess"] <= 1 and case["gradient_excess"] <= 1 for case in cases.values())
    batch = loss["batch"]
    # The comparisons see real gating: the trust region rejects the three drifted rows, delta=inf
    # none, and the entropy filter drops tokens of the admitted rows.
    default, no_region = cases["paper default (delta=3e-3)", "float32"], cases["no trust region (delta=inf)", "float32"]
    assert default["admitted_rows"] <= batch - 3 and no_region["admitted_rows"] == batch
    assert cases["entropy filter q=0.9", "float32"]["active_tokens"] < default["active_tokens"]
    assert cases[device_check.MICRO_BATCH_FORM, "bfloat16"]["loss"] == pytest.approx(
        cases["entropy filter q=0.9", "bfloat16"]["loss"], rel=1e-5)

    entropy = record["parts"]["entropy"]
    assert entropy["vocab"] == 151_936 and entropy["status"] == "pass"
    assert {(c["dtype"], c["temperature"]) for c in entropy["cases"]} == {
        (dtype, t) for dtype in ("float32", "bfloat16") for t in (1.0, 0.7)}
    assert all(c["max_abs_error"] <= c["atol"] and c["entropy_range"][1] > 1 for c in entropy["cases"])

    molt = record["parts"]["molt"]  # Molt is installed here
    assert molt["status"] == "pass" and len(molt["cases"]) == len(device_check.MOLT_CASES)
    assert any(c["molt_acceptance_rate"] < 1 for c in molt["cases"])

    bench = record["parts"]["bench"]
    assert bench["status"] == "pass", bench
    assert set(bench["result"]["lengths"]["256"]["time"]) == {"stock", "ours_q1", "ours_q09", "fused_q1", "fused_q09"}


@pytest.mark.slow
def test_a_perturbation_fails_every_comparison(tmp_path):
    """2 % on the device's gradients and entropies: over every tolerance, so every case fails."""
    done, record = run_check(tmp_path, "--parts", "loss,entropy,molt", "--perturb", "0.02")
    assert done.returncode == 1, done.stderr[-3000:]
    assert record["verdict"] == "FAIL" and "FAIL" in done.stdout
    for name in ("loss", "entropy", "molt"):
        part = record["parts"][name]
        assert part["status"] == "fail" and not any(case["pass"] for case in part["cases"]), name


def test_a_flipped_active_token_or_admitted_row_fails_the_loss_comparison():
    inputs = device_check.loss_batch(0, 8, 24)
    config = device_check.config_for({}, 24)
    reference = device_check.run_loss(inputs, config, "cpu", torch.float64, False)
    tolerance = device_check.TOLERANCES["float32"]
    assert device_check.compare_loss(reference, dict(reference), inputs, config, tolerance)["pass"]
    active = reference["active"].clone()
    row, column = (inputs["mask"] & ~active).nonzero()[0].tolist()  # a token of a rejected row
    active[row, column] = True
    flipped = device_check.compare_loss(reference, {**reference, "active": active}, inputs, config, tolerance)
    assert not flipped["pass"] and flipped["active_mismatches"] == 1
    admitted = ~reference["admitted"]
    rows = device_check.compare_loss(reference, {**reference, "admitted": admitted}, inputs, config, tolerance)
    assert not rows["pass"] and rows["admitted_mismatches"] == len(admitted)


def test_the_benchmarks_imports_are_read_from_the_benchmark_itself():
    entries = device_check.imported_modules(device_check.BENCH)
    assert {"torch", "molt.trainer.workers:policy_actor", "molt.models.actor:Actor",
            "transformers:Qwen2ForCausalLM"} <= set(entries)
    missing = device_check.missing_imports(["json", "json:decoder", "no_such_module_here", "json:no_such_name"])
    assert missing == {"no_such_module_here": "no module no_such_module_here",
                       "json:no_such_name": "no module json.no_such_name"}


def torch_only_site(root: Path) -> Path:
    """A site directory of symlinks to torch and the distributions it requires, nothing else:
    what a bare PyTorch box has (no molt, transformers, Ray or vLLM)."""
    site = root / "site"
    site.mkdir()
    todo, seen = ["torch"], set()
    while todo:
        name = re.split(r"[ ;<>=!\[~(]", todo.pop())[0].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional or platform-specific requirement (e.g. the CUDA libraries)
        todo += [r for r in distribution.requires or [] if "extra ==" not in r]
        for top in {Path(str(f)).parts[0] for f in distribution.files or []}:
            source, link = Path(distribution.locate_file(top)), site / top
            if top != ".." and source.exists() and not link.exists():
                link.symlink_to(source)
    return site


@pytest.mark.slow
def test_it_needs_nothing_but_torch(tmp_path):
    site = torch_only_site(tmp_path)
    assert not (site / "molt").exists() and not (site / "transformers").exists()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)}
    done, record = run_check(tmp_path, python=[sys.executable, "-S", str(SCRIPT)], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert record["verdict"] == "PASS"
    assert record["parts"]["loss"]["status"] == record["parts"]["entropy"]["status"] == "pass"
    molt, bench = record["parts"]["molt"], record["parts"]["bench"]
    assert molt["status"] == "skipped" and molt["missing_imports"] == {"molt.models.loss": "no module molt"}
    assert bench["status"] == "skipped" and "no module molt" in bench["missing_imports"].values()
    assert "molt skipped (no module molt)" in done.stdout


def test_cuda_mode_without_cuda_refuses_in_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda", "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "x.json").exists()
    assert done.stderr.strip().count("\n") == 0 and "--device cpu" in done.stderr


def test_head_part_compares_the_fused_head_with_molts_head_and_catches_a_perturbation(tmp_path):
    done, record = run_check(tmp_path, "--parts", "head")
    assert done.returncode == 0, done.stderr[-3000:]
    head = record["parts"]["head"]
    assert [case["case"] for case in head["cases"]] == ["float32 S=256", "bfloat16 S=256"]
    assert all(case["pass"] for case in head["cases"])
    assert set(head["lengths"]) == {"256", "512"}
    assert all(entry["time_ratio"] > 0 and entry["fused"]["peak_mib"] is None for entry in head["lengths"].values())
    # The chunk sweep times the fused head at another chunk size: 2^16 logits = 64 tokens at V=1,024.
    assert all(entry["chunk_sweep"]["65536"]["tokens_per_chunk"] == 64 for entry in head["lengths"].values())
    unperturbed = head["cases"][0]["float64_distance"]
    assert set(unperturbed) == {"fused", "stock"} and max(unperturbed["fused"].values()) < 1
    done, record = run_check(tmp_path, "--parts", "head", "--perturb", "1e-3", "--no-chunk-sweep")
    assert done.returncode == 1 and record["parts"]["head"]["status"] == "fail"
    assert "chunk_sweep" not in record["parts"]["head"]["lengths"]["256"]
    perturbed = record["parts"]["head"]["cases"][0]["float64_distance"]
    assert perturbed["stock"] == unperturbed["stock"] and perturbed["fused"]["grad_hidden"] > 1


def test_restated_stock_head_is_molts():
    """The head part's stock side (the GPU box has no molt) is Molt's `log_probs_from_logits` on the logits."""
    from molt.models.utils import log_probs_from_logits

    states, weight, targets, upstream = device_check.head_inputs(300, 16, 257, torch.float32, "cpu")
    ours = device_check.stock_head_log_probs(states, weight, targets, 0.7)
    grads = torch.autograd.grad((ours * upstream).sum(), (states, weight))
    molt = log_probs_from_logits(states @ weight.t(), targets, temperature=0.7)
    assert torch.equal(ours, molt)
    for a, b in zip(grads, torch.autograd.grad((molt * upstream).sum(), (states, weight))):
        assert torch.equal(a, b)
