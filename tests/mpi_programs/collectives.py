"""Run under mpiexec: every operation of every given communicator against a numpy reference.

    mpiexec -n P python tests/mpi_programs/collectives.py --comm mpi,ring --device cpu

Each rank's input is small integers in [-2, 2] derived from (rank, element, salt), so every
sum is exact in every dtype and the reference is computed exactly in int64 with numpy.
Any mismatch raises, which aborts the job; rank 0 prints one line per backend on success.
"""

import argparse

import numpy as np
import torch
from mpi4py import MPI

from backends.dtypes import COMM, DTYPES
from tp.comm import create
from tp.mpi import abort_on_exception, bind_device

COMM_DTYPES = [DTYPES[name].torch for name in COMM]  # every dtype gemmlab comm sweeps


def rank_input(rank, shape, dtype, device, salt):
    n = int(np.prod(shape))
    values = (np.arange(n, dtype=np.int64) * 7 + rank * 13 + salt) % 5 - 2
    return torch.from_numpy(values.reshape(shape)).to(device=device, dtype=dtype), values


def expect(name, got, want):
    got = got.cpu().to(torch.float64).numpy().reshape(-1)
    if got.shape != want.shape or not np.array_equal(got, want.astype(np.float64)):
        bad = int(np.sum(got != want)) if got.shape == want.shape else "shape"
        raise AssertionError(f"{name}: {bad} wrong elements")


def check(comm, device, p, r):
    checks = 0
    for dtype in COMM_DTYPES:
        reduce = comm.reduce_dtypes is None or dtype in comm.reduce_dtypes
        for salt, rows in enumerate([1, 7, 129]):
            tag = f"{comm.name} {dtype} rows={rows}"
            # all_reduce on counts the rank count does not divide, in place and out of place
            for count in (0, 1, rows * 3 + 1):
                if not reduce:
                    break
                x, _ = rank_input(r, (count,), dtype, device, salt)
                want = sum(rank_input(q, (count,), dtype, "cpu", salt)[1] for q in range(p))
                out = torch.empty_like(x)
                comm.all_reduce(x, out=out)
                expect(f"{tag} all_reduce out count={count}", out, want)
                if comm.async_unavailable_reason() is None:
                    work = comm.all_reduce(x, async_op=True)
                    expect(f"{tag} all_reduce async count={count}", work.wait(), want)
                else:
                    try:
                        comm.all_reduce(x, async_op=True)
                    except RuntimeError:
                        pass
                    else:
                        raise AssertionError("async_op=True accepted without thread support")
                checks += 2
            x, xs = rank_input(r, (rows, 3), dtype, device, salt)
            alls = [rank_input(q, (rows, 3), dtype, "cpu", salt)[1] for q in range(p)]
            expect(f"{tag} all_gather", comm.all_gather(x), np.concatenate(alls))
            big, _ = rank_input(r, (p * rows, 3), dtype, device, salt)
            bigs = [rank_input(q, (p * rows, 3), dtype, "cpu", salt)[1].reshape(p, -1)
                    for q in range(p)]
            if reduce:
                expect(f"{tag} reduce_scatter", comm.reduce_scatter(big), sum(bigs)[r])
            expect(f"{tag} all_to_all", comm.all_to_all(big),
                   np.concatenate([bigs[q][r] for q in range(p)]))
            root = (salt + 1) % p
            buf = x.clone()
            comm.broadcast(buf, root)
            expect(f"{tag} broadcast root={root}", buf, alls[root].reshape(-1))
            # send/recv around the ring; even ranks send first so no cycle of waits forms
            right, left = (r + 1) % p, (r - 1) % p
            got = torch.empty_like(x)
            if p > 1:
                if r % 2 == 0:
                    comm.send(x, right)
                    comm.recv(got, left)
                else:
                    comm.recv(got, left)
                    comm.send(x, right)
                expect(f"{tag} send/recv", got, alls[left].reshape(-1))
            checks += 5
    if device.type == "cuda":  # a side stream, synchronous and asynchronous
        side = torch.cuda.Stream()
        x, _ = rank_input(r, (1001,), torch.float32, device, 0)
        want = sum(rank_input(q, (1001,), torch.float32, "cpu", 0)[1] for q in range(p))
        expect("all_reduce on a side stream", comm.all_reduce(x.clone(), stream=side), want)
        if comm.async_unavailable_reason() is None:
            work = comm.all_reduce(x.clone(), stream=side, async_op=True)
            expect("async all_reduce on a side stream", work.wait(), want)
        checks += 2
    return checks


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--comm", default="mpi,ring")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    abort_on_exception()
    world = MPI.COMM_WORLD
    device = bind_device() if args.device == "cuda" else torch.device("cpu")
    for name in args.comm.split(","):
        comm = create(name, world, device)
        checks = check(comm, device, world.Get_size(), world.Get_rank())
        comm.close()
        total = world.allreduce(checks)
        if world.Get_rank() == 0:
            print(f"OK {comm.name} on {world.Get_size()} ranks ({args.device}): {total} checks",
                  flush=True)


if __name__ == "__main__":
    main()
