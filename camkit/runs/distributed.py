"""Sharding an audit over ``torchrun`` processes with ``torch.distributed``.

Run the same command under ``torchrun`` and each process (rank) audits a disjoint shard:
the images still to do, in their fixed order, every ``WORLD_SIZE``-th one starting at
``RANK``. Each rank writes its own result files; rank 0 waits for all, merges them and
writes ``results.csv``, ``summary.json`` and ``report.html``. The results are those of a
one-process run. The backend is ``gloo`` on the CPU and ``nccl`` on CUDA (each rank then
uses ``cuda:LOCAL_RANK``)::

    # one machine, 4 processes
    torchrun --nproc_per_node 4 -m camkit audit DATA --model ... --out DIR
    # two machines with 8 GPUs each: run on both, node_rank 0 and 1; DIR on a shared file system
    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 --master_addr HOST0 --master_port 29500 \\
        -m camkit audit DATA --model ... --out DIR

Every node must see ``DATA`` and ``DIR`` at the same paths (a shared file system).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DistContext"]


@dataclass
class DistContext:
    """This process's place in the run: ``rank`` of ``world`` (``world == 1`` alone).

    Example:
        >>> import torch
        >>> from camkit.runs.distributed import DistContext
        >>> ctx, device = DistContext.start(torch.device("cpu"), env={})
        >>> ctx.rank, ctx.world, ctx.broadcast("same"), device
        (0, 1, 'same', device(type='cpu'))
    """

    rank: int = 0
    world: int = 1
    owns_group: bool = False

    @classmethod
    def start(cls, device: torch.device, env: dict[str, str] | None = None) -> tuple[DistContext, torch.device]:
        """Join the process group that ``torchrun`` describes in the environment, if any.

        Returns the context and the device this rank should use. A group the caller
        already initialised is used as is (and not destroyed by :meth:`finish`).
        """
        env = dict(os.environ) if env is None else env
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), False), cls._local_device(device, env)
        world = int(env.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls(), device
        device = cls._local_device(device, env)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)
        return cls(dist.get_rank(), dist.get_world_size(), True), device

    @staticmethod
    def _local_device(device: torch.device, env: dict[str, str]) -> torch.device:
        if device.type == "cuda" and device.index is None and "LOCAL_RANK" in env:
            return torch.device("cuda", int(env["LOCAL_RANK"]))
        return device

    @property
    def main(self) -> bool:
        """True on rank 0, which merges the results and writes the report."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait for every rank (no-op alone)."""
        if self.world > 1:
            dist.barrier()

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (a picklable object)."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def finish(self) -> None:
        """Leave the process group if this context created it."""
        if self.owns_group and dist.is_initialized():
            if self.world > 1:
                # Every rank done with the last collective before any rank tears the group down:
                # gloo aborts a process ("terminate called without an active exception") when a
                # peer destroys the group while an exchange with it is still in flight.
                dist.barrier()
            dist.destroy_process_group()
