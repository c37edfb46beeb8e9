"""Run under mpiexec -n P (P divides 4 and 12): the TP layers against the dense layers they
were cut from, the column-parallel one with each activation (none, ReLU, GELU). Column
forward must equal the dense columns exactly (its inputs and weights small integers, so
every product and sum is exact in fp32 whatever the GEMM's blocking); everything else (which
sums over ranks in another order) within 1e-5 of float64; overlap on and off bit-identical.
Rank 0 prints one line per check group."""

import argparse

import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn

from backends import gemm
from tp.comm import create
from tp.layers import ColumnParallelLinear, RowParallelLinear
from tp.mpi import abort_on_exception

parser = argparse.ArgumentParser()
parser.add_argument("--comm", default="mpi")
parser.add_argument("--backend", default="cublas")
args = parser.parse_args()
abort_on_exception()
world = MPI.COMM_WORLD
rank, p = world.Get_rank(), world.Get_size()
comm = create(args.comm, world)
say = print if rank == 0 else (lambda *a, **k: None)


def close(got, want, what, tol=1e-5):
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err <= tol, f"rank {rank}: {what}: relative error {err:.2e} > {tol:.0e}"


def act(y, activation):
    """``activation`` applied to ``y`` with torch's own functions."""
    if activation == "gelu":
        return F.gelu(y, approximate="tanh")
    return torch.relu(y) if activation == "relu" else y


def dense_columns(x, master, activation, cols):
    """Columns ``cols`` of the dense layer through the same GEMM backend, ReLU fused, GELU
    applied to the columns after it as the column-parallel layer applies it to its shard (on
    the CPU, GELU's vectorised body and scalar tail round differently, so only a tensor of
    the same shape gets the same bits): the shard must match it bit for bit."""
    y = gemm(x, master.weight.detach().t().contiguous(), master.bias.detach(),
             activation="relu" if activation == "relu" else None, backend=args.backend)
    y = y[:, cols].contiguous()
    return act(y, activation) if activation == "gelu" else y


def small_integers(*shape):
    """Float32 values in -3..3: a product of 12 of them and its bias sum exactly in fp32, in
    any order. With random floats, equality would hold only if the CPU GEMM rounded a shard's
    rows as it rounds them inside the dense product, which its kernels (chosen by the row
    count and the CPU's vector width) need not do."""
    return torch.randint(-3, 4, shape).float()


def integer_master(in_features, out_features):
    """An ``nn.Linear`` whose weight and bias are ``small_integers``."""
    master = nn.Linear(in_features, out_features)
    with torch.no_grad():
        master.weight.copy_(small_integers(out_features, in_features))
        master.bias.copy_(small_integers(out_features))
    return master


def dense_run(master, x, grad_out, activation=None):
    """The reference: the dense layer in float64, with its gradients."""
    lin = nn.Linear(master.in_features, master.out_features).double()
    lin.load_state_dict(master.state_dict())
    x = x.detach().double().requires_grad_(True)
    y = act(lin(x), activation)
    y.backward(grad_out.double())
    return y.detach(), x.grad, lin.weight.grad.t(), lin.bias.grad


def tp_run(layer, x, grad_out):
    x = x.detach().clone().requires_grad_(True)
    y = layer(x)
    y.backward(grad_out)
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


torch.manual_seed(0)  # the same master and data on every rank
x = small_integers(2, 5, 12)
for activation in (None, "relu", "gelu"):
    master = integer_master(12, 8)
    g = torch.randn(2, 5, 8)
    y_ref, gx_ref, gw_ref, gb_ref = dense_run(master, x, g, activation)
    n = 8 // p
    cols = slice(rank * n, (rank + 1) * n)
    runs = {}
    for overlap in (True, False):
        layer = ColumnParallelLinear(12, 8, comm, activation=activation, master=master,
                                     backend=args.backend, overlap=overlap)
        runs[overlap] = tp_run(layer, x, g[..., cols].contiguous())
    y, gx, gw, gb = runs[True]
    dense = dense_columns(x.reshape(-1, 12), master, activation, cols)
    assert torch.equal(y, dense.reshape(y.shape)), f"rank {rank}: column forward not exact"
    close(y, y_ref[..., cols], "column forward")
    close(gx, gx_ref, "column dX")
    close(gw, gw_ref[:, cols], "column dW")
    close(gb, gb_ref[cols], "column db")
    assert all(torch.equal(a, b) for a, b in zip(runs[True], runs[False])), \
        f"rank {rank}: column results differ with overlap on and off"
    gathered = ColumnParallelLinear(12, 8, comm, activation=activation, master=master,
                                    gather_output=True, backend=args.backend)
    y_full, gx_full, _, _ = tp_run(gathered, x, g)
    close(y_full, y_ref, "column gather_output forward")
    close(gx_full, gx_ref, "column gather_output dX")
    say(f"OK column-parallel activation={activation} on {p} ranks ({comm.name})")

master = nn.Linear(12, 8)
g = torch.randn(2, 5, 8)
y_ref, gx_ref, gw_ref, gb_ref = dense_run(master, x, g)
k = 12 // p
rows = slice(rank * k, (rank + 1) * k)
runs = {}
for overlap in (True, False):
    layer = RowParallelLinear(12, 8, comm, master=master, backend=args.backend,
                              overlap=overlap, chunks=3)
    runs[overlap] = tp_run(layer, x[..., rows].contiguous(), g)
y, gx, gw, gb = runs[True]
close(y, y_ref, "row forward")
close(gx, gx_ref[..., rows], "row dX")
close(gw, gw_ref[rows], "row dW")
close(gb, gb_ref, "row db")
assert all(torch.equal(a, b) for a, b in zip(runs[True], runs[False])), \
    f"rank {rank}: row results differ with overlap on and off"
scattering = RowParallelLinear(12, 8, comm, master=master, input_is_parallel=False,
                               backend=args.backend)
y_s, gx_s, _, _ = tp_run(scattering, x, g)
close(y_s, y_ref, "row scatter-input forward")
close(gx_s, gx_ref, "row scatter-input dX")
say(f"OK row-parallel on {p} ranks ({comm.name})")

# Sequence parallelism: each rank holds a block of the 12 tokens between the layers.
xs = small_integers(12, 12)
t = 12 // p
mine = slice(rank * t, (rank + 1) * t)
for activation in (None, "relu", "gelu"):
    master = integer_master(12, 8)
    g = torch.randn(12, 8)
    y_ref, gx_ref, gw_ref, gb_ref = dense_run(master, xs, g, activation)
    n = 8 // p
    cols = slice(rank * n, (rank + 1) * n)
    runs = {}
    for overlap in (True, False):
        layer = ColumnParallelLinear(12, 8, comm, activation=activation, master=master,
                                     backend=args.backend, overlap=overlap,
                                     sequence_parallel=True)
        runs[overlap] = tp_run(layer, xs[mine].contiguous(), g[:, cols].contiguous())
    y, gx, gw, gb = runs[True]
    dense = dense_columns(xs, master, activation, cols)
    assert torch.equal(y, dense), f"rank {rank}: SP column forward not exact"
    close(gx, gx_ref[mine], "SP column dX")
    close(gw, gw_ref[:, cols], "SP column dW")
    close(gb, gb_ref[cols], "SP column db")
    assert all(torch.equal(a, b) for a, b in zip(runs[True], runs[False])), \
        f"rank {rank}: SP column results differ with overlap on and off"
    say(f"OK sequence-parallel column activation={activation} on {p} ranks ({comm.name})")

master = nn.Linear(12, 8)
g = torch.randn(12, 8)
y_ref, gx_ref, gw_ref, gb_ref = dense_run(master, xs, g)
k = 12 // p
rows = slice(rank * k, (rank + 1) * k)
runs = {}
for overlap in (True, False):
    layer = RowParallelLinear(12, 8, comm, master=master, backend=args.backend,
                              overlap=overlap, chunks=3, sequence_parallel=True)
    runs[overlap] = tp_run(layer, xs[:, rows].contiguous(), g[mine].contiguous())
y, gx, gw, gb = runs[True]
close(y, y_ref[mine], "SP row forward")
close(gx, gx_ref[:, rows], "SP row dX")
close(gw, gw_ref[rows], "SP row dW")
close(gb, gb_ref, "SP row db (summed over the TP group)")
assert all(torch.equal(a, b) for a, b in zip(runs[True], runs[False])), \
    f"rank {rank}: SP row results differ with overlap on and off"
if p > 1:
    try:
        RowParallelLinear(12, 8, comm, sequence_parallel=True)(torch.randn(p + 1, 12 // p))
    except ValueError as exc:
        assert "sequence parallelism needs the tokens divisible by the TP size" in str(exc)
    else:
        raise AssertionError("a token count the TP size does not divide was accepted")
say(f"OK sequence-parallel row on {p} ranks ({comm.name})")

for bad in (lambda: ColumnParallelLinear(12, 6 * p + 1, comm),
            lambda: RowParallelLinear(4 * p + 1, 8, comm)):
    if p == 1:
        break  # one rank divides everything
    try:
        bad()
    except ValueError as exc:
        assert "is not a multiple of the TP size" in str(exc)
    else:
        raise AssertionError("a size the TP degree does not divide was accepted")
for bad in (lambda: ColumnParallelLinear(12, 6 * p, comm, sm_margin=-1),
            lambda: RowParallelLinear(4 * p, 8, comm, sm_margin=-8)):
    try:
        bad()
    except ValueError as exc:
        assert "sm_margin must be >= 0" in str(exc)
    else:
        raise AssertionError("a negative sm_margin was accepted")
say(f"OK divisibility errors on {p} ranks")
comm.close()
