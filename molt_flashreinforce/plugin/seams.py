"""The one module that touches Molt's private names: the contract it was tested against, the
wrappers of Molt's methods, and the ordered hooks the rest of the plugin registers into.

    check()                     the installed Molt is the one tested (plugin/compat.py) and every symbol
                                of `CONTRACT` is as tested; else `MoltDrift`, in one line
    install(parts)              wrap each Molt runtime method once; the wrappers call the hooks of
                                `parts` (`RuntimeHooks`), in that order (plugin/ray_hooks.py)
    wrap_trainer(cls)           the same wrappers on a trainer class of one's own (tests)
    wrap_policy_trainer(built, stepping)   the loss owner of each policy actor (plugin/registry.py)
    fusing_head(trainer, deliver, num_actions, ran)   one training step with the chunked head (fused_head.py)
                                in the actor's lm_head, `ran()` after each forward it served; `fused_head_refusal`
                                says in one line where it cannot run

`CONTRACT` lists every Molt method wrapped here (its parameters, and the return layout where we
unpack it), every private attribute, function or source layout read, and the Ray layout we rely
on to reach Molt's actors, each as molt-rl 0.2.1 has it. `check()` runs before anything is
wrapped, in the driver and in every Ray worker (the setup hook, the stock CLI's runtime-env hook),
so a Molt that drifted stops the run in one line naming the symbol instead of training wrongly.
The rest of the package reads Molt's internals only through the functions at the end.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import logging
import re
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from molt_flashreinforce.plugin.compat import UnsupportedMolt, check_molt_version, tested_versions

_STEP_TAG = re.compile(r"global_step(\d+)$")
_RAY_TRACE = "_ray_trace_ctx"  # the keyword Ray adds to the methods of a class it captured


class MoltDrift(UnsupportedMolt):
    """A symbol of Molt that the plugin relies on is not as tested (the message is one line)."""


@dataclass(frozen=True)
class Seam:
    """One Molt symbol as tested. Every field that is set is checked."""

    path: str  # dotted: module, then attributes; a @ray.remote actor continues with the class Ray captured
    signature: str | None = None  # its parameters, without annotations (and Ray's _ray_trace_ctx)
    returns: str | None = None  # the return annotation, where we unpack the result
    assigns: tuple[str, ...] = ()  # instance attributes its class's source assigns, that we read
    contains: tuple[str, ...] = ()  # source lines we rely on (whitespace folded)
    is_property: bool = False
    kind: type | None = None
    ray_actor: bool = False  # a @ray.remote class: its __ray_metadata__.modified_class subclasses it
    main_block: bool = False  # a module whose `if __name__ == '__main__':` block we run (molt_cli)


_SG = "molt.trainer.rollout.samples_generator"
_RL = "molt.trainer.rl_trainer"
_EXPERIENCE = "List[molt.trainer.algorithm.experience.Experience]"
_VLLM = "molt.trainer.vllm"
# WorkerWrap.update_weights_packed as tested: its receive (a CUDA buffer on the current stream),
# then what rehearsal/vllm_worker.py repeats after receiving on the CPU.
WORKER_RECEIVE = ('buf = torch.empty(sum(sizes), dtype=torch.uint8, device="cuda") '
                  'self._model_update_group.broadcast(buf, src=0, stream=torch.cuda.current_stream())')
WORKER_LOAD = (
    "sizes = [math.prod(shape) * dtype.itemsize for _, dtype, shape in metas]",
    "weights = [ (name, part.view(dtype).view(*shape)) for (name, dtype, shape), part in zip(metas, buf.split(sizes)) ]",
    "with set_current_vllm_config(self.vllm_config): loaded = self.model_runner.model.load_weights(weights=weights)",
    'if getattr(self, "_weight_update_loaded", None) is not None and loaded: self._weight_update_loaded.update(loaded)',
    "if loaded is not None and len(loaded) == 0 and weights:",
)
CONTRACT: tuple[Seam, ...] = (
    # The generator: carry-over, the lag probe and bound, progress (plugin/carryover.py, policy_lag.py,
    # lag_bound.py, progress.py).
    Seam(f"{_SG}.SamplesGenerator", assigns=("prompts_dataloader", "_inflight_rollouts", "_finished_samples")),
    Seam(f"{_SG}.SamplesGenerator._dispatch_to_agent_runners",
         "(self, prompts, labels, *, images=None, tools=None, **generate_kwargs)", returns="List"),
    Seam(f"{_SG}.SamplesGenerator._filter_group",
         "(self, finished_rollout, dynamic_filtering, drop_counts, score_stats=None, **generate_kwargs)",
         returns=_EXPERIENCE),
    Seam(f"{_SG}.SamplesGenerator.generate_samples", "(self, **generate_kwargs)",
         returns=f"Tuple[{_EXPERIENCE}, Dict[str, float], int, bool]"),
    Seam(f"{_SG}.SamplesGenerator.state_dict", "(self)"),
    Seam(f"{_SG}.SamplesGenerator.load_state_dict", "(self, state_dict)"),
    Seam(f"{_SG}.SamplesGenerator.prompts_drained", is_property=True),
    Seam(f"{_SG}._sample_group_key", "(sample)"),
    # The actors Ray captured when Molt's module was imported: the class patched is the captured one.
    Seam(f"{_RL}.GenerateSamplesActor", ray_actor=True, assigns=("args", "samples_generator", "rollout_slots")),
    Seam(f"{_RL}.GenerateSamplesActor.__init__",
         "(self, pretrain, strategy, *, vllm_lock, rollout_queue, rollout_slots, router_url=None, **generate_kwargs)"),
    Seam(f"{_RL}.GenerateSamplesActor.fit", "(self, episode, total_consumed_prompts)"),
    Seam(f"{_RL}.TrainingActor", ray_actor=True),
    Seam(f"{_RL}.TrainingActor.fit", "(self, global_step=0)"),
    Seam(f"{_RL}.TrainingActor.save_logs_and_checkpoints", "(self, global_step, logs_dict=None, client_states=None)"),
    Seam(f"{_RL}.BaseRLTrainer", assigns=("args",)),
    Seam(f"{_RL}.BaseRLTrainer.train_step", "(self, rollout_samples, global_step)", returns="Tuple[Dict, int]"),
    # The loss owner in each PolicyModelActor (plugin/registry.py) and the loss we build like it.
    Seam("molt.trainer.workers.policy_actor.PolicyTrainer", assigns=("args", "actor", "actor_loss_fn")),
    Seam("molt.trainer.workers.policy_actor.PolicyTrainer.__init__",
         "(self, strategy, actor, actor_optim, actor_scheduler, micro_train_batch_size=8, buffer_limit=0, "
         "buffer_cpu_offload=True, tokenizer=None, dataloader_pin_memory=True, vllm_engines=None, **kwargs)",
         # plugin/policy_loss.py builds the loss with these same arguments.
         contains=("self.actor_loss_fn = PolicyLoss( clip_eps_low=self.args.actor.eps_clip_low_high[0], "
                   "clip_eps_high=self.args.actor.eps_clip_low_high[1], dual_clip=self.args.actor.dual_clip, "
                   "loss_mode=self.args.actor.loss_mode, is_correction_level=self.args.algo.advantage.is_correction_level, "
                   "is_correction_mode=self.args.algo.advantage.is_correction_mode, is_correction_threshold=( "
                   "self.args.algo.advantage.is_correction_threshold if self.args.algo.advantage.is_correction_level "
                   "!= \"off\" else None ), loss_agg_mode=self.args.actor.loss_agg_mode, "
                   "is_correction_gating=self.args.algo.advantage.is_correction_gating, "
                   "score_centering=self.args.algo.advantage.score_centering_top_k > 0, )",)),
    Seam("molt.trainer.workers.policy_actor.PolicyTrainer.training_step",
         "(self, experience, kl_ctl, batch_num_tokens, num_microbatches, is_optimizer_step, batch_num_seqs=None, "
         "prompt_token_counts=None)"),
    Seam("molt.models.loss.PolicyLoss.__init__",
         "(self, clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None, token_level_loss=True, "
         "is_correction_threshold=None, is_correction_level='off', is_correction_mode='mask', "
         "loss_agg_mode='token-mean', loss_mode='ppo', is_correction_gating='ratio', score_centering=False)"),
    Seam("molt.models.loss.PolicyLoss.forward",
         "(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, dp_size=1, "
         "batch_num_tokens=None, global_batch_size=None, prompt_token_counts=None, top_log_probs=None, "
         "rollout_top_log_probs=None)"),
    # The actor's forward, observed for the entropy filter's layout (plugin/registry.py).
    Seam("molt.models.actor.Actor.forward",
         "(self, sequences, action_mask=None, attention_mask=None, position_ids=None, cp_context_stack=None, "
         "return_entropy=False, routed_experts=None, top_ids=None, **mm_inputs)",
         contains=("output, rolled_sequences, cp_forward, indices, batch, seqlen = self._forward_backbone(",)),
    Seam("molt.models.actor.Actor._forward_backbone",
         "(self, sequences, attention_mask, position_ids, cp_context_stack, mm_inputs, output_hidden_states=False, "
         "routed_experts=None)"),
    Seam("molt.models.actor.Actor._restore_full_sequence", "(self, t, *, cp_forward, batch, seqlen, indices)"),
    # The fused head's targets: Molt's rolled sequences, packed as Molt packs them (plugin/seams.py `fusing_head`).
    Seam("molt.trainer.fsdp.packing.pack_padded_batch",
         "(sequences, attention_mask, *, style='hf', pad_to_tokens=None)",
         contains=("rolled = torch.roll(sequences, shifts=-1, dims=1)",
                   "rolled_packed = rolled.reshape(batch * seqlen).index_select(0, indices).unsqueeze(0)",
                   "rolled_packed = F.pad(rolled_packed, (0, trailing_pad))")),
    # One reward per rollout for the group estimators, ours included (plugin/registry.py).
    Seam("molt.trainer.algorithm.advantage.GROUP_ADVANTAGE_ESTIMATORS", kind=frozenset),
    Seam("molt.trainer.rollout.experience_maker.GROUP_ADVANTAGE_ESTIMATORS", kind=frozenset),
    # Molt's CLI, reused statement for statement (launch/molt_cli.py), and its workers' environment.
    Seam("molt.cli.train_rl_ray", main_block=True),
    Seam("molt.cli.train_rl_ray._ray_runtime_env_vars", "()"),
    # Molt's checkpoint loader, asked which checkpoint a resume loads.
    Seam("molt.trainer.fsdp.checkpoint.CheckpointManager.__init__", "(self, strategy)"),
    Seam("molt.trainer.fsdp.checkpoint.CheckpointManager._resolve_ckpt_load_dir", "(self, ckpt_path)"),
    # Ray's own handler, which a worker of a supervised run must not install (plugin/progress.py).
    Seam("ray._private.utils.set_sigterm_handler", "(sigterm_handler)"),
    # vLLM's engine actor and its worker extension, run for real by the CPU rehearsal
    # (rehearsal/vllm_actor.py, rehearsal/vllm_worker.py): the actor is subclassed to name another
    # worker extension; the extension keeps WorkerWrap's bookkeeping and replaces only the receive
    # buffer (CUDA there) and the communicator factory (PyNccl there).
    Seam(f"{_VLLM}.vllm_engine.RolloutRayActor", ray_actor=True),
    Seam(f"{_VLLM}.vllm_engine.RolloutRayActor.__init__", "(self, *args, bundle_indices=None, **kwargs)",
         contains=("self.kwargs = kwargs",
                   "engine_args = vllm.AsyncEngineArgs(*args, **_filter_vllm_engine_kwargs(self.kwargs))")),
    Seam(f"{_VLLM}.vllm_engine.create_vllm_engines",
         contains=('"worker_extension_cls": "molt.trainer.vllm.vllm_worker_wrap.WorkerWrap",',)),
    Seam(f"{_VLLM}.vllm_worker_wrap.WorkerWrap", assigns=("_model_update_group", "_weight_update_loaded")),
    Seam(f"{_VLLM}.vllm_worker_wrap.WorkerWrap.init_process_group",
         "(self, master_address, master_port, rank_offset, world_size, group_name, backend='nccl')",
         contains=("from molt.utils.distributed_util import stateless_init_process_group",
                   "self._model_update_group = stateless_init_process_group(")),
    Seam(f"{_VLLM}.vllm_worker_wrap.WorkerWrap.update_weights_packed", "(self, metas)",
         contains=(WORKER_RECEIVE, *WORKER_LOAD)),
    Seam(f"{_VLLM}.vllm_worker_wrap.WorkerWrap.end_weight_update", "(self)"),
    Seam("molt.utils.distributed_util.stateless_init_process_group",
         "(master_address, master_port, rank, world_size, device)"),
)


def _captured(actor):
    """The class `@ray.remote` captured for `actor` (its methods are what Ray's actor runs)."""
    return actor.__ray_metadata__.modified_class


class Unavailable(Exception):
    """A module on the path needs a package this process lacks (vLLM on a CPU-only dry run): what
    it holds cannot run here either, so there is nothing to check."""


@contextmanager
def _torchaos_deprecation_quiet():
    """Where vLLM is installed, importing Molt imports torchao (through transformers' quantizers),
    which registers its enums with a pytree call torch 2.13 deprecates; torch logs that to stderr,
    where it would break the launcher's one-line refusals, and nobody here can act on it."""
    pytree_log = logging.getLogger("torch.utils._pytree")
    level = pytree_log.level
    pytree_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        pytree_log.setLevel(level)


def resolve(path: str):
    """The object at a dotted path: the longest importable module, then attributes; a Ray actor
    class on the way continues with the class Ray captured."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            with _torchaos_deprecation_quiet():
                value = importlib.import_module(module)
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if not module.startswith(missing) and missing.partition(".")[0] not in ("molt", "ray"):
                raise Unavailable(missing) from None
            continue
        for name in parts[cut:]:
            if hasattr(value, "__ray_metadata__"):
                value = _captured(value)
            value = getattr(value, name)
        return value
    raise ImportError(f"no module of {path} imports")


def _shape(function) -> str:
    signature = inspect.signature(function)
    return str(signature.replace(
        parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values() if p.name != _RAY_TRACE],
        return_annotation=inspect.Signature.empty))


def _returns(function) -> str:
    annotation = inspect.signature(function).return_annotation
    return inspect.formatannotation(annotation) if annotation is not inspect.Signature.empty else ""


def _folded(text: str) -> str:
    return " ".join(text.split())


def _plain_class(value):
    return _captured(value).__mro__[1] if hasattr(value, "__ray_metadata__") else value


@functools.lru_cache(maxsize=None)
def _assigned(cls) -> frozenset[str]:
    """The `self.<name>` targets its class body assigns."""
    tree = ast.parse(_dedented_source(cls))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for element in ast.walk(target):
                if isinstance(element, ast.Attribute) and isinstance(element.value, ast.Name) and element.value.id == "self":
                    names.add(element.attr)
    return frozenset(names)


def _dedented_source(value) -> str:
    return textwrap.dedent(inspect.getsource(value))


def _main_block(module) -> list[ast.stmt]:
    """The statements of `module`'s `if __name__ == '__main__':` block."""
    return _main_block_of(inspect.getsourcefile(module))


@functools.lru_cache(maxsize=None)
def _main_block_of(path: str) -> list[ast.stmt]:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    blocks = [node for node in tree.body
              if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"]
    return blocks[0].body if blocks else []


def _main_block_problem(module) -> str | None:
    body = _main_block(module)
    if not body:
        return "has no `if __name__ == '__main__':` block"
    if not any(ast.unparse(stmt).replace(" ", "") == "args=parser.parse_args()" for stmt in body):
        return "its __main__ block no longer parses its arguments with `args = parser.parse_args()`"
    if ast.unparse(body[-1]) != "train(args)":
        return "its __main__ block no longer ends with `train(args)`"
    return None


def problem(seam: Seam) -> str | None:
    """What differs from the tested symbol, or None."""
    try:
        value = resolve(seam.path)
    except Unavailable:
        return None
    except (ImportError, AttributeError) as error:
        return f"is missing ({error})"
    try:
        if seam.ray_actor:
            captured = _captured(value)
            if not isinstance(captured, type) or captured.__mro__[1].__name__ != seam.path.rpartition(".")[2]:
                return "is not the @ray.remote class it was (its captured class differs)"
        if seam.kind is not None and not isinstance(value, seam.kind):
            return f"is a {type(value).__name__}, not a {seam.kind.__name__}"
        if seam.is_property and not isinstance(value, property):
            return f"is a {type(value).__name__}, not a property"
        if seam.signature is not None and _shape(value) != seam.signature:
            return f"takes {_shape(value)}, not {seam.signature}"
        if seam.returns is not None and _returns(value) != seam.returns:
            return f"returns {_returns(value) or 'an unannotated value'}, not {seam.returns}"
        if seam.assigns:
            missing = [name for name in seam.assigns if name not in _assigned(_plain_class(value))]
            if missing:
                return f"no longer assigns {', '.join(f'self.{name}' for name in missing)}"
        if seam.contains:
            source = _folded(_dedented_source(value))
            missing = [line for line in seam.contains if _folded(line) not in source]
            if missing:
                return f"no longer has `{missing[0][:80]}{'...' if len(missing[0]) > 80 else ''}`"
        if seam.main_block:
            return _main_block_problem(value)
    except (AttributeError, TypeError, ValueError, OSError, IndexError) as error:
        return f"cannot be read as tested ({type(error).__name__}: {error})"
    return None


def _stop_at_drift(checked) -> None:
    check_molt_version()
    for seam in checked:
        found = problem(seam)
        if found:
            raise MoltDrift(f"Molt's {seam.path} {found}: molt-flashreinforce relies on it as in {tested_versions()}; "
                            f"install a tested molt-rl")


@functools.lru_cache(maxsize=1)
def _checked() -> None:
    _stop_at_drift(CONTRACT)


def check() -> None:
    """Raise `UnsupportedMolt` (an untested version) or `MoltDrift` (a symbol not as tested), in one
    line; a process that passed once is not checked again."""
    _checked()


@functools.lru_cache(maxsize=None)
def check_under(*prefixes: str) -> None:
    """`check()` for the symbols under these dotted prefixes only: for a process that uses nothing
    else of Molt (vLLM's worker, which need not import Molt's trainer)."""
    _stop_at_drift([seam for seam in CONTRACT if seam.path.startswith(prefixes)])


# -- the runtime: each Molt method wrapped once, calling the hooks in order ----------------------


class RuntimeHooks:
    """What one part of the plugin does at Molt's runtime seams. The wrapper of each Molt method
    calls the method of every part given to `install`, in that order; this base does nothing."""

    # GenerateSamplesActor, which hosts the generator
    def generator_actor_built(self, actor) -> None:
        """After its __init__ (`actor.args`, `actor.samples_generator`, `actor.rollout_slots` exist)."""

    def episode_starting(self, actor, episode: int) -> int:
        """Before its fit(episode, ...): the episode it runs."""
        return episode

    # SamplesGenerator: dispatch and collect
    def batch_starting(self, generator) -> None:
        """Before generate_samples collects a batch."""

    def batch_ended(self, generator, samples, rollout_metrics) -> None:
        """After it (samples and metrics are None when it raised)."""

    def dispatched(self, generator, refs: list, prompts: list[tuple]) -> None:
        """After rollouts went to the agent runners: one (prompt, label, image, tools) per ref."""

    def choosing(self, generator, finished, pool: list):
        """Before a finished rollout group is collected: the one to collect instead (it takes the
        returned one's place in `pool`, the rollouts still in flight)."""
        return finished

    def collected(self, generator, finished, samples: list, drop_counts: dict) -> list:
        """After Molt filtered the group: the samples to keep."""
        return samples

    # SamplesGenerator: state save and load (Molt stores it with each batch, so in the checkpoint)
    def state_saving(self, generator, state: dict) -> None:
        """Add to the state Molt saves."""

    def state_loaded(self, generator, state: dict) -> None:
        """After a resumed run's generator loaded it."""

    # TrainingActor: the train step and the step's end
    def training_starting(self, trainer, global_step: int) -> None:
        """Before its fit(global_step)."""

    def train_step_starting(self, trainer, samples: list, global_step: int) -> None:
        """Before the optimizer step on `samples` (raising stops it)."""

    def train_step_ended(self, trainer, samples: list, global_step: int, status: dict, next_step: int) -> None:
        """After the update and the refit: `status` is what Molt logs under train/."""

    def checkpoint_wanted(self, trainer, global_step: int) -> bool:
        """Whether this step must save a checkpoint, whatever --ckpt.save_steps says."""
        return False

    def step_ended(self, trainer, global_step: int, checkpoint_saved: bool) -> None:
        """After Molt logged the step and saved its checkpoint, if it saved one."""


_parts: tuple[RuntimeHooks, ...] = ()
_WRAPPED = "_molt_flashreinforce_seam"  # marks our wrappers, so that nothing is wrapped twice


def _wrap(cls, name: str, make) -> None:
    """Set `cls.name` to `make(original)` unless it is one of our wrappers already (e.g. inherited)."""
    original = getattr(cls, name)
    if getattr(original, _WRAPPED, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _WRAPPED, True)
    setattr(cls, name, wrapper)


def _wrap_generator(cls) -> None:
    def dispatch(original):
        def dispatched(self, prompts, labels, *, images=None, tools=None, **kwargs):
            refs = original(self, prompts, labels, images=images, tools=tools, **kwargs)
            images = images if images is not None else [None] * len(prompts)
            tools = tools if tools is not None else [None] * len(prompts)
            rows = list(zip(prompts, labels, images, tools))
            for part in _parts:
                part.dispatched(self, refs, rows)
            return refs
        return dispatched

    def filter_group(original):
        def collected(self, finished_rollout, dynamic_filtering, drop_counts, *args, **kwargs):
            # Molt makes the in-flight pool in generate_samples: the eval at start comes before it.
            pool = getattr(self, "_inflight_rollouts", [])
            for part in _parts:
                finished_rollout = part.choosing(self, finished_rollout, pool)
            samples = original(self, finished_rollout, dynamic_filtering, drop_counts, *args, **kwargs)
            for part in _parts:
                samples = part.collected(self, finished_rollout, samples, drop_counts)
            return samples
        return collected

    def generate_samples(original):
        def batch(self, *args, **kwargs):
            for part in _parts:
                part.batch_starting(self)
            samples = rollout_metrics = None
            try:
                samples, rollout_metrics, prompts, exhausted = original(self, *args, **kwargs)
                return samples, rollout_metrics, prompts, exhausted
            finally:
                for part in _parts:
                    part.batch_ended(self, samples, rollout_metrics)
        return batch

    def state_dict(original):
        def saving(self):
            state = dict(original(self) or {})
            for part in _parts:
                part.state_saving(self, state)
            return state
        return saving

    def load_state_dict(original):
        def loaded(self, state):
            original(self, state)
            for part in _parts:
                part.state_loaded(self, state or {})
        return loaded

    for name, make in (("_dispatch_to_agent_runners", dispatch), ("_filter_group", filter_group),
                       ("generate_samples", generate_samples), ("state_dict", state_dict),
                       ("load_state_dict", load_state_dict)):
        _wrap(cls, name, make)


def _wrap_generator_actor(cls) -> None:
    def init(original):
        def built(self, *args, **kwargs):
            original(self, *args, **kwargs)
            for part in _parts:
                part.generator_actor_built(self)
        return built

    def fit(original):
        def episode_run(self, episode: int, total_consumed_prompts: int):
            for part in _parts:
                episode = part.episode_starting(self, episode)
            return original(self, episode, total_consumed_prompts)
        return episode_run

    _wrap(cls, "__init__", init)
    _wrap(cls, "fit", fit)


def wrap_trainer(cls) -> None:
    """Wrap a trainer class's fit, train_step and save_logs_and_checkpoints (those it has)."""
    def fit(original):
        def training(self, global_step: int = 0, *args, **kwargs):
            for part in _parts:
                part.training_starting(self, global_step)
            return original(self, global_step, *args, **kwargs)
        return training

    def train_step(original):
        def step(self, rollout_samples, global_step):
            for part in _parts:
                part.train_step_starting(self, rollout_samples, global_step)
            status, next_step = original(self, rollout_samples, global_step)
            for part in _parts:
                part.train_step_ended(self, rollout_samples, global_step, status, next_step)
            return status, next_step
        return step

    def save(original):
        def step_end(self, global_step: int, logs_dict=None, client_states=None):
            wanted = [part.checkpoint_wanted(self, global_step) for part in _parts]
            every = self.args.ckpt.save_steps
            if any(wanted):
                self.args.ckpt.save_steps = global_step  # Molt saves when save_steps divides the step
            try:
                original(self, global_step, logs_dict, client_states)
            finally:
                self.args.ckpt.save_steps = every
            for part in _parts:
                part.step_ended(self, global_step, any(wanted) or global_step % every == 0)
        return step_end

    for name, make in (("fit", fit), ("train_step", train_step), ("save_logs_and_checkpoints", save)):
        if hasattr(cls, name):
            _wrap(cls, name, make)


def install(parts: tuple[RuntimeHooks, ...]) -> None:
    """Check Molt, then wrap its runtime classes in this process once; from now on their wrappers
    call `parts`' hooks in this order. Ray ships the actor classes it captured when Molt's module
    was imported, so those are the ones wrapped, in the driver (before Molt creates its actors)
    and in every worker."""
    global _parts
    check()
    from molt.trainer import rl_trainer
    from molt.trainer.rollout.samples_generator import SamplesGenerator

    _parts = tuple(parts)
    _wrap_generator(SamplesGenerator)
    _wrap_generator_actor(_captured(rl_trainer.GenerateSamplesActor))
    for trainer in (rl_trainer.BaseRLTrainer, *captured_trainer_classes(rl_trainer)):
        wrap_trainer(trainer)


def captured_trainer_classes(module) -> list[type]:
    """The classes `@ray.remote` built from `BaseRLTrainer` subclasses in `module` (TrainingActor's)."""
    from molt.trainer.rl_trainer import BaseRLTrainer

    captured = (getattr(getattr(value, "__ray_metadata__", None), "modified_class", None) for value in vars(module).values())
    return [cls for cls in captured if isinstance(cls, type) and issubclass(cls, BaseRLTrainer)]


# -- the loss owner of each PolicyModelActor --------------------------------------------------------


def wrap_policy_trainer(built, stepping) -> None:
    """Molt's `PolicyTrainer`, once: `built(trainer)` after its __init__, and each training_step
    inside the context `stepping(trainer, experience)`."""
    from molt.trainer.workers.policy_actor import PolicyTrainer

    def init(original):
        def trainer_built(self, *args, **kwargs):
            original(self, *args, **kwargs)
            built(self)
        return trainer_built

    def training_step(original):
        def step(self, experience, *args, **kwargs):
            with stepping(self, experience):
                return original(self, experience, *args, **kwargs)
        return step

    _wrap(PolicyTrainer, "__init__", init)
    _wrap(PolicyTrainer, "training_step", training_step)


@contextmanager
def capturing_action_entropies(trainer, deliver, num_actions: int):
    """Hand `deliver` the action span's entropies [B, A] from the trainer's one actor forward.

    With an entropy bonus (entropy_coef > 0) Molt computes a differentiable entropy anyway, and it
    is read from the output. Without one, the forward runs as at q = 1 (no `return_entropy`, so
    Molt makes no float32 copy of the logits and keeps scoring the bf16 ones), and `token_entropy`
    computes the entropies afterwards from the logits that forward returns, slab by slab, at the
    actor's (rollout) temperature. `_forward_backbone` is observed, not changed, for the layout
    (context-parallel shard or packing) that maps them back onto the [B, S] axis, as in Molt.
    """
    from molt_flashreinforce.entropy import token_entropy

    actor = trainer.actor
    forward = type(actor).forward
    if trainer.args.actor.entropy_coef:
        def forward_with_entropy(*args, **kwargs):
            output = forward(actor, *args, **kwargs)
            deliver(output["entropy"][:, -num_actions:].detach())
            return output
    else:
        backbone = actor._forward_backbone
        layouts = []

        def backbone_observed(*args, **kwargs):
            result = backbone(*args, **kwargs)
            layouts.append(result[2:])  # cp_forward, indices, batch, seqlen
            return result

        def forward_with_entropy(*args, **kwargs):
            output = forward(actor, *args, **kwargs)
            cp_forward, indices, batch, seqlen = layouts.pop()
            entropy = token_entropy(output["logits"], temperature=actor.temperature)
            entropy = actor._restore_full_sequence(entropy, cp_forward=cp_forward, batch=batch, seqlen=seqlen,
                                                   indices=indices)
            deliver(entropy[:, :-1][:, -num_actions:])
            return output

        actor._forward_backbone = backbone_observed
    actor.forward = forward_with_entropy
    try:
        yield
    finally:
        del actor.forward
        vars(actor).pop("_forward_backbone", None)


_FUSED_HEAD_FIX = "set algo.fused_head=false (--flashreinforce.fused_head false)"


def fused_head_args_refusal(args) -> str | None:
    """Why Molt's parsed `args` leave the fused head (`--flashreinforce.fused_head`) nothing to run on, in one
    line; None if they do not."""
    fix = _FUSED_HEAD_FIX
    if args.fsdp.tp_size > 1:
        return (f"algo.fused_head does not support a vocabulary-parallel lm_head (fsdp.tp_size={args.fsdp.tp_size}); "
                f"{fix}")
    if args.fsdp.cp_size > 1:
        return f"algo.fused_head does not support context parallelism (fsdp.cp_size={args.fsdp.cp_size}); {fix}"
    if args.actor.entropy_coef:
        return (f"algo.fused_head returns entropies without gradient, and actor.entropy_coef="
                f"{args.actor.entropy_coef} trains through them; {fix} or use actor.entropy_coef=0")
    if args.algo.advantage.score_centering_top_k > 0:
        return (f"algo.fused_head scores the sampled token only, and algo.advantage.score_centering_top_k="
                f"{args.algo.advantage.score_centering_top_k} needs the sampler's top-k too; {fix}")
    return None


def fused_head_refusal(args, actor) -> str | None:
    """`fused_head_args_refusal`, then whether this actor's model has a head the fused head can replace."""
    refusal = fused_head_args_refusal(args)
    if refusal:
        return refusal
    from torch import nn

    head = actor.model.get_output_embeddings() if hasattr(actor.model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear) or head.bias is not None:
        return (f"algo.fused_head needs the model's lm_head to be a bias-free linear layer, not {type(head).__name__}; "
                f"{_FUSED_HEAD_FIX}")
    return None


def fused_head_targets(sequences, attention_mask, packed: bool):
    """The target ids of the model's token axis, given its shape: Molt's rolled sequences, and under
    (cp 1) packing the real tokens of the rolled rows padded with 0 to the packed length, as Molt's
    `pack_padded_batch` builds its labels (`CONTRACT`)."""
    import torch
    import torch.nn.functional as F

    rolled = torch.roll(sequences, shifts=-1, dims=1)
    if not packed:
        return lambda tokens: rolled
    real = attention_mask.bool().reshape(-1).nonzero(as_tuple=False).flatten()
    rolled_real = rolled.reshape(-1).index_select(0, real).unsqueeze(0)
    return lambda tokens: F.pad(rolled_real, (0, tokens[-1] - rolled_real.shape[1]))


@contextmanager
def fusing_head(trainer, deliver=None, num_actions: int = 0, ran=None):
    """The trainer's actor forward for one step with the chunked head (fused_head.py) inside Molt's model:
    the model's lm_head returns the sampled-token log-probs instead of the [S, V] logits, and
    `deliver`, if given, receives the action span's entropies [B, A] of the same pass; `ran`, if
    given, is called once the forward's log-probs came from the chunked head.

    Molt's `_forward_backbone` runs unchanged (packing, the model call); the lm_head module is the
    one called, so FSDP2 gathers its weight (or the tied embedding's) around the chunked forward
    and backward as around the plain one. The targets are Molt's own: the rolled sequences, and
    under packing their real tokens (padded as Molt pads them); they are checked against the ones
    `_forward_backbone` returns. The output is what Molt's `Actor.forward` returns without entropy
    or top-k ids: `log_probs` and `action_log_probs` (and the model's other outputs), no logits.
    """
    import torch

    from molt_flashreinforce.fused_head import head_computing_log_probs

    refusal = fused_head_refusal(trainer.args, trainer.actor)
    if refusal:
        raise ValueError(refusal)
    actor = trainer.actor
    head = actor.model.get_output_embeddings()

    def fused_forward(sequences, action_mask=None, attention_mask=None, position_ids=None, cp_context_stack=None,
                      return_entropy=False, routed_experts=None, top_ids=None, **mm_inputs):
        if return_entropy or top_ids is not None:
            raise ValueError("the fused head computes neither a differentiable entropy nor top-k log-probs; "
                             "set algo.fused_head=false")
        targets_for = fused_head_targets(sequences, attention_mask, actor.packing_samples)
        with head_computing_log_probs(head, targets_for, actor.temperature, deliver is not None) as call:
            output, rolled, cp_forward, indices, batch, seqlen = actor._forward_backbone(
                sequences, attention_mask, position_ids, cp_context_stack, mm_inputs, routed_experts=routed_experts)
        if call.targets is None or not torch.equal(call.targets, rolled):
            raise MoltDrift("Molt's model call did not go through its lm_head with the targets Molt rolled; "
                            "set algo.fused_head=false and report this Molt version")

        def restored(per_token):
            return actor._restore_full_sequence(per_token, cp_forward=cp_forward, batch=batch, seqlen=seqlen,
                                                indices=indices)[:, :-1]

        output["log_probs"] = restored(output.pop("logits"))
        if action_mask is not None:
            output["action_log_probs"] = output["log_probs"][:, -action_mask.shape[1]:] * action_mask.float()
        if deliver is not None:
            deliver(restored(call.entropy)[:, -num_actions:])
        if ran is not None:
            ran()
        return output

    actor.forward = fused_forward
    try:
        yield
    finally:
        del actor.forward


def count_as_group_estimator(name: str) -> None:
    """Make Molt merge a rollout's step-samples into one reward before estimator `name` runs: Molt
    gives only its group estimators (`GROUP_ADVANTAGE_ESTIMATORS`) one reward per rollout. Both
    modules hold the set (experience_maker imports it by name)."""
    from molt.trainer.algorithm import advantage
    from molt.trainer.rollout import experience_maker

    merged = advantage.GROUP_ADVANTAGE_ESTIMATORS | {name}
    advantage.GROUP_ADVANTAGE_ESTIMATORS = experience_maker.GROUP_ADVANTAGE_ESTIMATORS = merged


# -- what the rest of the package reads through this module --------------------------------------


def resumable_checkpoint(actor_dir: Path) -> Path | None:
    """What Molt's loader resumes from under `<ckpt.path>/_actor` (None: nothing loadable): Molt
    0.2.1's `CheckpointManager._resolve_ckpt_load_dir` (the `latest` tag when that checkpoint is
    complete, else the newest complete one; complete means `model/` and `extra_state.pt`, written
    last)."""
    if not actor_dir.is_dir():
        return None
    from molt.trainer.fsdp.checkpoint import CheckpointManager

    quiet = CheckpointManager(SimpleNamespace(print=lambda *args, **kwargs: None))
    found = quiet._resolve_ckpt_load_dir(str(actor_dir))
    return Path(found) if found else None


def checkpoint_step(directory: Path | None) -> int:
    """The global step of a Molt checkpoint directory (`global_step<N>`, `best_global_step<N>`); 0 for None."""
    found = _STEP_TAG.search(directory.name) if directory is not None else None
    return int(found.group(1)) if found else 0


def train_rl_ray_main_block() -> tuple[list[ast.stmt], str, dict]:
    """(the statements of Molt's `train_rl_ray` __main__ block, its file, the module's namespace)."""
    import molt.cli.train_rl_ray as train_rl_ray

    check()
    return _main_block(train_rl_ray), inspect.getsourcefile(train_rl_ray), vars(train_rl_ray)


def ray_runtime_env_vars() -> dict[str, str]:
    from molt.cli.train_rl_ray import _ray_runtime_env_vars

    return _ray_runtime_env_vars()


def group_key(sample):
    """The rollout group a finished sample belongs to, as Molt's generator keys it."""
    from molt.trainer.rollout.samples_generator import _sample_group_key

    return _sample_group_key(sample)


def inflight_rollouts(generator) -> list:
    """The rollouts the generator has in flight (none before its first batch)."""
    return generator.__dict__.get("_inflight_rollouts", [])


def finished_samples(generator) -> list:
    """The finished samples the generator holds for its next batch (none before its first batch)."""
    return generator.__dict__.get("_finished_samples", [])


def policy_loss_kwargs(args) -> dict:
    """The keyword arguments Molt's `PolicyTrainer.__init__` builds its `PolicyLoss` with (checked:
    `CONTRACT`), from parsed Molt args."""
    advantage = args.algo.advantage
    return dict(
        clip_eps_low=args.actor.eps_clip_low_high[0],
        clip_eps_high=args.actor.eps_clip_low_high[1],
        dual_clip=args.actor.dual_clip,
        loss_mode=args.actor.loss_mode,
        is_correction_level=advantage.is_correction_level,
        is_correction_mode=advantage.is_correction_mode,
        is_correction_threshold=advantage.is_correction_threshold if advantage.is_correction_level != "off" else None,
        loss_agg_mode=args.actor.loss_agg_mode,
        is_correction_gating=advantage.is_correction_gating,
        score_centering=advantage.score_centering_top_k > 0,
    )


def keep_ray_from_handling_sigterm() -> None:
    """Ray's task loop sets its own SIGTERM handler (one that raises SystemExit) after the setup hook
    has run; in a worker whose signals are the supervisor's, it must not."""
    import ray._private.utils

    ray._private.utils.set_sigterm_handler = lambda handler: None


def rollout_actor_class() -> type:
    """The class `@ray.remote` captured for Molt's vLLM engine actor (`RolloutRayActor`)."""
    from molt.trainer.vllm import vllm_engine

    check()
    return _captured(vllm_engine.RolloutRayActor)


def replace_rollout_actor(actor) -> None:
    """Make Molt's `create_vllm_engines` start `actor` (a Ray actor class) for each engine. Molt is
    checked first: afterwards this process's `RolloutRayActor` is no longer Molt's."""
    from molt.trainer.vllm import vllm_engine

    check()
    vllm_engine.RolloutRayActor = actor


def worker_wrap_class() -> type:
    """Molt's vLLM worker extension (`WorkerWrap`: weight sync and its bookkeeping)."""
    from molt.trainer.vllm.vllm_worker_wrap import WorkerWrap

    check_under(f"{_VLLM}.vllm_worker_wrap.", "molt.utils.distributed_util.")
    return WorkerWrap


def use_weight_sync_factory(factory) -> None:
    """Make `WorkerWrap.init_process_group` build its group with `factory` (the signature of Molt's
    `distributed_util.stateless_init_process_group`), in this process."""
    from molt.utils import distributed_util

    distributed_util.stateless_init_process_group = factory


def model_update_group(worker):
    """The weight-sync group `WorkerWrap.init_process_group` gave `worker`."""
    return worker._model_update_group


def record_loaded_weights(worker, loaded) -> None:
    """`WorkerWrap`'s bookkeeping of what `load_weights` assigned, for `weight_update_missing`."""
    if getattr(worker, "_weight_update_loaded", None) is not None and loaded:
        worker._weight_update_loaded.update(loaded)
