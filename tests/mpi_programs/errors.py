"""Run under mpiexec -n 2: every bad call raises a clear error before any rank communicates
(so catching it on all ranks keeps the job consistent). Rank 0 prints OK and the count."""

import sys

import pytest
import torch
from mpi4py import MPI

from tp.comm import create
from tp.layers import ColumnParallelLinear, RowParallelLinear
from tp.mpi import abort_on_exception

abort_on_exception()
world = MPI.COMM_WORLD
checked = 0


def expect_error(kind, match, fn):
    global checked
    with pytest.raises(kind, match=match):
        fn()
    checked += 1


for name in ("mpi", "ring"):
    comm = create(name, world)
    x = torch.ones(6, 4)
    expect_error(ValueError, "must be contiguous", lambda: comm.all_reduce(x.t()))
    expect_error(ValueError, "multiple of the 2 ranks",
                 lambda: comm.reduce_scatter(torch.ones(3, 2)))
    expect_error(ValueError, "multiple of the 2 ranks", lambda: comm.all_to_all(torch.ones(5)))
    expect_error(ValueError, "out must be a contiguous torch.float32 tensor of shape",
                 lambda: comm.all_gather(x, out=torch.empty(6, 4)))
    expect_error(ValueError, "out must be",
                 lambda: comm.all_reduce(x, out=torch.empty(6, 4).double()))
    expect_error(ValueError, "out must not overlap the input", lambda: comm.all_to_all(
        x, out=x))
    gathered = torch.empty(12, 4)
    expect_error(ValueError, "out must not overlap the input", lambda: comm.all_gather(
        gathered[:6], out=gathered))
    expect_error(ValueError, "out must not overlap the input", lambda: comm.reduce_scatter(
        gathered, out=gathered[6:]))
    expect_error(ValueError, r"out must not overlap the input in memory \(it may be the input",
                 lambda: comm.all_reduce(gathered[:6], out=gathered[3:9]))
    expect_error(ValueError, "root=5 is not a valid peer", lambda: comm.broadcast(x, 5))
    me = world.Get_rank()
    expect_error(ValueError, f"dst={me} is not a valid peer of rank {me}", lambda: comm.send(x, me))
    expect_error(ValueError, "stream= applies to CUDA tensors only",
                 lambda: comm.all_reduce(x, stream=object()))
    expect_error(TypeError, "expected a torch.Tensor, got list", lambda: comm.all_reduce([1.0]))
    if name == "mpi":
        expect_error(TypeError, "mpi cannot sum torch.float16", lambda: comm.all_reduce(x.half()))
    # Ranks that disagree on a call: every rank raises, before any data moves.
    expect_error(ValueError, r"disagree on the call \(rank 0: all_gather float32 \(3,\); "
                 r"rank 1: all_gather float32 \(4,\)\)",
                 lambda: comm.all_gather(torch.ones(3 + me)))
    same_bytes = torch.ones(4, dtype=(torch.float32, torch.int32)[me])
    expect_error(ValueError, "rank 0: all_reduce float32 .*rank 1: all_reduce int32",
                 lambda: comm.all_reduce(same_bytes))
    expect_error(ValueError, "rank 0: broadcast float32 \\(4,\\) root 0; rank 1: .* root 1",
                 lambda: comm.broadcast(torch.ones(4), me))
    expect_error(ValueError, "rank 0: all_reduce .*rank 1: all_gather",
                 lambda: (comm.all_reduce, comm.all_gather)[me](torch.ones(4)))
    expect_error(ValueError, "disagree on the call",
                 lambda: comm.reduce_scatter(torch.ones(4 + 2 * me)))
    # A layer issues as many collectives on every rank, empty chunks included: ranks whose
    # tokens differ meet the call check (not a chunk of one paired with a later call).
    for layer in (RowParallelLinear(8, 1, comm, overlap=False, chunks=4),
                  ColumnParallelLinear(4, 2, comm, overlap=False, chunks=4,
                                       sequence_parallel=True)):
        expect_error(ValueError, r"disagree on the call \(rank 0: \w+ float32 \(1, \d\); "
                     r"rank 1: \w+ float32 \(0, \d\)\)",
                     lambda: layer(torch.ones(3 - me, layer.weight.shape[0])))
    # Nothing moved: the communicator still works, and the results are right.
    assert comm.all_gather(torch.ones(0, 4)).shape == (0, 4)  # empty: agreed, nothing moves
    assert comm.reduce_scatter(torch.ones(0)).shape == (0,)
    ones = torch.ones(4)
    assert torch.equal(comm.all_reduce(ones, out=ones), torch.full((4,), 2.0))  # in place
    ones = torch.ones(4)
    assert torch.equal(comm.all_reduce(ones), torch.full((4,), 2.0))
    comm.close()
expect_error(ValueError, "unknown communicator 'gloo'; known: mpi, ring", lambda: create("gloo"))
expect_error(ValueError, "nccl needs a CUDA device", lambda: create("nccl", world, "cpu"))
expect_error(ValueError, "ring/nccl needs a CUDA device", lambda: create("ring/nccl", world, "cpu"))
total = world.allreduce(checked)
if world.Get_rank() == 0:
    print(f"OK {total} errors raised as expected", flush=True)
sys.exit(0)
