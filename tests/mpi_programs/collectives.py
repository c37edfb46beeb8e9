"""Run under mpiexec: every operation of every given communicator against a numpy reference.

    mpiexec -n P python tests/mpi_programs/collectives.py --comm mpi,ring,symm --device cpu

Each rank's input is small integers in [-2, 2] derived from (rank, element, salt), so every
sum is exact in every dtype and the reference is computed exactly in int64 with numpy.
Any mismatch raises, which aborts the job; rank 0 prints one line per backend on success.

``symm`` is checked further (``check_symm``): the same matrix on heaps of a few hundred bytes
(every operation in many pieces, all-reduce forced one-shot, then two-shot), sizes above the
default capacity and around the one-shot limit, and random floats whose all-reduce must give
the same bits on every rank and on both paths.
"""

import argparse
import hashlib

import numpy as np
import torch
from mpi4py import MPI

from backends.dtypes import COMM, DTYPES
from tp.comm import create
from tp.comm.symm import ONE_SHOT_MAX_BYTES, SymmCommunicator
from tp.comm.symm_heap import open_heap
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


SMALL_HEAP = 520  # bytes per rank: a multiple of no itemsize times P, so pieces end oddly


def count_paths(comm):
    """Count ``comm``'s one-shot and two-shot all-reduces (wraps the instance's methods)."""
    calls = {"one-shot": 0, "two-shot": 0}
    for path, method in (("one-shot", comm._one_shot), ("two-shot", comm._two_shot)):
        def counted(src, dst, path=path, method=method):
            calls[path] += 1
            method(src, dst)
        setattr(comm, f"_{path.replace('-', '_')}", counted)
    return calls


def check_large(comm, device, p, r):
    """Sizes above the heap's capacity (pieces) and on both sides of the one-shot limit."""
    cap, checks = comm.heap.capacity, 0
    for dtype in COMM_DTYPES:  # both all-reduce paths, at the limit and one element above
        limit = ONE_SHOT_MAX_BYTES // dtype.itemsize
        for count in (limit, limit + 2 * p + 1):
            x, _ = rank_input(r, (count,), dtype, device, 3)
            want = sum(rank_input(q, (count,), dtype, "cpu", 3)[1] for q in range(p))
            expect(f"all_reduce {dtype} count={count}", comm.all_reduce(x), want)
            checks += 1
    n = cap // 4 + 3  # fp32 elements: two pieces, the last smaller than one chunk per rank
    x, _ = rank_input(r, (n,), torch.float32, device, 4)
    alls = [rank_input(q, (n,), torch.float32, "cpu", 4)[1] for q in range(p)]
    expect("all_reduce above capacity", comm.all_reduce(x.clone()), sum(alls))
    expect("all_gather above capacity", comm.all_gather(x), np.concatenate(alls))
    buf = x.clone()
    comm.broadcast(buf, p - 1)
    expect("broadcast above capacity", buf, alls[p - 1])
    rows = cap // (4 * p) + 1  # per-rank blocks of two pieces each
    big, _ = rank_input(r, (p * rows,), torch.float32, device, 5)
    bigs = [rank_input(q, (p * rows,), torch.float32, "cpu", 5)[1].reshape(p, -1)
            for q in range(p)]
    expect("reduce_scatter above capacity", comm.reduce_scatter(big), sum(bigs)[r])
    expect("all_to_all above capacity", comm.all_to_all(big),
           np.concatenate([bigs[q][r] for q in range(p)]))
    return checks + 5


def check_same_bits(one_shot, two_shot, world, device, p, r):
    """Random floats (inexact sums): every rank gets the same bits, on both paths: those of
    the ranks' values added in rank order in fp32 and rounded once to the dtype, within the
    dtype's tolerance of the float64 sum."""
    checks = 0
    for name in ("fp32", "fp16", "bf16"):
        dtype, tol = DTYPES[name].torch, DTYPES[name].tolerance
        inputs = [torch.randn(1001, generator=torch.Generator().manual_seed(q)).to(dtype)
                  for q in range(p)]
        want = sum(x.double() for x in inputs)
        in_order = inputs[0].float()
        for other in inputs[1:]:
            in_order = in_order + other.float()
        x = inputs[r].to(device)
        first = one_shot.all_reduce(x.clone()).cpu()
        second = two_shot.all_reduce(x.clone()).cpu()
        if not (torch.equal(first, second) and torch.equal(first, in_order.to(dtype))):
            raise AssertionError(f"{name}: one-shot and two-shot all_reduce differ from each "
                                 f"other or from the fp32 sum in rank order")
        digests = world.allgather(hashlib.sha256(first.view(torch.uint8).numpy()).hexdigest())
        if len(set(digests)) != 1:
            raise AssertionError(f"{name}: all_reduce differs between ranks")
        error = float((first.double() - want).norm() / want.norm())
        if error > tol:
            raise AssertionError(f"{name}: all_reduce relative error {error:.2e} > {tol}")
        checks += 3
    return checks


def check_one_shot_kernels(world, device, p, r):
    """GPU only: all_reduce forced one-shot on the default heap, and reduce_scatter, run the
    heap's kernel for fp32, fp16 and bf16 (every call counted) and the host-issued algorithm
    for the other dtypes; all_gather runs the heap's copy-engine path in every dtype (out
    one element off its buffer, or the input). The kernels: 16-byte loads and, with operands
    one element off (or blocks of a length no load width divides), element by element; more
    16-byte packs than the grid has threads (its grid-stride loop), all_reduce with a tail,
    reduce_scatter in two pieces; into a poisoned out, and all_reduce in place. Returns
    (checks, {op: calls of the heap's path})."""
    comm = SymmCommunicator(world, open_heap(world, device), 1 << 62)
    heap, calls = comm.heap, {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0}
    ran = {True: 0, False: 0}

    def counting(kernel):
        def counted(src, dst):
            used = kernel(src, dst)
            ran[used] += 1
            return used
        return counted

    heap.one_shot_all_reduce = counting(heap.one_shot_all_reduce)
    heap.one_shot_reduce_scatter = counting(heap.one_shot_reduce_scatter)
    heap.copy_engine_all_gather = counting(heap.copy_engine_all_gather)
    checks, big = 0, (1 << 20) + 3
    big_blocks = (1 << 20) + 8  # fp32 reduce_scatter: two pieces of a block, 16-byte loads

    def expect_path(fused, before, label, n):
        if ran[fused] - before[fused] != n or ran[not fused] != before[not fused]:
            raise AssertionError(f"{label}: expected the {'kernel' if fused else 'host'} path "
                                 f"for {n} calls; got {ran} after {before}")

    for dtype in COMM_DTYPES:
        fused = dtype in (torch.float32, torch.float16, torch.bfloat16)
        for count, offset in ((1, 0), (1001, 1), (big, 0), (big, 1)):
            full, _ = rank_input(r, (count + 1,), dtype, device, 6)
            want = sum(rank_input(q, (count + 1,), dtype, "cpu", 6)[1]
                       for q in range(p))[offset:offset + count]
            before = dict(ran)
            out = torch.full((count + 1,), -99, dtype=dtype, device=device)[offset:][:count]
            tag = f"one-shot all_reduce {dtype} count={count} offset={offset}"
            expect(f"{tag} out", comm.all_reduce(full[offset:offset + count], out=out), want)
            x = full[offset:offset + count]
            comm.all_reduce(x)  # in place
            expect(f"{tag} in place", x, want)
            expect_path(fused, before, tag, 2)
            calls["all_reduce"] += 2 * fused
            checks += 2
        for count, offset in ((1, 0), (1001, 1), (big_blocks, 0)):
            full, _ = rank_input(r, (p * count + 1,), dtype, device, 7)
            blocks = [rank_input(q, (p * count + 1,), dtype, "cpu", 7)[1][offset:]
                      [:p * count].reshape(p, count) for q in range(p)]
            before = dict(ran)
            out = torch.full((count + 1,), -99, dtype=dtype, device=device)[offset:][:count]
            tag = f"reduce_scatter {dtype} count={count} offset={offset}"
            expect(tag, comm.reduce_scatter(full[offset:offset + p * count], out=out),
                   sum(blocks)[r])
            expect_path(fused, before, tag, 1)
            calls["reduce_scatter"] += fused
            checks += 1
        for count, offset in ((1001, 1), (big, 0)):  # by copy engine in every dtype
            full, _ = rank_input(r, (count + 1,), dtype, device, 8)
            parts = [rank_input(q, (count + 1,), dtype, "cpu", 8)[1][offset:offset + count]
                     for q in range(p)]
            before = dict(ran)
            out = torch.full((p * count + 1,), -99, dtype=dtype,
                             device=device)[1 - offset:][:p * count]
            tag = f"all_gather {dtype} count={count} offset={offset}"
            expect(tag, comm.all_gather(full[offset:offset + count], out=out),
                   np.concatenate(parts))
            expect_path(True, before, tag, 1)
            calls["all_gather"] += 1
            checks += 1
    comm.close()
    return checks, calls


def check_symm(world, device, label):
    """The symm-only checks above; rank 0 prints one line for each."""
    p, r = world.Get_size(), world.Get_rank()

    def report(what, checks, paths=None):
        total = world.allreduce(checks)
        counted = ("" if paths is None else f", one-shot {paths['one-shot']} calls, two-shot "
                   f"{paths['two-shot']} calls")
        if r == 0:
            print(f"OK symm {what} on {p} ranks ({label}): {total} checks{counted}", flush=True)

    try:
        open_heap(world, device, 63)
    except ValueError as exc:
        assert "capacity must be >= 64 bytes" in str(exc), exc
    else:
        raise AssertionError("a 63-byte heap was accepted")
    small = {}
    for path, limit in (("one-shot", 1 << 62), ("two-shot", -1)):  # -1: even empty
        comm = SymmCommunicator(world, open_heap(world, device, SMALL_HEAP), limit)
        comm.check_calls(world)
        paths = count_paths(comm)
        checks = check(comm, device, p, r)
        if paths[path] == 0 or sum(paths.values()) != paths[path]:
            raise AssertionError(f"expected {path} all-reduces only; got {paths}")
        report(f"in {SMALL_HEAP}-byte pieces, {path}", checks, paths)
        small[path] = comm
    report("same bits on every rank and path",
           check_same_bits(small["one-shot"], small["two-shot"], world, device, p, r))
    for comm in small.values():
        comm.close()
    comm = create("symm", world, device)
    paths = count_paths(comm)
    checks = check_large(comm, device, p, r)
    if not paths["one-shot"] or bool(paths["two-shot"]) != (p > 2):  # symm.crossover
        raise AssertionError(f"expected one-shot, and two-shot above 2 ranks; got {paths}")
    report(f"above its {comm.heap.capacity}-byte capacity", checks, paths)
    comm.close()
    if device.type == "cuda":
        checks, calls = check_one_shot_kernels(world, device, p, r)
        counted = ", ".join(f"{op} {world.allreduce(n)}" for op, n in calls.items())
        report(f"one-shot kernels ({counted} calls)", checks)


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
        if name == "symm":
            check_symm(world, device, args.device)


if __name__ == "__main__":
    main()
