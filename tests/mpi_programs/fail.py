"""Run under mpiexec: ``--mode raise`` makes rank 1 raise while the others wait in an
all-reduce; ``--mode mismatch`` makes the ranks disagree on the size. Either way the job
must abort (non-zero exit) instead of hanging."""

import argparse

import torch
from mpi4py import MPI

from tp.comm import create
from tp.mpi import abort_on_exception

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("raise", "mismatch"))
parser.add_argument("--backend", default="ring")
args = parser.parse_args()
abort_on_exception()
rank = MPI.COMM_WORLD.Get_rank()
comm = create(args.backend, MPI.COMM_WORLD)
if args.mode == "raise" and rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
comm.all_reduce(torch.ones(1000 + (100 * rank if args.mode == "mismatch" else 0)))
print(f"rank {rank} finished", flush=True)
