"""Data-parallel training in the runner: one rank's place in the job, and how its "sync" phase is timed
(docs/multi-rank.md, "What sync is, and how it is measured").

- Real DDP (:class:`SyncTimer`): a communication hook notes when the last bucket's gradients are ready; the
  phase "compute/sync" runs from then to the return of ``backward()`` (host-timed, nested in compute).
- A simulated device (:func:`sim_sync`): the ranks agree on when the slowest one's simulated backward ends
  (a real ``all_reduce(MAX)``), and the simulated device queues the exposed all-reduce after it; the top-level
  phase "sync" covers both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch._C._distributed_c10d import GradBucket  # torch.distributed re-exports it without a type
    from torch.distributed import ProcessGroup
    from torch.nn.parallel import DistributedDataParallel

    from profiler.runs.session import Session
    from profiler.sim.device import SimDevice

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True, slots=True)
class DistInfo:
    """This process's place in a data-parallel job (torch.distributed's environment: RANK, WORLD_SIZE, ...)."""

    rank: int
    world_size: int
    local_rank: int = 0
    node_rank: int = 0
    nnodes: int = 1
    backend: str = "gloo"
    job_id: str = ""

    @classmethod
    def from_env(cls, *, backend: str, job_id: str = "", env: dict[str, str] | None = None) -> DistInfo:
        """From the variables torch.distributed's elastic launcher sets for each worker."""
        e = os.environ if env is None else env
        world, local_world = int(e["WORLD_SIZE"]), int(e.get("LOCAL_WORLD_SIZE", e["WORLD_SIZE"]))
        return cls(
            rank=int(e["RANK"]),
            world_size=world,
            local_rank=int(e.get("LOCAL_RANK", "0")),
            node_rank=int(e.get("GROUP_RANK", "0")),
            nnodes=max(1, world // max(1, local_world)),
            backend=backend,
            job_id=job_id,
        )

    def to_meta(self) -> dict[str, int | str]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "node_rank": self.node_rank,
            "nnodes": self.nnodes,
            "backend": self.backend,
            "job_id": self.job_id,
        }


class SyncTimer:
    """DDP communication hook that times the all-reduce wait backward does not hide (see the module)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.last_ready: float | None = None

    def hook(self, state: ProcessGroup, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self.last_ready = self._clock()  # this bucket's gradients are all computed
        return allreduce_hook(state, bucket)

    def start_step(self) -> None:
        """Forget the previous step's bucket; ``last_ready`` is then this step's (None: no hook ran)."""
        self.last_ready = None


def wrap_ddp(
    model: torch.nn.Module, dist_info: DistInfo, device: str, clock: Callable[[], float]
) -> tuple[DistributedDataParallel, SyncTimer]:
    """``model`` under DistributedDataParallel (CPU: no device ids; CUDA: this rank's device) with the
    :class:`SyncTimer` hook registered."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device] if device.startswith("cuda") else None
    ddp = DistributedDataParallel(model, device_ids=ids)
    timer = SyncTimer(clock)
    # DDP checks a hook's annotations against its own types: a lambda has none to check
    ddp.register_comm_hook(None, lambda state, bucket: timer.hook(state, bucket))  # noqa: PLW0108
    return ddp, timer


def sim_sync(session: Session, sim: SimDevice, world_size: int) -> None:
    """One simulated step's gradient all-reduce, in the top-level phase "sync" (see the module)."""
    import torch
    import torch.distributed as dist

    with session.phase("sync"):
        done = sim.tail()  # when this rank's simulated backward ends, on the device's clock
        offset = time.time() - sim.clock()  # ranks on several nodes share wall time, not perf_counter
        slowest = torch.tensor([done + offset], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        sim.allreduce(world_size, not_before=float(slowest.item()) - offset)
