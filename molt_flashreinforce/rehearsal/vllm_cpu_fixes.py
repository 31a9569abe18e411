"""Fixes for vLLM's CPU build that the rehearsal's engine applies from the outside.

    repack_cpu_moe_on_refit(model) -> int          before a refit: the reload re-packs MoE experts
    repack_tied_lm_head(model, model_config) -> bool   after a refit: a tied lm_head's packed copy is rebuilt

A tied lm_head: vLLM's CPU build keeps a packed copy of the head's weight
(`dispatch_cpu_unquantized_gemm`), and a tied head receives no weight in a refit, so the layer-wise
reload leaves the old copy ("ParallelLMHead: Failed to load weights") and the engine samples from
the new body and the old head (tests/test_rehearsal_vllm_worker.py). GPU builds read the weight itself.

MoE experts:

vLLM 0.32.0 (the version Molt pins) packs an unquantized MoE layer's experts for its CPU
kernel only on the first load: `UnquantizedFusedMoEMethod._setup_kernel` runs the experts'
`process_weights_after_loading` (the CPU grouped-gemm prepack of `w13_weight`/`w2_weight`)
inside `if not is_weight_update:`. A refit through vLLM's layer-wise reload (what Molt's
`WorkerWrap` does) reloads the checkpoint-layout weights, skips the prepack and copies them into
the packed tensors' storage, which has the same shape; the CPU MoE kernel then reads plain rows
as packed blocks and the log-probs drift, even when the same weights are sent again. GPU kernels
are unaffected: their experts do nothing in that step. The full account and a reproduction are
in docs/vllm-cpu-moe-refit.md and scripts/repro_vllm_cpu_moe_refit.py.
"""

from __future__ import annotations

import torch

_WRAPPED = "_molt_flashreinforce_repacks_on_refit"


def repack_cpu_moe_on_refit(model: torch.nn.Module) -> int:
    """Make every later weight reload of `model` re-pack its CPU MoE experts; returns how many
    MoE layers are covered (0 for a model without unquantized CPU MoE layers).

    Call it in the engine's worker once the model has loaded, before the first refit; calling
    it again (say at every `begin_weight_update`) changes nothing. It wraps each such layer's
    `quant_method.process_weights_after_loading`, which vLLM's layer-wise reload calls once the
    layer's new weights are in (`model_loader/reload/layerwise.py`, `_layerwise_process`): after
    vLLM's own step, the experts' packing step runs on the freshly loaded weights, unless vLLM
    ran it itself, so a vLLM that fixes this is not packed twice. It is not a repair to run
    after a refit: weights that a refit already left unpacked stay wrong until the next refit.
    """
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    covered = 0
    for layer in model.modules():
        method = getattr(layer, "quant_method", None)
        if not isinstance(method, UnquantizedFusedMoEMethod) or method.moe_kernel is None:
            continue
        if not isinstance(method.moe_kernel.fused_experts, CPUUnquantizedExperts):
            continue
        if not getattr(method, _WRAPPED, False):
            _pack_after_processing(method)
        covered += 1
    return covered


def _pack_after_processing(method) -> None:
    from vllm.model_executor.utils import is_weights_pre_processed

    process = method.process_weights_after_loading

    def process_then_pack(layer: torch.nn.Module) -> None:
        experts = method.moe_kernel.fused_experts
        pack = experts.process_weights_after_loading
        packed_by_vllm = False

        def pack_and_note(packed_layer: torch.nn.Module) -> None:
            nonlocal packed_by_vllm
            packed_by_vllm = True
            pack(packed_layer)

        experts.process_weights_after_loading = pack_and_note
        try:
            process(layer)
        finally:
            del experts.process_weights_after_loading
        # Pre-processed weights arrive already packed; vLLM only rebuilds the kernel for them.
        if not packed_by_vllm and not is_weights_pre_processed():
            method.moe_kernel.fused_experts.process_weights_after_loading(layer)

    method.process_weights_after_loading = process_then_pack
    setattr(method, _WRAPPED, True)


def repack_tied_lm_head(model, model_config) -> bool:
    """Re-run the lm_head's post-load processing where vLLM's CPU build packed a copy of a tied head;
    True if it did."""
    from vllm.platforms import current_platform

    head = getattr(model, "lm_head", None)
    tied = getattr(model_config.hf_text_config, "tie_word_embeddings", False)
    if not (current_platform.is_cpu() and tied and head is not None and hasattr(head, "quant_method")):
        return False
    head.quant_method.process_weights_after_loading(head)
    return True
