"""The device check: this package's loss and entropy slabs on an accelerator, against references,
plus Molt's `PolicyLoss` recipe and the training-step memory benchmark where their imports fit.

    python scripts/device_check.py [--device cuda|cpu] [--out FILE] [--wheels DIR]
                                   [--parts loss,entropy,head,molt,bench] [--perturb REL]

(`scripts/device_check.sh` runs it from the repository root with the right PYTHONPATH.)

It needs only torch and this repository, so that it runs on a borrowed single-GPU box without
network, vLLM or Ray. Parts:

  loss     `flashreinforce_loss` with every ablation of the paper, and the micro-batch form
           `flashreinforce_policy_loss` (two halves summed), on the device with bf16 and fp32
           inputs, against float64 on the CPU of the same rounded inputs: the loss value, the
           gradient, the admitted rows and the tokens that carry gradient (the active set).
  entropy  `token_entropy` at V=151,936 on bf16 and fp32 logits, temperatures 1 and 0.7, against
           a full-vocabulary float32 `log_softmax` entropy; on CUDA also its extra peak memory,
           which must stay within a few slabs.
  head     the fused head (`fused_head.chunked_log_probs`) against Molt's stock head restated
           here (the [S, V] logits, then Molt 0.2.1's `log_probs_from_logits`: float32
           log-softmax in 256-row chunks, each recomputed in backward), forward and backward at
           a real width and vocabulary (CUDA: hidden 1,536, V=151,936, S = 4K to 32K, bf16): the
           peak memory above the inputs and the median time of each, their ratios and the growth
           per 1,000 tokens; the log-probs and gradients agree (float32 to 1e-5 at the first
           length, bf16 within twice the bf16 rounding of the stock head; beside the float32 case,
           each head's distance from a float64 stock head). The fused head is also timed at the
           other chunk sizes of `head_chunk_sweep` (`--no-chunk-sweep` skips them).
  molt     Molt's `PolicyLoss` in the FlashREINFORCE recipe configuration (and the token gate,
           token-mean and constant-length forms) on the device, against ours on the device, if
           `molt.models.loss` imports; otherwise the part is skipped with the missing module.
  bench    `benchmarks/bench_training_step.py --device <device>` (CUDA: 8,192 and 16,384 tokens),
           if every module it imports imports here; otherwise skipped with the missing modules.

`--wheels DIR` installs the wheels in DIR (`pip --no-index --no-deps`) into a temporary directory
first, e.g. molt-rl's 0.3 MB wheel. `--perturb REL` scales the device's gradients and entropies
by (1 + REL) before they are compared: a sensitivity check whose verdict must be FAIL.

One JSON file of results (default `experiments/device/<device>.json`) and one verdict line; exit
status 0 when every comparison that ran passed, 1 otherwise. Tolerances are per input dtype
(`TOLERANCES`) and are written into the JSON.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from molt_flashreinforce.entropy import token_entropy  # noqa: E402
from molt_flashreinforce.fused_head import chunked_log_probs  # noqa: E402
from molt_flashreinforce.objective import (  # noqa: E402
    FlashReinforceConfig,
    flashreinforce_loss,
    flashreinforce_policy_loss,
)

PARTS = ("loss", "entropy", "head", "molt", "bench")
VOCAB = 151_936  # Qwen2.5's vocabulary
DELTA = 3e-3
INF = float("inf")
BENCH = REPO / "benchmarks" / "bench_training_step.py"
# Child interpreters run like this one (under -S, without site-packages, as a bare box would).
PYTHON = [sys.executable, *(["-S"] if sys.flags.no_site else [])]
# Per device: the loss batch (B, T), the entropy positions, the benchmark's lengths and options.
SIZES = {
    "cuda": {"batch": 128, "width": 4096, "entropy_shape": [2, 2048], "bench_lengths": "8192,16384",
             "head_lengths": [4096, 8192, 16384, 32768], "head_hidden": 1536, "head_vocab": VOCAB, "head_repeats": 3,
             "head_chunk_sweep": [1 << 25, 1 << 26, 1 << 27, 1 << 28],
             "bench_options": ["--repeats", "3", "--warmup", "1"], "bench_timeout_s": 300},
    "cpu": {"batch": 16, "width": 160, "entropy_shape": [2, 96], "bench_lengths": "256",
            "head_lengths": [256, 512], "head_hidden": 32, "head_vocab": 1024, "head_repeats": 1,
            "head_chunk_sweep": [1 << 16],
            "bench_options": ["--time-only", "--repeats", "1", "--warmup", "0"], "bench_timeout_s": 240},
}
# Elementwise |x - ref| <= rtol * |ref| + atol * max|ref| for gradients and entropies (entropy's
# atol is absolute, in nats). The loss is compared to rtol of sum |dL/dlogp * logp|, the scale of
# its terms, since it is a sum of terms of both signs. bf16 inputs are computed in float32 by the
# objective, but their gradient is returned in bf16 (8 significant bits: rounding up to 2^-8
# relative), hence twice that. The sequence KL is compared only for the arithmetic gate mean: a
# geometric mean is 0 as soon as one token's KL rounds to 0, so that statistic is not a float
# comparison (its admitted rows and active tokens still are).
TOLERANCES = {
    "float32": {"loss_rtol": 1e-5, "grad_rtol": 1e-5, "grad_atol": 1e-6, "sequence_kl_rtol": 1e-3,
                "sequence_kl_atol": 1e-6, "entropy_atol": 2e-3, "molt_grad_rtol": 1e-5, "molt_grad_atol": 1e-6},
    "bfloat16": {"loss_rtol": 1e-5, "grad_rtol": 8e-3, "grad_atol": 1e-5, "sequence_kl_rtol": 1e-3,
                 "sequence_kl_atol": 1e-6, "entropy_atol": 2e-3},
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# The paper's ablations (README table) plus the combination Molt's trainer runs most.
ABLATIONS = {
    "paper default (delta=3e-3)": {},
    "no trust region (delta=inf)": {"delta": INF},
    "token gate": {"gate_level": "token"},
    "geometric gate mean": {"gate_mean": "geometric"},
    "token mean": {"reduction": "token_mean"},
    "constant length": {"reduction": "constant_length", "constant_length": "width"},
    "no importance sampling": {"importance_sampling": False},
    "entropy filter q=0.9": {"entropy_filter_q": 0.9},
    "entropy filter q=0.2, token gate": {"entropy_filter_q": 0.2, "gate_level": "token"},
}
MICRO_BATCH_FORM = "micro-batch form (two halves of flashreinforce_policy_loss, summed)"
# Entropy's slabs: one slab of float32 logits is 2^24 floats; the contract is a few of them.
SLAB_MIB = (1 << 24) * 4 / 2**20
ENTROPY_PEAK_SLABS = 4


# ───────────────────────────── inputs ─────────────────────────────


def loss_batch(seed: int, batch: int, width: int) -> dict[str, torch.Tensor]:
    """float64 CPU inputs: unequal lengths, three far-drifted rows (rejected by a small trust
    region), mild drift elsewhere, 0/1 rewards (never constant), failure labels and entropies."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (batch,), generator=generator)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    current = -torch.rand(batch, width, generator=generator, dtype=torch.float64) * 2.5
    drift = torch.rand(batch, width, generator=generator, dtype=torch.float64) * 0.02
    drift[:3] += 1.5
    rewards = torch.randint(0, 2, (batch,), generator=generator).to(torch.float64)
    rewards[0], rewards[1] = 1.0, 0.0
    entropies = torch.rand(batch, width, generator=generator, dtype=torch.float64) * 5
    return {"log_probs": current, "behavior_log_probs": current - drift, "rewards": rewards, "mask": mask,
            "failures": rewards <= 0, "entropies": entropies}


def rounded(inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The float inputs rounded to `dtype` and back to float64: the reference sees what the device sees."""
    return {name: value.to(dtype).to(torch.float64) if value.is_floating_point() else value
            for name, value in inputs.items()}


def config_for(ablation: dict, width: int) -> FlashReinforceConfig:
    values = {"delta": DELTA, **ablation}
    if values.get("constant_length") == "width":
        values["constant_length"] = width
    return FlashReinforceConfig(**values)


# ───────────────────────────── comparisons ─────────────────────────────


def max_excess(values: torch.Tensor, reference: torch.Tensor, rtol: float, atol: float) -> float:
    """max of |x - ref| / (rtol |ref| + atol): <= 1 passes."""
    difference = (values.double() - reference).abs()
    return float((difference / (rtol * reference.abs() + atol)).max())


def run_loss(inputs: dict, config: FlashReinforceConfig, device: str, dtype: torch.dtype, micro_batches: bool,
             perturb: float = 0.0) -> dict:
    """Loss, gradient and active sets of one configuration, on `device` with inputs in `dtype`."""
    moved = {name: value.to(device=device, dtype=dtype) if value.is_floating_point() else value.to(device)
             for name, value in inputs.items()}
    log_probs = moved["log_probs"].clone().requires_grad_()
    extra = {"failures": moved["failures"], "entropies": moved["entropies"]} if config.uses_entropy_filter else {}
    if not micro_batches:
        out = flashreinforce_loss(log_probs, moved["behavior_log_probs"], moved["rewards"], moved["mask"], config,
                                  **extra)
        loss, outputs = out.loss, [out]
    else:  # Molt's form: advantages of the whole batch, its B and token count as denominators
        rewards = moved["rewards"].to(torch.float64 if dtype == torch.float64 else torch.float32)
        advantages = rewards - rewards.mean()
        half = log_probs.shape[0] // 2
        outputs = []
        for rows in (slice(0, half), slice(half, None)):
            outputs.append(flashreinforce_policy_loss(
                log_probs[rows], moved["behavior_log_probs"][rows], advantages[rows], moved["mask"][rows], config,
                batch_size=log_probs.shape[0], batch_tokens=int(moved["mask"].sum()),
                **{name: value[rows] for name, value in extra.items()}))
        loss = outputs[0].loss + outputs[1].loss
    loss.backward()
    gradient = log_probs.grad.double().cpu() * (1 + perturb)
    return {
        "loss": float(loss.detach()),
        "gradient": gradient,
        "admitted": torch.cat([o.stats.admitted for o in outputs]).cpu(),
        "active": torch.cat([o.token_weights != 0 for o in outputs]).cpu(),
        "sequence_kl": torch.cat([o.stats.sequence_kl for o in outputs]).double().cpu(),
        "acceptance_rate": float(torch.stack([o.stats.acceptance_rate for o in outputs]).double().mean())
        if micro_batches else float(outputs[0].stats.acceptance_rate),
    }


def compare_loss(reference: dict, measured: dict, inputs: dict, config: FlashReinforceConfig, tolerance: dict) -> dict:
    gradient_scale = float(reference["gradient"].abs().max())
    loss_scale = float((reference["gradient"] * inputs["log_probs"]).abs().sum())
    loss_excess = abs(measured["loss"] - reference["loss"]) / (tolerance["loss_rtol"] * loss_scale)
    grad_excess = max_excess(measured["gradient"], reference["gradient"], tolerance["grad_rtol"],
                             tolerance["grad_atol"] * gradient_scale)
    kl_excess = max_excess(measured["sequence_kl"], reference["sequence_kl"], tolerance["sequence_kl_rtol"],
                           tolerance["sequence_kl_atol"]) \
        if config.importance_sampling and config.gate_mean == "arithmetic" else 0.0
    # A row whose reference statistic lies within the KL tolerance of delta may go either way.
    kl = reference["sequence_kl"]
    borderline = ((kl - config.delta).abs() <= tolerance["sequence_kl_rtol"] * kl.abs()
                  + tolerance["sequence_kl_atol"]) if config.gate_level == "sequence" and config.importance_sampling \
        else torch.zeros_like(reference["admitted"])
    admitted_flips = int(((measured["admitted"] != reference["admitted"]) & ~borderline).sum())
    active_flips = int(((measured["active"] != reference["active"]) & ~borderline.unsqueeze(-1)).sum())
    return {
        "loss": measured["loss"], "loss_reference": reference["loss"], "loss_excess": loss_excess,
        "gradient_excess": grad_excess, "gradient_scale": gradient_scale, "sequence_kl_excess": kl_excess,
        "admitted_rows": int(reference["admitted"].sum()), "active_tokens": int(reference["active"].sum()),
        "admitted_mismatches": admitted_flips, "active_mismatches": active_flips,
        "borderline_rows": int(borderline.sum()),
        "pass": loss_excess <= 1 and grad_excess <= 1 and kl_excess <= 1 and admitted_flips == 0 and active_flips == 0,
    }


def check_loss(device: str, sizes: dict, perturb: float) -> dict:
    cases = []
    batch, width = sizes["batch"], sizes["width"]
    inputs = loss_batch(0, batch, width)
    for dtype_name, dtype in DTYPES.items():
        reference_inputs = rounded(inputs, dtype)
        forms = [(name, ablation, False) for name, ablation in ABLATIONS.items()]
        forms.append((MICRO_BATCH_FORM, ABLATIONS["entropy filter q=0.9"], True))
        for name, ablation, micro_batches in forms:
            config = config_for(ablation, width)
            reference = run_loss(reference_inputs, config, "cpu", torch.float64, micro_batches)
            measured = run_loss(inputs, config, device, dtype, micro_batches, perturb)
            cases.append({"ablation": name, "dtype": dtype_name,
                          **compare_loss(reference, measured, reference_inputs, config, TOLERANCES[dtype_name])})
    return {"status": "pass" if all(c["pass"] for c in cases) else "fail", "batch": batch, "width": width,
            "cases": cases}


def reference_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Full-vocabulary float32 entropy: one float32 copy of all the logits (what the slabs avoid)."""
    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def check_entropy(device: str, sizes: dict, perturb: float) -> dict:
    shape = sizes["entropy_shape"]
    generator = torch.Generator(device).manual_seed(1)
    cases = []
    for dtype_name, dtype in DTYPES.items():
        # Mostly broad rows, a few peaked ones (one logit far above the rest), as a policy has.
        logits = torch.randn(*shape, VOCAB, generator=generator, device=device) * 3
        logits[..., ::7, 0] += 40
        logits = logits.to(dtype)
        for temperature in (1.0, 0.7):
            peak_mib = None
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            entropies = token_entropy(logits, temperature)
            if device == "cuda":
                torch.cuda.synchronize()
                peak_mib = (torch.cuda.max_memory_allocated() - before) / 2**20
            expected = reference_entropy(logits, temperature).double().cpu()
            got = entropies.double().cpu() * (1 + perturb)
            atol = TOLERANCES[dtype_name]["entropy_atol"]
            max_error = float((got - expected).abs().max())
            memory_ok = peak_mib is None or peak_mib <= ENTROPY_PEAK_SLABS * SLAB_MIB
            cases.append({"dtype": dtype_name, "temperature": temperature, "positions": math.prod(shape),
                          "max_abs_error": max_error, "atol": atol, "entropy_range": [float(expected.min()),
                                                                                      float(expected.max())],
                          "extra_peak_mib": peak_mib, "float32_copy_mib": math.prod(shape) * VOCAB * 4 / 2**20,
                          "pass": max_error <= atol and memory_ok})
            del entropies
        del logits
    return {"status": "pass" if all(c["pass"] for c in cases) else "fail", "vocab": VOCAB, "shape": shape,
            "peak_limit_mib": ENTROPY_PEAK_SLABS * SLAB_MIB if device == "cuda" else None, "cases": cases}


def stock_head_log_probs(hidden, weight, targets, temperature):
    """Molt 0.2.1's head, restated (the box may have no molt): the [S, V] logits in the weight's dtype,
    then `log_probs_from_logits`' chunked path (float32 upcast, temperature, 256-row chunks under
    non-reentrant checkpointing)."""
    from torch.utils.checkpoint import checkpoint

    logits = hidden @ weight.t()

    def chunk(rows, labels):
        scaled = rows.float() / temperature if temperature != 1.0 else rows.float()
        return scaled.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)

    return torch.cat([checkpoint(chunk, logits[start:start + 256], targets[start:start + 256], use_reentrant=False)
                      for start in range(0, targets.shape[0], 256)])


def fused_head_log_probs(hidden, weight, targets, temperature):
    return chunked_log_probs(hidden, weight, targets, temperature)[0]


HEADS = {"stock": stock_head_log_probs, "fused": fused_head_log_probs}


def head_inputs(length: int, hidden: int, vocab: int, dtype: torch.dtype, device: str):
    generator = torch.Generator(device).manual_seed(length)
    states = (torch.randn(length, hidden, generator=generator, device=device) * 0.5).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, hidden, generator=generator, device=device) / hidden ** 0.5).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (length,), generator=generator, device=device)
    upstream = torch.randn(length, generator=generator, device=device)
    return states, weight, targets, upstream


def run_head(head, inputs, device: str, perturb: float = 0.0) -> dict:
    """One forward and backward: log-probs, gradients, seconds and (CUDA) the peak above the inputs."""
    states, weight, targets, upstream = inputs
    states.grad = weight.grad = None
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    started = time.perf_counter()
    log_probs = head(states, weight, targets, 0.7)
    (log_probs * upstream).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if device == "cuda" else None
    return {"log_probs": log_probs.detach().double().cpu(), "grad_hidden": states.grad.double().cpu() * (1 + perturb),
            "grad_weight": weight.grad.double().cpu() * (1 + perturb), "seconds": seconds, "peak_mib": peak}


def head_agreement(fused: dict, stock: dict, reference: dict | None) -> dict:
    """float32 (no reference): |fused - stock| <= 1e-5 |stock| + 1e-6 max|stock|; bf16: the
    difference within twice the stock head's own distance from the float32 reference."""
    excess = {}
    for name in ("log_probs", "grad_hidden", "grad_weight"):
        if reference is None:
            excess[name] = max_excess(fused[name], stock[name], 1e-5, 1e-6 * float(stock[name].abs().max()))
        else:
            spread = float((stock[name] - reference[name]).abs().max())
            excess[name] = float((fused[name] - stock[name]).abs().max()) / max(2 * spread, 1e-12)
    return excess


def float64_distance(runs: dict, inputs, device: str) -> dict:
    """Each float32 head's distance from the stock head in float64, in units of the float32
    tolerance (1e-5 |ref| + 1e-6 max|ref|): how much of the fused-vs-stock tolerance the
    accelerator's own float32 rounding (its kernels' summation order) already takes. Reported only."""
    wide = tuple(t.detach().double().requires_grad_() if t.is_floating_point() and t.requires_grad
                 else t.double() if t.is_floating_point() else t for t in inputs)
    reference = run_head(stock_head_log_probs, wide, device)
    return {head: {name: max_excess(run[name], reference[name], 1e-5, 1e-6 * float(reference[name].abs().max()))
                   for name in ("log_probs", "grad_hidden", "grad_weight")} for head, run in runs.items()}


def sweep_chunks(inputs, device: str, repeats: int, chunk_sizes: list[int], stock: dict) -> dict:
    """The fused head's median time and peak at other chunk sizes (logits per chunk), against stock."""
    sweep = {}
    for elements in chunk_sizes:
        def head(hidden, weight, targets, temperature, elements=elements):
            return chunked_log_probs(hidden, weight, targets, temperature, chunk_elements=elements)[0]
        samples = [run_head(head, inputs, device) for _ in range(repeats + (device == "cuda"))]
        timed = samples[1:] if device == "cuda" else samples
        seconds = sorted(s["seconds"] for s in timed)[len(timed) // 2]
        peak = samples[-1]["peak_mib"]
        sweep[str(elements)] = {"tokens_per_chunk": max(1, elements // inputs[1].shape[0]), "median_s": seconds,
                                "peak_mib": peak, "time_ratio": seconds / stock["median_s"],
                                "peak_ratio": peak / stock["peak_mib"] if peak and stock["peak_mib"] else None}
    return sweep


def check_head(device: str, sizes: dict, perturb: float) -> dict:
    hidden, vocab, repeats = sizes["head_hidden"], sizes["head_vocab"], sizes["head_repeats"]
    lengths = sizes["head_lengths"]
    cases = []
    small = head_inputs(lengths[0], hidden, vocab, torch.float32, device)
    exact = {name: run_head(head, small, device, perturb if name == "fused" else 0.0) for name, head in HEADS.items()}
    excess = head_agreement(exact["fused"], exact["stock"], None)
    cases.append({"case": f"float32 S={lengths[0]}", "excess": excess, "pass": max(excess.values()) <= 1,
                  "float64_distance": float64_distance(exact, small, device)})
    measured = {}
    for length in lengths:
        inputs = head_inputs(length, hidden, vocab, torch.bfloat16, device)
        reference = None
        if length == lengths[0]:
            reference = run_head(stock_head_log_probs, tuple(
                t.detach().float().requires_grad_() if t.is_floating_point() and t.requires_grad else t
                for t in inputs), device)
        entry = measured[str(length)] = {}
        runs = {}
        for name, head in HEADS.items():
            try:
                samples = [run_head(head, inputs, device, perturb if name == "fused" else 0.0)
                           for _ in range(repeats + (device == "cuda"))]
            except torch.cuda.OutOfMemoryError:
                entry[name] = {"oom": True}
                torch.cuda.empty_cache()
                continue
            runs[name] = samples[-1]
            timed = samples[1:] if device == "cuda" else samples
            entry[name] = {"median_s": sorted(s["seconds"] for s in timed)[len(timed) // 2],
                           "peak_mib": max((s["peak_mib"] for s in samples if s["peak_mib"] is not None), default=None)}
        if "stock" in runs and sizes["head_chunk_sweep"]:
            entry["chunk_sweep"] = sweep_chunks(inputs, device, repeats, sizes["head_chunk_sweep"], entry["stock"])
        if len(runs) == 2:
            fused, stock = entry["fused"], entry["stock"]
            entry["time_ratio"] = fused["median_s"] / stock["median_s"]
            if stock["peak_mib"]:
                entry["peak_ratio"] = fused["peak_mib"] / stock["peak_mib"]
            if reference is not None:
                excess = head_agreement(runs["fused"], runs["stock"], reference)
                cases.append({"case": f"bfloat16 S={length}", "excess": excess, "pass": max(excess.values()) <= 1})
        del inputs, runs
    growth = {}
    for name in HEADS:
        points = [(int(length), entry[name]["peak_mib"]) for length, entry in measured.items()
                  if entry[name].get("peak_mib") is not None]
        if len(points) >= 2:
            growth[name] = (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]) * 1000
    return {"status": "pass" if all(c["pass"] for c in cases) else "fail", "hidden": hidden, "vocab": vocab,
            "dtype": "bfloat16 (measurements)", "lengths": measured, "peak_growth_mib_per_1k_tokens": growth,
            "cases": cases}


MOLT_RECIPE = {"is_correction_level": "seq", "is_correction_gating": "binary_kl", "is_correction_mode": "mask",
               "loss_agg_mode": "seq-mean-token-mean"}
MOLT_CASES = {  # Molt's PolicyLoss keyword arguments -> our configuration (as tests/test_molt_parity.py)
    "recipe delta=3e-3": ({"is_correction_threshold": [-INF, DELTA]}, {}),
    "recipe delta=inf": ({"is_correction_threshold": [-INF, INF]}, {"delta": INF}),
    "token gate": ({"is_correction_threshold": [-INF, DELTA], "is_correction_level": "token"},
                   {"gate_level": "token"}),
    "token mean": ({"is_correction_threshold": [-INF, DELTA], "loss_agg_mode": "token-mean"},
                   {"reduction": "token_mean"}),
    # Molt's PolicyLoss does not pass loss_scale_factor to agg_loss: its constant is the padded width.
    "constant length": ({"is_correction_threshold": [-INF, DELTA], "loss_agg_mode": "seq-mean-token-sum-norm"},
                        {"reduction": "constant_length", "constant_length": "width"}),
}


def check_molt(device: str, sizes: dict, perturb: float) -> dict:
    missing = missing_imports(["molt.models.loss"])
    if missing:
        return {"status": "skipped", "reason": f"molt.models.loss does not import here: {missing}",
                "missing_imports": missing}
    from molt.models.loss import PolicyLoss

    tolerance = TOLERANCES["float32"]
    inputs = {name: value.to(device=device, dtype=torch.float32) if value.is_floating_point() else value.to(device)
              for name, value in loss_batch(2, sizes["batch"], sizes["width"]).items()}
    cases = []
    for name, (molt_kwargs, ours) in MOLT_CASES.items():
        molt_log_probs = inputs["log_probs"].clone().requires_grad_()
        advantages = (inputs["rewards"] - inputs["rewards"].mean()).unsqueeze(-1) * inputs["mask"]
        loss, *_, is_filter_ratio = PolicyLoss(**{**MOLT_RECIPE, **molt_kwargs})(
            molt_log_probs, molt_log_probs.detach(), advantages, action_mask=inputs["mask"],
            rollout_log_probs=inputs["behavior_log_probs"])
        loss.backward()
        molt_gradient = molt_log_probs.grad.double().cpu()
        config = config_for(ours, sizes["width"])
        measured = run_loss({k: v.cpu() for k, v in inputs.items()}, config, device, torch.float32, False, perturb)
        excess = max_excess(measured["gradient"], molt_gradient, tolerance["molt_grad_rtol"],
                            tolerance["molt_grad_atol"] * float(molt_gradient.abs().max()))
        molt_acceptance = 1 - float(is_filter_ratio.double().mean())
        cases.append({"case": name, "gradient_excess": excess, "acceptance_rate": measured["acceptance_rate"],
                      "molt_acceptance_rate": molt_acceptance,
                      "pass": excess <= 1 and abs(molt_acceptance - measured["acceptance_rate"]) <= 1e-6})
    import molt

    version = getattr(molt, "__version__", None)
    return {"status": "pass" if all(c["pass"] for c in cases) else "fail", "molt_version": version,
            "dtype": "float32 (Molt computes its loss in float32)", "cases": cases}


# ───────────────────────────── imports, wheels, benchmark ─────────────────────────────


def missing_imports(modules: list[str], env: dict[str, str] | None = None) -> dict[str, str]:
    """entry -> what failed when importing it, in a fresh interpreter (so no half-imported module
    lingers here); entries that import are left out. An entry is `module` or `module:name` (from
    `from module import name`, where name may be a submodule)."""
    probe = (
        "import importlib, json, sys\n"
        "failed = {}\n"
        "for entry in sys.argv[1:]:\n"
        "    module, _, name = entry.partition(':')\n"
        "    try:\n"
        "        imported = importlib.import_module(module)\n"
        "        if name and not hasattr(imported, name):  # `from package import submodule`\n"
        "            importlib.import_module(f'{module}.{name}')\n"
        "    except ModuleNotFoundError as error:\n"
        "        failed[entry] = f'no module {error.name}'\n"
        "    except Exception as error:\n"
        "        failed[entry] = f'{type(error).__name__}: {error}'[:300]\n"
        "print(json.dumps(failed))\n"
    )
    done = subprocess.run([*PYTHON, "-c", probe, *modules], capture_output=True, text=True,
                          env=env or child_env(), timeout=300)
    if done.returncode != 0:
        return {name: f"import probe failed: {done.stderr.strip()[-300:]}" for name in modules}
    return json.loads(done.stdout.strip().splitlines()[-1])


def imported_modules(path: Path) -> list[str]:
    """Every import of a script, at any depth of its code, as `missing_imports` entries (the
    script's own import list, read from it, so that it never goes stale here)."""
    entries = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            entries.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            entries.update(f"{node.module}:{alias.name}" for alias in node.names)
    return sorted(entries)


EXTRA_PATHS: list[str] = []  # temporary install targets of --wheels


def child_env() -> dict[str, str]:
    """This process's environment, with the repository and the --wheels targets importable."""
    paths = [*EXTRA_PATHS, str(REPO), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}


def install_wheels(directory: Path) -> dict:
    wheels = sorted(directory.glob("*.whl"))
    if not wheels:
        return {"directory": str(directory), "installed": [], "error": "no .whl files there"}
    target = tempfile.mkdtemp(prefix="device-check-wheels-")
    done = subprocess.run([*PYTHON, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                           "--target", target, *map(str, wheels)], capture_output=True, text=True)
    if done.returncode != 0:
        return {"directory": str(directory), "installed": [], "error": done.stderr.strip()[-500:]}
    sys.path.insert(0, target)
    EXTRA_PATHS.append(target)
    return {"directory": str(directory), "installed": [w.name for w in wheels],
            "megabytes": round(sum(w.stat().st_size for w in wheels) / 2**20, 2)}


def check_bench(device: str, sizes: dict) -> dict:
    missing = missing_imports(imported_modules(BENCH))
    if missing:
        return {"status": "skipped", "reason": "benchmarks/bench_training_step.py's imports do not all import here",
                "missing_imports": missing}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "bench.json"
        command = [*PYTHON, str(BENCH), "--device", device, "--lengths", sizes["bench_lengths"],
                   *sizes["bench_options"], "--out", str(out)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=child_env(),
                                  timeout=sizes["bench_timeout_s"])
        except subprocess.TimeoutExpired:
            return {"status": "fail", "reason": f"timed out after {sizes['bench_timeout_s']} s"}
        if done.returncode != 0 or not out.is_file():
            return {"status": "fail", "reason": f"exit status {done.returncode}",
                    "stderr_tail": done.stderr.strip()[-3000:]}
        return {"status": "pass", "command": " ".join(command[len(PYTHON):-2]), "result": json.loads(out.read_text()),
                "printed": done.stdout.strip().splitlines()[-8:]}


# ───────────────────────────── the run ─────────────────────────────


def verdict_line(record: dict, out: Path) -> str:
    parts = record["parts"]
    words = []
    for name, part in parts.items():
        if part["status"] == "skipped":
            reason = ", ".join(sorted(set(part.get("missing_imports", {}).values()))) or part.get("reason", "")
            words.append(f"{name} skipped ({reason})")
        elif "cases" in part:
            passed = sum(c["pass"] for c in part["cases"])
            words.append(f"{name} {passed}/{len(part['cases'])}")
        else:
            words.append(f"{name} {part['status']}")
    where = record["device_name"]
    return (f"device check {record['device']} ({where}): {record['verdict']} in {record['wall_s']:.0f} s - "
            + "; ".join(words) + f" -> {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--out", type=Path, help="result JSON (default experiments/device/<device>.json)")
    parser.add_argument("--wheels", type=Path, help="install these wheels (--no-deps, offline) into a temporary "
                        "directory first, e.g. molt-rl's")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--no-chunk-sweep", action="store_true", help="head: measure the fused head at its "
                        "default chunk size only, not also at the other sizes of the sweep")
    parser.add_argument("--perturb", type=float, default=0.0, help="sensitivity check: scale the device's "
                        "gradients and entropies by 1 + REL before comparing (the verdict must then be FAIL)")
    options = parser.parse_args(argv)
    parts = [p for p in options.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        parser.error(f"--parts {options.parts}: unknown {', '.join(unknown) or 'empty'}; use a subset of {','.join(PARTS)}")
    if options.device == "cuda" and not torch.cuda.is_available():
        print("device check: --device cuda, but torch sees no CUDA device here; run it on the GPU box, "
              "or use --device cpu", file=sys.stderr)
        return 2
    out = options.out or REPO / "experiments" / "device" / f"{options.device}.json"
    started = time.monotonic()
    sizes = {**SIZES[options.device], **({"head_chunk_sweep": []} if options.no_chunk_sweep else {})}
    record = {
        "device": options.device,
        "device_name": torch.cuda.get_device_name() if options.device == "cuda" else platform.processor() or platform.machine(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "measured": time.strftime("%Y-%m-%d"), "perturb": options.perturb, "sizes": sizes,
        "tolerances": TOLERANCES, "wheels": install_wheels(options.wheels) if options.wheels else None,
        "parts": {},
    }
    checks = {"loss": lambda: check_loss(options.device, sizes, options.perturb),
              "entropy": lambda: check_entropy(options.device, sizes, options.perturb),
              "head": lambda: check_head(options.device, sizes, options.perturb),
              "molt": lambda: check_molt(options.device, sizes, options.perturb),
              "bench": lambda: check_bench(options.device, sizes)}
    for name in parts:
        part_started = time.monotonic()
        record["parts"][name] = checks[name]()
        record["parts"][name]["wall_s"] = time.monotonic() - part_started
    record["verdict"] = "FAIL" if any(p["status"] == "fail" for p in record["parts"].values()) else "PASS"
    record["wall_s"] = time.monotonic() - started
    line = verdict_line(record, out)
    record["verdict_line"] = line
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(line)
    return 0 if record["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
