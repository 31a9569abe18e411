"""Peak memory and time of Molt's real `PolicyTrainer.training_step` at a real vocabulary and
real sequence lengths: Molt's stock recipe against our loss with and without the entropy filter.

    python benchmarks/bench_training_step.py [--device cpu|cuda] [--lengths 8192,16384] [--quick]
                                             [--repeats 3] [--warmup 1] [--memory-only | --time-only]
                                             [--setups stock,ours_q1,...] [--vocab 151936]
                                             [--out experiments/bench_training_step.json]

The model is Molt's own `molt.models.actor.Actor` around a transformers Qwen2 that is tiny in
width and depth (hidden 64, 2 layers) but has Qwen2.5's vocabulary (151,936) and runs in bf16,
so the [S, V] logits and everything Molt derives from them have their real size. One micro-batch
is one trajectory of S tokens (S/16 prompt, the rest policy tokens) whose reward is 0, so the
entropy filter has a failed row to filter. Setups, each through `PolicyTrainer.training_step`
with Molt's parsed and validated arguments:

  stock     Molt's FlashREINFORCE recipe: loss_mode ppo on force-on-policy batches, IS seq /
            binary_kl / mask at delta 3e-3, seq-mean-token-mean
  ours_q1   --actor.loss_mode flashreinforce (the plugin's PolicyLoss), entropy_filter_q 1, with
            Molt's own head (--flashreinforce.fused_head false)
  ours_q09  the same with entropy_filter_q 0.9: the step also needs every policy token's entropy
  fused_q1  ours_q1 with the fused head (the default): the log-probs computed in chunks inside the
            lm_head, never the [S, V] logits (molt_flashreinforce/fused_head.py)
  fused_q09 ours_q09 with the fused head, which also returns the filter's entropies

`--setups` picks some (default: all); `--vocab` shrinks the vocabulary where the machine cannot
hold the stock step's logits at the longest length (the CPU run: 8,192).

Peak memory is measured in a fresh process per setup and length (CPU: the process's peak RSS,
which also holds the interpreter, the model and the inputs; CUDA: torch.cuda.max_memory_allocated
over the step), and so is the step's own memory: the step's peak minus the memory held just before
it (CPU: the kernel's peak-RSS mark restarted before the step, minus the resident set then). The growth per 1,000 tokens is the slope of each between the
shortest and the longest length measured.
Time is the median of `--repeats` steps after `--warmup` untimed ones, all setups interleaved in
this one process so that machine load hits them alike. The ratios against ours_q1 and stock are printed
and written, with the raw numbers, to the JSON file.

Stood in for, because they need a GPU cluster: the FSDP strategy (a local backward and AdamW
step instead of sharded collectives) and Molt's distributed barrier in `PolicyTrainer.__init__`.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

VOCAB = 151_936  # Qwen2.5's vocabulary
DELTA = 3e-3
SETUPS = ("stock", "ours_q1", "ours_q09", "fused_q1", "fused_q09")
DEFAULT_LENGTHS = (8192, 16384)
QUICK_LENGTHS = (1024,)
RECIPE_FLAGS = [
    "--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_gating", "binary_kl",
    "--algo.advantage.is_correction_mode", "mask", "--algo.advantage.is_correction_threshold", str(DELTA),
    "--actor.loss_agg_mode", "seq-mean-token-mean", "--train.force_on_policy",
    "--rollout.n_samples_per_prompt", "1", "--vllm.num_engines", "1",
]


class LocalStrategy:
    """Stand-in for Molt's FSDP strategy: local backward and optimizer step (no collectives)."""

    dp_size = 1

    def __init__(self, args):
        self.args = args

    def backward(self, loss, model, optimizer, **_):
        loss.backward()

    def optimizer_step(self, optimizer, model, scheduler, **_):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def get_grad_norm(self, model):
        return torch.zeros(())


def molt_args(setup: str, agent_path: str):
    from molt_flashreinforce.launch.molt_cli import parse_and_validate

    common = ["--actor.model_name_or_path", "tiny", "--train.agent_path", agent_path, *RECIPE_FLAGS]
    if setup == "stock":
        return parse_and_validate([*common, "--algo.advantage.estimator", "flash_reinforce",
                                   "--actor.loss_mode", "ppo"])
    q = {"q1": "1.0", "q09": "0.9"}[setup.partition("_")[2]]
    fused = "true" if setup.startswith("fused") else "false"
    return parse_and_validate([*common, "--algo.advantage.estimator", "flashreinforce",
                               "--actor.loss_mode", "flashreinforce", "--flashreinforce.delta", str(DELTA),
                               "--flashreinforce.entropy_filter_q", q, "--flashreinforce.fused_head", fused])


def build_actor(device: str, vocab: int):
    from molt.models.actor import Actor
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32_768,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).to(device=device, dtype=torch.bfloat16)
    return Actor(model, temperature=1.0)


def build_trainer(setup: str, device: str, agent_path: str, vocab: int = VOCAB):
    from molt.trainer.workers import policy_actor

    from molt_flashreinforce.plugin import register

    register()
    policy_actor.torch_dist_barrier_and_cuda_sync = lambda: None  # no process group in this benchmark
    args = molt_args(setup, agent_path)
    actor = build_actor(device, vocab)
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-6)
    scheduler = SimpleNamespace(get_last_lr=lambda: [1e-6])
    return policy_actor.PolicyTrainer(LocalStrategy(args), actor, optimizer, scheduler, vllm_engines=None)


def current_log_probs(actor, sequences, attention_mask, actions: int):
    """The actor's log-probs of the trajectory's policy tokens, in chunks of tokens from its final hidden
    states: the sampler's, which a run gets from the rollout engine's own process (Molt's recipe runs no
    scoring forward in the actor: force-on-policy at KL 0), so this process never holds their [S, V] logits."""
    from molt_flashreinforce.fused_head import chunked_log_probs

    with torch.no_grad():
        hidden = actor.model.model(sequences, attention_mask=attention_mask).last_hidden_state
        log_probs, _ = chunked_log_probs(hidden[:, :-1], actor.model.get_output_embeddings().weight, sequences[:, 1:],
                                         temperature=actor.temperature)
    return log_probs[:, -actions:]


def make_experience(actor, length: int, device: str):
    """One failed trajectory whose stored sampling log-probs sit just below the current ones (admitted)."""
    from molt.trainer.algorithm.experience import Experience

    generator = torch.Generator().manual_seed(length)
    vocab = actor.model.get_output_embeddings().weight.shape[0]
    sequences = torch.randint(0, vocab, (1, length), generator=generator).to(device)
    actions = length - length // 16
    action_mask = torch.ones(1, actions, dtype=torch.bool, device=device)
    attention_mask = torch.ones(1, length, dtype=torch.long, device=device)
    current = current_log_probs(actor, sequences, attention_mask, actions)
    return Experience(sequences=sequences, attention_mask=attention_mask, action_mask=action_mask,
                      rollout_log_probs=current - 1e-3, advantages=torch.full_like(current, -0.5),
                      info={"reward": torch.zeros(1, device=device)})


def step(trainer, experience) -> None:
    trainer.training_step(experience, kl_ctl=0.0, batch_num_tokens=experience.action_mask.sum(),
                          num_microbatches=1, is_optimizer_step=True,
                          batch_num_seqs=torch.tensor(1, device=experience.sequences.device))


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def start_step_peak() -> float:
    """CPU: return freed heap to the system, restart the kernel's peak-RSS mark (VmHWM) and give
    the resident set now, so the step's own peak excludes what came before it (building the model
    and the experience)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return resident_mib()


def step_peak_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def measure_peak_memory(setup: str, length: int, device: str, vocab: int) -> dict:
    """Child process: one training step; the process's peak memory, the memory held just before the
    step and the step's own memory (its peak minus that), in MiB."""
    with tempfile.NamedTemporaryFile(suffix=".py") as agent:
        trainer = build_trainer(setup, device, agent.name, vocab)
        experience = make_experience(trainer.actor, length, device)
        if device == "cuda":
            synchronize(device)
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() / 2**20
        else:
            before = start_step_peak()
        step(trainer, experience)
        synchronize(device)
    if device == "cuda":
        peak = step_peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        # Linux reports ru_maxrss in KiB. It covers the whole process: interpreter, model, inputs, step.
        peak, step_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, step_peak_mib()
    return {"peak_mib": peak, "before_step_mib": before, "step_mib": step_peak - before}


def peak_memory_in_fresh_process(setup: str, length: int, device: str, vocab: int) -> dict:
    result = subprocess.run([sys.executable, __file__, "--device", device, "--vocab", str(vocab),
                             "--child", setup, str(length)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"memory probe {setup} S={length} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure_times(setups, length: int, device: str, repeats: int, warmup: int, vocab: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".py") as agent:
        trainers = {setup: build_trainer(setup, device, agent.name, vocab) for setup in setups}
    experiences = {setup: make_experience(trainer.actor, length, device) for setup, trainer in trainers.items()}
    samples = {setup: [] for setup in setups}
    for round_index in range(warmup + repeats):
        for setup in setups:  # interleaved so drift in machine load hits every setup alike
            synchronize(device)
            start = time.perf_counter()
            step(trainers[setup], experiences[setup])
            synchronize(device)
            if round_index >= warmup:
                samples[setup].append(time.perf_counter() - start)
    return {setup: {"median_s": statistics.median(values), "samples_s": values} for setup, values in samples.items()}


RATIOS = (("ours_q09", "ours_q1"), ("ours_q1", "stock"), ("ours_q09", "stock"), ("fused_q1", "stock"),
          ("fused_q09", "stock"), ("fused_q1", "ours_q1"), ("fused_q09", "ours_q09"))


def ratios(values: dict) -> dict:
    return {f"{a}/{b}": values[a] / values[b] for a, b in RATIOS if a in values and b in values}


def growth_per_1k_tokens(lengths_record: dict, setups) -> dict:
    """MiB per 1,000 tokens of the step's own memory and of the peak, between the shortest and the
    longest length measured for each setup."""
    measured = sorted((int(length), entry["memory"]) for length, entry in lengths_record.items() if "memory" in entry)
    growth = {"step_mib": {}, "peak_mib": {}}
    for quantity, per_setup in growth.items():
        for setup in setups:
            points = [(length, memory[setup][quantity]) for length, memory in measured
                      if quantity in memory.get(setup, {})]
            if len(points) >= 2:
                per_setup[setup] = (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]) * 1000
    return growth


def run(lengths, device: str, repeats: int, warmup: int, timed: bool, measure_memory: bool = True,
        setups=SETUPS, vocab: int = VOCAB) -> dict:
    record = {"device": device, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "machine": platform.processor() or platform.machine(), "vocab": vocab,
              "repeats": repeats if timed else 0, "warmup": warmup if timed else 0,
              "model": "Qwen2 hidden 64, 2 layers, bf16, in molt.models.actor.Actor", "lengths": {}}
    if device == "cuda":
        record["gpu"] = torch.cuda.get_device_name()
    print(f"device={device} V={vocab} bf16, one trajectory of S tokens per micro-batch"
          + ("; peak memory in a fresh process per setup" if measure_memory else "")
          + (f"; time = median of {repeats} interleaved steps after {warmup} warm-up" if timed else ""))
    print(f"{'S':>6} {'setup':>9} {'peak MiB':>10} {'step MiB':>10} {'step s':>8}")
    for length in lengths:
        entry = record["lengths"][str(length)] = {}
        nan = {setup: float("nan") for setup in setups}
        peaks, steps, medians = dict(nan), dict(nan), dict(nan)
        if measure_memory:
            entry["memory"] = {setup: peak_memory_in_fresh_process(setup, length, device, vocab) for setup in setups}
            peaks = {setup: entry["memory"][setup]["peak_mib"] for setup in setups}
            steps = {setup: entry["memory"][setup]["step_mib"] for setup in setups}
            entry["peak_ratios"], entry["step_memory_ratios"] = ratios(peaks), ratios(steps)
        if timed:
            entry["time"] = measure_times(setups, length, device, repeats, warmup, vocab)
            medians = {setup: entry["time"][setup]["median_s"] for setup in setups}
            entry["time_ratios"] = ratios(medians)
        for setup in setups:
            print(f"{length:>6} {setup:>9} {peaks[setup]:>10.0f} {steps[setup]:>10.0f} {medians[setup]:>8.2f}")
        for name, value in ratios(peaks).items():
            print(f"{length:>6} {name:<18} peak {value:6.3f}   step memory {ratios(steps)[name]:6.3f}   "
                  f"time {ratios(medians)[name]:6.3f}")
    return record


def merge_earlier(record: dict, earlier: dict) -> None:
    """Keep in `record` what an earlier run on the same device and vocabulary measured and this one did not:
    other lengths, and at a length measured again the part (memory or time) this run skipped."""
    if (earlier.get("device"), earlier.get("vocab")) != (record["device"], record["vocab"]):
        return
    if not record["repeats"]:  # this run did not time: the kept timings are the earlier run's
        record["repeats"], record["warmup"] = earlier["repeats"], earlier["warmup"]
    record["lengths"] = {**earlier["lengths"], **{length: {**earlier["lengths"].get(length, {}), **entry}
                                                  for length, entry in record["lengths"].items()}}


def parse_lengths(text: str):
    try:
        lengths = tuple(int(part) for part in text.split(","))
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 32:
        raise SystemExit(f"--lengths {text!r}: expected comma-separated token counts of at least 32, "
                         "e.g. --lengths 8192,16384")
    return lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)),
                        help="comma-separated sequence lengths (tokens per micro-batch)")
    parser.add_argument("--quick", action="store_true", help=f"lengths {QUICK_LENGTHS}, one timed step")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per setup")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per setup before them")
    parser.add_argument("--memory-only", action="store_true", help="skip the timing")
    parser.add_argument("--time-only", action="store_true", help="skip the fresh-process memory measurements")
    parser.add_argument("--out", type=Path, help="write the measurements to this JSON file (what it already holds "
                        "for the same device and vocabulary and is not measured again is kept: other lengths, and "
                        "the timings of a --memory-only run's lengths or the memory of a --time-only one's)")
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated, of {', '.join(SETUPS)}")
    parser.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary size (default Qwen2.5's)")
    parser.add_argument("--child", nargs=2, metavar=("SETUP", "LENGTH"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here; run on a GPU node or use --device cpu")
    if options.child:
        setup, length = options.child
        print(json.dumps(measure_peak_memory(setup, int(length), options.device, options.vocab)))
        return
    setups = tuple(options.setups.split(","))
    if not setups or set(setups) - set(SETUPS) or options.vocab < 2:
        raise SystemExit(f"--setups {options.setups!r} --vocab {options.vocab}: choose setups among "
                         f"{','.join(SETUPS)} and a vocabulary of at least 2, e.g. --setups stock,fused_q1 --vocab 8192")
    if options.repeats < 1 or options.warmup < 0:
        raise SystemExit(f"--repeats {options.repeats} --warmup {options.warmup}: need --repeats >= 1 "
                         "and --warmup >= 0")
    lengths = QUICK_LENGTHS if options.quick else parse_lengths(options.lengths)
    if options.memory_only and options.time_only:
        raise SystemExit("--memory-only and --time-only exclude each other; drop one")
    record = run(lengths, options.device, 1 if options.quick else options.repeats, options.warmup,
                 timed=not options.memory_only, measure_memory=not options.time_only, setups=setups,
                 vocab=options.vocab)
    if options.out:
        if options.out.exists():
            merge_earlier(record, json.loads(options.out.read_text()))
        record["memory_growth_mib_per_1k_tokens"] = growth_per_1k_tokens(record["lengths"], SETUPS)
        options.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
