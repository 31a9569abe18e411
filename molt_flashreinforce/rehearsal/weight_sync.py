"""The trainer -> engine weight broadcast over gloo, in place of vLLM's PyNccl communicator.

Molt's refit (`PolicyModelActor.broadcast_to_vllm`) calls `group.broadcast(tensor, src=0,
stream=...)` on what `stateless_init_process_group(address, port, rank, world_size, device)`
returned; the engine receives into a buffer of the same size. `GlooBroadcastGroup` is that
object: its own TCPStore and ProcessGroupGloo, separate from the trainer's FSDP world, exactly
as vLLM's `StatelessProcessGroup` is separate from it.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(minutes=10)


class GlooBroadcastGroup:
    def __init__(self, host: str, port: int, rank: int, world_size: int) -> None:
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=TIMEOUT)
        self._group = dist.ProcessGroupGloo(dist.PrefixStore("weight_sync", store), rank, world_size, TIMEOUT)
        self.rank, self.world_size = rank, world_size

    def broadcast(self, tensor: torch.Tensor, src: int, stream=None) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = src
        self._group.broadcast([tensor], options).wait()


def stateless_init_process_group(master_address, master_port, rank, world_size, device) -> GlooBroadcastGroup:
    """Molt's `distributed_util.stateless_init_process_group`, over gloo (`device` is unused)."""
    return GlooBroadcastGroup(master_address, master_port, rank, world_size)
