"""Run under mpiexec -n 2 with GEMMLAB_EXIT_TIMEOUT=1: rank 0 takes 3 s to write its results
(a slow chart) while rank 1 has nothing to write. The Recorder's finish keeps rank 1 until
rank 0 has written, so the ranks reach their exit together and the job ends normally;
without that wait rank 1's exit guard would abort the job while rank 0 still writes.
Usage: slow_writer.py OUT"""

import sys
import time

from mpi4py import MPI

from bench.recording import Recorder
from tp.mpi import abort_on_exception


def slow_plot(rows, path):
    time.sleep(3)
    path.write_bytes(b"\x89PNG")


abort_on_exception()
rank = MPI.COMM_WORLD.Get_rank()
recorder = Recorder(sys.argv[1], slow_plot, comm=MPI.COMM_WORLD)
recorder.add({"rank": rank})
paths = recorder.finish()
print(f"rank {rank} finished, {len(paths)} files written", flush=True)
