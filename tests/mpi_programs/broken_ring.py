"""Run under mpiexec -n 3: a ring all-reduce that forgets its all-gather phase must be
reported by the comm benchmark as wrong elements, not as a fast result."""

import torch
from mpi4py import MPI

from bench.comm_bench import measure
from tp.comm.ring import RingCommunicator
from tp.comm.transport import MpiTransport
from tp.mpi import abort_on_exception


class ForgetsAllGather(RingCommunicator):
    def _all_gather_in_place(self, x, bounds):
        pass  # the bug: each reduced chunk stays on the rank that reduced it


abort_on_exception()
world = MPI.COMM_WORLD
comm = ForgetsAllGather(MpiTransport(world))
row = measure(comm, "all_reduce", 4096, torch.float32, torch.device("cpu"), world, 2, 1)
if world.Get_rank() == 0:
    print(f"wrong={row['wrong']} of {row['count'] * world.Get_size()}", flush=True)
