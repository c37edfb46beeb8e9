"""Run under mpiexec: ``--mode raise`` makes rank 1 raise while the others wait in an
all-reduce; ``--mode mismatch`` makes the ranks disagree on the size; ``--mode p2p`` sends
float32 to a receive of int32; ``--mode exit`` makes rank 1 call ``sys.exit(--code)`` between
two all-reduces; ``--mode async`` makes the ranks disagree on an unchecked asynchronous
all-reduce whose handle is never waited; ``--mode late`` makes rank 0 finish two seconds
after the others (a normal end). Each failing way the job must abort (non-zero exit)
instead of hanging."""

import argparse
import sys
import time

import torch
from mpi4py import MPI

from tp.comm import create
from tp.mpi import abort_on_exception

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("raise", "mismatch", "p2p", "exit", "async", "late"))
parser.add_argument("--code", type=int, default=3)
parser.add_argument("--backend", default="ring")
parser.add_argument("--stamp", help="modes async and exit: the file STAMP.<rank> gets the "
                    "time (time.time()) just before the rank's failing step")
args = parser.parse_args()
abort_on_exception()
rank = MPI.COMM_WORLD.Get_rank()


def stamp():
    if args.stamp:
        with open(f"{args.stamp}.{rank}", "w") as f:
            f.write(repr(time.time()))


comm = create(args.backend, MPI.COMM_WORLD, check=args.mode != "async")
if args.mode == "raise" and rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
if args.mode == "p2p":
    if rank == 0:
        comm.send(torch.ones(1000), 1)
    elif rank == 1:
        comm.recv(torch.empty(1000, dtype=torch.int32), 0)
if args.mode == "async":
    stamp()
    comm.all_reduce(torch.ones(1000 + 100 * rank), async_op=True)  # never waited
    time.sleep(60)
if args.mode == "exit":
    comm.all_reduce(torch.ones(10))
    if rank == 1:
        stamp()
        sys.exit(args.code)
comm.all_reduce(torch.ones(1000 + (100 * rank if args.mode == "mismatch" else 0)))
if args.mode == "late" and rank == 0:
    time.sleep(2)
print(f"rank {rank} finished", flush=True)
