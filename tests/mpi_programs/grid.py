"""Run under mpiexec -n 4: ProcessGrid.create for DP x TP = 2 x 2 and 1 x 4 (and 4 x 1)
matches the model-major layout; a TP size that does not divide the world is a ValueError on
every rank. Rank 0 prints one line per grid."""

from mpi4py import MPI

from tp.grid import ProcessGrid, dp_group, tp_group
from tp.mpi import abort_on_exception

abort_on_exception()
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
for tp in (2, 4, 1):
    grid = ProcessGrid.create(tp)
    assert (grid.dp, grid.tp) == (size // tp, tp)
    assert (grid.dp_rank, grid.tp_rank) == (rank // tp, rank % tp)
    assert grid.tp_comm.allgather(rank) == tp_group(rank, tp), grid.tp_comm.allgather(rank)
    assert grid.dp_comm.allgather(rank) == dp_group(rank, tp, size)
    assert grid.tp_comm.Get_rank() == grid.tp_rank and grid.dp_comm.Get_rank() == grid.dp_rank
    layout = world.gather((grid.dp_rank, grid.tp_rank))
    if rank == 0:
        print(f"OK DP x TP = {grid.dp} x {grid.tp}: {layout}", flush=True)
try:
    ProcessGrid.create(3)
except ValueError as exc:
    errors = world.allgather(str(exc))
    if rank == 0:
        print(f"OK tp=3 rejected on all ranks: {errors[0]}", flush=True)
else:
    raise AssertionError("tp=3 on 4 ranks was accepted")
