"""Process-group setup and model wrapping for ``torchrun`` launches. No home-made communication:
DistributedDataParallel or FSDP (``fully_shard``) do the gradient traffic, ``torch.distributed``
collectives do the rest.

A plain ``python``/``tokenmix`` launch is world size 1 and uses none of this.

A rank never outlives its launcher: ``torchrun`` starts each rank in a session of its own, so a
launcher killed outright (SIGKILL, an out-of-memory kill) takes no rank with it, and the ranks, which
talk to each other and not to it, would train on. Each rank started by ``torchrun`` (its elastic
agent, recognised by ``TORCHELASTIC_RUN_ID``) therefore ends when its parent does
(``core/processes.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from tokenmix.core.errors import InputError
from tokenmix.core.processes import die_with_parent


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    initialized_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Sum a few scalars over ranks (float64 so that sums of losses are exact enough)."""
        if not self.distributed:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(t)
        return t.tolist()

    def broadcast_object(self, obj):
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if self.initialized_here and dist.is_initialized():
            dist.destroy_process_group()


def setup_distributed(device: str = "auto") -> DistContext:
    """Read torchrun's environment (WORLD_SIZE, RANK, LOCAL_RANK); join the process group when > 1.

    Backend: nccl when the ranks run on CUDA devices, gloo on CPU.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise InputError("train.device=cuda but no CUDA device is available")
    dev = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world <= 1:
        return DistContext(0, 1, 0, dev, False)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank of torchrun: it stops when its launcher dies
        die_with_parent(os.getppid())
    initialized_here = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        initialized_here = True
    return DistContext(rank, world, local_rank, dev, initialized_here)


def wrap_model(model: nn.Module, ctx: DistContext, parallel: str) -> nn.Module:
    """DDP (every rank holds the whole model, gradients all-reduced) or FSDP (parameters, gradients
    and optimizer state sharded per block). World size 1 returns the model unchanged."""
    if not ctx.distributed:
        return model
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)  # the root unit holds the embedding, final norm and (tied) head
        return model
    raise InputError(f"train.parallel must be 'ddp' or 'fsdp', got '{parallel}'")
