"""A CPU rollout engine with the interface Molt uses on `RolloutRayActor` (vLLM's engine actor).

`CpuRolloutEngine(**create_vllm_engines' actor kwargs)` loads the model directory with
transformers and serves, on this machine's loopback only:

* `POST /inference/v1/generate`: vLLM's token-in / token-out route as Molt's
  `RouterGenerateClient` calls it. Sampling is temperature, top-k and top-p over one KV-cached
  forward per token; each token's log-prob is the *processed* one (after temperature and
  truncation), as Molt configures vLLM (`logprobs_mode="processed_logprobs"`).
* `GET /health` (the router's health check) and `GET /v1/models`.

and, as Ray actor methods, the weight-update sequence Molt's refit drives: `pause_generation`
(between tokens: a request in flight keeps its KV cache and continues on the new weights, like
vLLM's keep mode), `begin_weight_update`, `update_weights_packed` (one packed uint8 broadcast
over `weight_sync.GlooBroadcastGroup`, split and copied by Hugging Face parameter name; per-expert
MoE weights go into transformers' fused `gate_up_proj` / `down_proj` tensors, as vLLM's loader
stacks them),
`end_weight_update`, `reset_weight_update_check` / `weight_update_missing`
(`--train.check_weight_update_equal`), `reset_prefix_cache` and `resume_generation`.

`MOLT_FLASHREINFORCE_REHEARSAL_DECODE_DELAY_S` (seconds, default 0) makes every request wait that
long after each token it generates, as a slower GPU's decode would: the rehearsal's knob for
showing a run where generation, not training, is the slower side (e.g. that the policy-lag bound
holds either way). The wait never changes what is sampled.

It refuses what vLLM refuses before a GPU launch would start: a `max_model_len` beyond the
model's `max_position_embeddings` (unless `VLLM_ALLOW_LONG_MAX_MODEL_LEN=1` or an `hf_overrides`
raising it, as vLLM allows), and sampling parameters outside vLLM's ranges (HTTP 400, which
Molt's client treats as fatal). Penalties, min_p and stop strings are not implemented and are
refused rather than ignored, so the returned log-probs always describe the sampling.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
from collections import Counter
from dataclasses import dataclass

import torch

MAX_LOGPROBS = 20  # vLLM's default cap on logprobs per token
# A per-expert checkpoint name, as Molt's refit sends MoE experts (HF checkpoint layout).
_EXPERT_WEIGHT = re.compile(r"^(?P<experts>.+\.mlp\.experts)\.(?P<index>\d+)\.(?P<part>gate_proj|up_proj|down_proj)\.weight$")
SAMPLING_EPS = 1e-5  # below this temperature vLLM samples greedily
DECODE_DELAY_VARIABLE = "MOLT_FLASHREINFORCE_REHEARSAL_DECODE_DELAY_S"


def decode_delay_s(environ=os.environ) -> float:
    text = environ.get(DECODE_DELAY_VARIABLE, "0")
    try:
        delay = float(text)
    except ValueError:
        delay = math.nan
    if not delay >= 0 or math.isinf(delay):
        raise EngineConfigError(f"{DECODE_DELAY_VARIABLE}={text} must be a number of seconds >= 0, e.g. 0.5 (0: no delay)")
    return delay


class EngineConfigError(ValueError):
    """A setting vLLM would refuse at engine start-up."""


class SamplingError(ValueError):
    """A request vLLM would answer with HTTP 400."""


def derived_max_model_len(config, max_model_len: int | None, environ=os.environ) -> int:
    """vLLM's check of `max_model_len` against the model's context; returns the length to use."""
    native = int(config.max_position_embeddings)
    if max_model_len is None:
        return native
    if max_model_len > native and environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        raise EngineConfigError(
            f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={native} in model's config.json). To allow overriding this maximum, "
            "set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 or raise max_position_embeddings through hf_overrides."
        )
    return int(max_model_len)


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    logprobs: int = 1
    min_tokens: int = 0
    seed: int | None = None
    ignore_eos: bool = False

    @classmethod
    def from_request(cls, params: dict) -> "Sampling":
        """vLLM's SamplingParams checks, then the knobs this engine does not implement."""
        params = dict(params)
        for name, neutral in (("repetition_penalty", 1.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("min_p", 0.0)):
            value = params.pop(name, neutral)
            if value is not None and float(value) != neutral:
                raise SamplingError(f"{name}={value} is not implemented by the CPU rehearsal engine; use {neutral}.")
        if params.pop("stop", None) or params.pop("stop_token_ids", None):
            raise SamplingError("stop strings / stop_token_ids are not implemented by the CPU rehearsal engine.")
        for name in ("skip_special_tokens", "detokenize", "spaces_between_special_tokens", "n"):
            if name == "n" and params.get("n", 1) != 1:
                raise SamplingError(f"n={params['n']}: the generate route samples one completion per request.")
            params.pop(name, None)
        unknown = set(params) - set(cls.__dataclass_fields__)
        if unknown:
            raise SamplingError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
        sampling = cls(**{k: v for k, v in params.items() if v is not None})
        if sampling.max_tokens is None or sampling.max_tokens < 1:
            raise SamplingError(f"max_tokens must be at least 1, got {sampling.max_tokens}.")
        if sampling.temperature < 0:
            raise SamplingError(f"temperature must be non-negative, got {sampling.temperature}.")
        if not 0.0 < sampling.top_p <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1], got {sampling.top_p}.")
        if sampling.top_k < -1:
            raise SamplingError(f"top_k must be -1 (disable), or at least 1, got {sampling.top_k}.")
        if not 0 <= sampling.min_tokens <= sampling.max_tokens:
            raise SamplingError(f"min_tokens must be in [0, max_tokens={sampling.max_tokens}], got {sampling.min_tokens}.")
        if not 0 <= sampling.logprobs <= MAX_LOGPROBS:
            raise SamplingError(f"Requested sample logprobs of {sampling.logprobs}, which is greater than max allowed: {MAX_LOGPROBS}")
        return sampling


def processed_log_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[V] float32 log-probs of the distribution a token is drawn from: temperature, then top-k
    and top-p truncation (vLLM's order), renormalised over what is kept."""
    logits = logits.float()
    if sampling.temperature >= SAMPLING_EPS:
        logits = logits / sampling.temperature
    if sampling.top_k not in (-1, 0) and sampling.top_k < logits.numel():
        threshold = torch.topk(logits, sampling.top_k).values[-1]
        logits = logits.masked_fill(logits < threshold, -math.inf)
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= sampling.top_p  # keep the token crossing top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), -math.inf)
    return torch.log_softmax(logits, dim=-1)


class CpuRolloutEngine:
    def __init__(self, model: str, max_model_len: int | None = None, seed: int = 0, dtype: str = "bfloat16",
                 hf_overrides: dict | None = None, **unused_vllm_kwargs) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model)
        for key, value in (hf_overrides or {}).items():
            setattr(config, key, value)
        self.max_model_len = derived_max_model_len(config, max_model_len)
        self.model_path = model
        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(
            model, config=config, dtype=getattr(torch, dtype), attn_implementation="sdpa"
        ).eval()
        self.vocab_size = int(config.vocab_size)
        eos = getattr(self.model.generation_config, "eos_token_id", None) or config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self._eos_index = torch.tensor(sorted(self.eos_ids))
        self._generator = torch.Generator().manual_seed(seed)
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._weights_loaded: set[str] | None = None
        self._slices_loaded: Counter = Counter()
        self._sync_group = None
        self._server = None
        self._decode_delay_s = decode_delay_s()

    # ------------------------------------------------------------------ generation

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> dict:
        if not prompt_ids:
            raise SamplingError("the prompt is empty.")
        if any(not 0 <= t < self.vocab_size for t in prompt_ids):
            bad = next(t for t in prompt_ids if not 0 <= t < self.vocab_size)
            raise SamplingError(f"Token id {bad} is out of vocabulary (size {self.vocab_size}).")
        if len(prompt_ids) + sampling.max_tokens > self.max_model_len:
            raise SamplingError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt_ids) + sampling.max_tokens} tokens ({len(prompt_ids)} in the prompt, "
                f"{sampling.max_tokens} for the completion)."
            )
        generator = self._generator if sampling.seed is None else torch.Generator().manual_seed(sampling.seed)
        tokens, entries, cache, finish = [], [], None, "length"
        next_input = torch.tensor([prompt_ids])
        for _ in range(sampling.max_tokens):
            await self._resumed.wait()  # paused between tokens during a refit
            with torch.no_grad():
                # Only the last position's logits: the prompt's would cost a vocabulary-wide
                # matmul per prompt token and be thrown away.
                out = self.model(input_ids=next_input, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            logits = out.logits[0, -1]
            if len(tokens) < sampling.min_tokens:  # as vLLM: EOS is masked out, so it is never drawn
                logits = logits.index_fill(0, self._eos_index, -math.inf)
            log_probs = processed_log_probs(logits, sampling)
            if sampling.temperature < SAMPLING_EPS:
                token = int(torch.argmax(log_probs))
            else:
                token = int(torch.multinomial(log_probs.exp(), 1, generator=generator))
            tokens.append(token)
            entries.append(self._logprob_entry(token, log_probs, sampling.logprobs))
            next_input = torch.tensor([[token]])
            await asyncio.sleep(self._decode_delay_s)  # let other requests and the refit's RPCs run
            if token in self.eos_ids and not sampling.ignore_eos:
                finish = "stop"
                break
        return {"choices": [{"index": 0, "token_ids": tokens, "logprobs": {"content": entries}, "finish_reason": finish}]}

    @staticmethod
    def _logprob_entry(token: int, log_probs: torch.Tensor, k: int) -> dict:
        entry = {"token": f"token_id:{token}", "token_id": token, "logprob": float(log_probs[token])}
        if k > 1:  # the sampled token leads the row, as vLLM returns it
            others = [int(i) for i in torch.topk(log_probs, k).indices if int(i) != token][: k - 1]
            entry["top_logprobs"] = [
                {"token": f"token_id:{i}", "token_id": i, "logprob": float(log_probs[i])} for i in [token, *others]
            ]
        return entry

    # ------------------------------------------------------------------ HTTP

    async def serve_openai(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start the HTTP server on the loopback (whatever `host` says) and return its URL."""
        from aiohttp import web

        async def generate(request: web.Request) -> web.Response:
            body = await request.json()
            try:
                sampling = Sampling.from_request(body.get("sampling_params") or {})
                return web.json_response(await self.generate(list(body.get("token_ids") or []), sampling))
            except SamplingError as error:
                return web.json_response({"error": {"message": str(error), "type": "BadRequestError", "code": 400}}, status=400)

        async def health(_: web.Request) -> web.Response:
            return web.Response(status=200)

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "policy", "object": "model", "max_model_len": self.max_model_len}]})

        app = web.Application(client_max_size=512 * 1024**2)
        app.add_routes([web.post("/inference/v1/generate", generate), web.get("/health", health), web.get("/v1/models", models)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        self._server = runner
        bound_port = runner.addresses[0][1]
        return f"http://127.0.0.1:{bound_port}"

    async def ready(self) -> bool:
        return True

    # ------------------------------------------------------------------ weight sync

    async def init_process_group(self, master_address, master_port, rank_offset, world_size, group_name, backend=None):
        from molt_flashreinforce.rehearsal.weight_sync import GlooBroadcastGroup

        self._sync_group = await asyncio.to_thread(GlooBroadcastGroup, master_address, master_port, rank_offset, world_size)

    async def pause_generation(self) -> None:
        self._resumed.clear()

    async def resume_generation(self) -> None:
        self._resumed.set()

    async def begin_weight_update(self) -> None:
        assert not self._resumed.is_set(), "begin_weight_update needs pause_generation first"

    async def update_weights_packed(self, metas) -> None:
        sizes = [math.prod(shape) * dtype.itemsize for _, dtype, shape in metas]
        buffer = torch.empty(sum(sizes), dtype=torch.uint8)
        await asyncio.to_thread(self._sync_group.broadcast, buffer, 0)
        with torch.no_grad():
            for (name, dtype, shape), part in zip(metas, buffer.split(sizes)):
                located = self._locate(name)
                if located is None:
                    continue  # like vLLM's load_weights: names the model does not have are ignored
                target_name, target = located
                target.copy_(part.view(dtype).view(*shape))
                self._slices_loaded[target_name] += 1
                if self._weights_loaded is not None and self._slices_loaded[target_name] % self._slices_per_param(target_name) == 0:
                    self._weights_loaded.add(target_name)

    def _locate(self, name: str) -> tuple[str, torch.Tensor] | None:
        """(parameter name, the tensor or slice of it that weight `name` fills), or None."""
        params = dict(self.model.named_parameters())
        if name in params:
            return name, params[name]
        expert = _EXPERT_WEIGHT.match(name)
        if expert is None:
            return None
        index, part = int(expert["index"]), expert["part"]
        fused = f"{expert['experts']}.{'down_proj' if part == 'down_proj' else 'gate_up_proj'}"
        if fused not in params:
            return None
        tensor = params[fused][index]
        if part != "down_proj":  # gate rows first, then up rows
            half = tensor.shape[0] // 2
            tensor = tensor[:half] if part == "gate_proj" else tensor[half:]
        return fused, tensor

    def _slices_per_param(self, name: str) -> int:
        """How many received weights make up parameter `name` (experts x halves when fused)."""
        if name.endswith(".mlp.experts.gate_up_proj"):
            return 2 * self.model.get_parameter(name).shape[0]
        if name.endswith(".mlp.experts.down_proj"):
            return self.model.get_parameter(name).shape[0]
        return 1

    async def end_weight_update(self) -> None:
        return None

    async def reset_weight_update_check(self) -> None:
        self._weights_loaded = set()
        self._slices_loaded = Counter()

    async def weight_update_missing(self) -> list[str] | None:
        loaded, self._weights_loaded = self._weights_loaded, None
        if not loaded:
            return None
        held = {name for name, param in self.model.named_parameters() if param.is_floating_point()}
        return sorted(held - loaded)

    async def reset_prefix_cache(self) -> bool:
        return True  # no cache outlives a request here


def ray_actor_class():
    """`CpuRolloutEngine` as a Ray actor class, the stand-in for `vllm_engine.RolloutRayActor`."""
    import ray

    return ray.remote(CpuRolloutEngine)
