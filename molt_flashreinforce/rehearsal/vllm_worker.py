"""Molt's vLLM worker extension (`WorkerWrap`) with the CPU's transport, for `rehearsal.engine=vllm`.

`CpuWorkerWrap` is the `worker_extension_cls` the rehearsal's engine actor names
(`rehearsal.vllm_actor`); vLLM mixes it into its worker process. Everything of Molt's `WorkerWrap`
runs (the layer-wise reload in `begin_weight_update` / `end_weight_update`, `load_weights` and its
"loaded 0 weights" warning, the coverage check of `reset_weight_update_check` /
`weight_update_missing`) except what is CUDA-bound in it:

* `init_process_group` builds the weight-sync group with `weight_sync.stateless_init_process_group`
  (gloo) instead of PyNccl, which disables itself on a CPU and then receives nothing;
* `update_weights_packed` receives the packed broadcast into a CPU buffer, without a CUDA stream,
  then loads it exactly as Molt's does (the lines repeated are checked: `seams.WORKER_LOAD`);
* two vLLM CPU bugs are worked around (`rehearsal.vllm_cpu_fixes`): `begin_weight_update` makes the
  reload re-pack MoE experts, `end_weight_update` re-packs a tied lm_head.

For the refit check (`rehearsal.vllm_actor`), it keeps a copy of the weights each refit sent, and
`refit_reference(tokens)` returns the log-prob of each token of `tokens` after the ones before it
under exactly those weights, by Hugging Face's float32 forward of the model's own class.
"""

from __future__ import annotations

import math

import torch

from molt_flashreinforce.plugin import seams
from molt_flashreinforce.rehearsal import weight_sync
from molt_flashreinforce.rehearsal.vllm_cpu_fixes import repack_cpu_moe_on_refit, repack_tied_lm_head


class CpuWorkerWrap(seams.worker_wrap_class()):
    def init_process_group(self, master_address, master_port, rank_offset, world_size, group_name, backend="nccl"):
        seams.use_weight_sync_factory(weight_sync.stateless_init_process_group)
        return super().init_process_group(master_address, master_port, rank_offset, world_size, group_name, backend)

    def begin_weight_update(self):
        self._sent = {}
        repack_cpu_moe_on_refit(self.model_runner.model)  # before the reload it corrects (vllm_cpu_fixes)
        return super().begin_weight_update()

    def update_weights_packed(self, metas):
        from vllm.config import set_current_vllm_config

        sizes = [math.prod(shape) * dtype.itemsize for _, dtype, shape in metas]
        buffer = torch.empty(sum(sizes), dtype=torch.uint8)
        seams.model_update_group(self).broadcast(buffer, src=0)
        weights = [(name, part.view(dtype).view(*shape)) for (name, dtype, shape), part in zip(metas, buffer.split(sizes))]
        with set_current_vllm_config(self.vllm_config):
            loaded = self.model_runner.model.load_weights(weights=weights)
        seams.record_loaded_weights(self, loaded)
        self._sent.update((name, weight.clone()) for name, weight in weights)
        if loaded is not None and len(loaded) == 0 and weights:
            print(f"[refit] WARNING: vLLM loaded 0 of {len(weights)} refit weights in a flush (names unrecognized -> "
                  f"dropped, rollout stays stale); sample sent: {[name for name, _ in weights][:10]}", flush=True)

    def end_weight_update(self):
        super().end_weight_update()
        repack_tied_lm_head(self.model_runner.model, self.model_config)

    def refit_reference(self, tokens: list[int]) -> list[float]:
        from transformers import AutoConfig, AutoModelForCausalLM

        if getattr(self, "_reference", None) is None:
            config = AutoConfig.from_pretrained(self.model_config.model)
            self._reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        missing, unexpected = self._reference.load_state_dict(self._sent, strict=False)
        tied = {"lm_head.weight"} if self._reference.config.tie_word_embeddings else set()
        if unexpected or set(missing) - tied:
            raise ValueError(f"the refit sent weights the model does not have ({sorted(unexpected)[:3]}) or left out "
                             f"some of its own ({sorted(set(missing) - tied)[:3]})")
        with torch.no_grad():
            logits = self._reference(input_ids=torch.tensor([tokens])).logits[0, :-1].float()
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens[1:])[:, None]).squeeze(1).tolist()
