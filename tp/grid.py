"""The DP x TP process grid, model-major, and how data is sharded over DP.

World ranks are laid out model-major: the TP group of a rank is a block of ``tp``
consecutive ranks, so tensor-parallel traffic (the heaviest) stays between neighbouring
ranks, usually the GPUs of one node (Megatron-LM's default order, Shoeybi et al. 2019,
arXiv:1909.08053, sec. 3). With world size P = dp * tp:

    dp_rank = rank // tp        tp_rank = rank % tp
    TP group of rank r: [dp_rank * tp, dp_rank * tp + tp)
    DP group of rank r: {tp_rank + j * tp for j in range(dp)}

Everything follows from (rank, tp, P) alone, so every rank builds the same grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")


def check_grid(world_size: int, tp: int) -> int:
    """DP size for ``world_size`` ranks split into TP groups of ``tp``.

    Raises:
        ValueError: ``tp`` < 1, or ``tp`` does not divide the world size.
    """
    if tp < 1 or world_size % tp != 0:
        raise ValueError(f"TP size {tp} must be >= 1 and divide the world size {world_size} "
                         f"(DP x TP = world size)")
    return world_size // tp


def coords(rank: int, tp: int) -> tuple[int, int]:
    """(dp_rank, tp_rank) of world ``rank`` in a model-major grid with TP size ``tp``."""
    return rank // tp, rank % tp


def tp_group(rank: int, tp: int) -> list[int]:
    """World ranks of the TP group holding ``rank``: a block of consecutive ranks."""
    start = (rank // tp) * tp
    return list(range(start, start + tp))


def dp_group(rank: int, tp: int, world_size: int) -> list[int]:
    """World ranks of the DP group holding ``rank``: same tp_rank, stride ``tp``."""
    return list(range(rank % tp, world_size, tp))


@dataclass(frozen=True)
class ProcessGrid:
    """A rank's place in the DP x TP grid and its two sub-communicators.

    Attributes:
        world: the communicator the grid was cut from (usually ``MPI.COMM_WORLD``).
        dp, tp: grid sizes; ``dp * tp == world.Get_size()``.
        rank, dp_rank, tp_rank: this process's coordinates.
        tp_comm: mpi4py communicator over this rank's TP group (rank order = tp_rank).
        dp_comm: mpi4py communicator over this rank's DP group (rank order = dp_rank).
    """

    world: MPI.Comm
    dp: int
    tp: int
    rank: int
    dp_rank: int
    tp_rank: int
    tp_comm: MPI.Comm
    dp_comm: MPI.Comm

    @classmethod
    def create(cls, tp: int, world: MPI.Comm | None = None) -> ProcessGrid:
        """Split ``world`` (default ``MPI.COMM_WORLD``) into TP and DP groups; collective.

        Raises:
            ValueError: ``tp`` does not divide the world size (raised on every rank alike).
        """
        from mpi4py import MPI

        world = MPI.COMM_WORLD if world is None else world
        rank, size = world.Get_rank(), world.Get_size()
        dp = check_grid(size, tp)
        dp_rank, tp_rank = coords(rank, tp)
        tp_comm = world.Split(color=dp_rank, key=tp_rank)
        dp_comm = world.Split(color=tp_rank, key=dp_rank)
        return cls(world, dp, tp, rank, dp_rank, tp_rank, tp_comm, dp_comm)


def split_data(data: Sequence[T], dp_rank: int, dp_size: int) -> Sequence[T]:
    """This DP rank's contiguous shard of ``data`` (a sequence, array or tensor, along dim 0).

    Every rank gets ``len(data) // dp_size`` items: rank d gets items
    ``[d * q, (d + 1) * q)``. The ``len(data) % dp_size`` items left at the end are dropped,
    so all DP ranks see equally many items and stay in lockstep (as
    ``torch.utils.data.DistributedSampler(drop_last=True)`` does).

    Raises:
        ValueError: ``dp_size`` < 1, ``dp_rank`` outside ``[0, dp_size)``, or fewer items than
            DP ranks (some rank would get nothing).
    """
    if dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank {dp_rank} is not in [0, {dp_size})")
    per_rank = len(data) // dp_size
    if per_rank == 0 and len(data) > 0:
        raise ValueError(f"{len(data)} items cannot be split over {dp_size} DP ranks")
    return data[dp_rank * per_rank:(dp_rank + 1) * per_rank]
