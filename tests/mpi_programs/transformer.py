"""Run under mpiexec -n 2: a TransformerLayer at TP=2 against the same layer at TP=1 (built
from the same seed), outputs and gradients, with the ReLU and the GELU MLP; overlap on and
off bit-identical. Rank 0 prints."""

import torch
from mpi4py import MPI

from tp.comm import create
from tp.mpi import abort_on_exception
from tp.transformer import TransformerLayer

abort_on_exception()
world = MPI.COMM_WORLD
rank, p = world.Get_rank(), world.Get_size()
tp2, tp1 = create("mpi", world), create("mpi", MPI.COMM_SELF)


def build(comm, overlap=True, sequence_parallel=False, activation="relu"):
    torch.manual_seed(3)  # the same masters whatever the TP degree
    return TransformerLayer(32, 4, comm, overlap=overlap, sequence_parallel=sequence_parallel,
                            activation=activation)


def run(layer, x, g):
    x = x.detach().clone().requires_grad_(True)
    y = layer(x)
    y.backward(g)
    return y.detach(), x.grad


def close(got, want, what, tol=1e-5):
    err = ((got - want).norm() / want.norm()).item()
    assert err <= tol, f"rank {rank}: {what}: relative error {err:.2e}"


torch.manual_seed(1)
x, g = torch.randn(2, 7, 32), torch.randn(2, 7, 32)
ref = build(tp1)
y1, gx1 = run(ref, x, g)
results = {}
for overlap in (True, False):
    layer = build(tp2, overlap)
    results[overlap] = (*run(layer, x, g), layer)
y2, gx2, layer = results[True]
close(y2, y1, "output")
close(gx2, gx1, "input gradient")
close(layer.ln1.weight.grad, ref.ln1.weight.grad, "ln1 weight gradient")
close(layer.fc_o.bias.grad, ref.fc_o.bias.grad, "fc_o bias gradient")
n = 32 // p
close(layer.fc_q.weight.grad, ref.fc_q.weight.grad[:, rank * n:(rank + 1) * n], "fc_q gradient")
m = 128 // p
close(layer.fc2.weight.grad, ref.fc2.weight.grad[rank * m:(rank + 1) * m], "fc2 gradient")
assert torch.equal(results[True][0], results[False][0]) and \
    torch.equal(results[True][1], results[False][1]), "overlap changed the result"
# Sequence parallelism: rank r holds tokens [r * 14 / P, (r + 1) * 14 / P) of the 2 x 7.
rows = slice(rank * 14 // p, (rank + 1) * 14 // p)
sp = {}
for overlap in (True, False):
    layer = build(tp2, overlap, sequence_parallel=True)
    xs = x.reshape(14, 32)[rows].detach().clone().requires_grad_(True)
    ys = layer(xs, seq_len=7)
    ys.backward(g.reshape(14, 32)[rows])
    sp[overlap] = (ys.detach(), xs.grad, layer)
ys, gxs, layer = sp[True]
close(ys, y1.reshape(14, 32)[rows], "sequence-parallel output")
close(gxs, gx1.reshape(14, 32)[rows], "sequence-parallel input gradient")
close(layer.ln1.weight.grad, ref.ln1.weight.grad, "sequence-parallel ln1 weight gradient")
close(layer.ln2.bias.grad, ref.ln2.bias.grad, "sequence-parallel ln2 bias gradient")
close(layer.fc2.bias.grad, ref.fc2.bias.grad, "sequence-parallel fc2 bias gradient")
close(layer.fc_q.weight.grad, ref.fc_q.weight.grad[:, rank * n:(rank + 1) * n],
      "sequence-parallel fc_q gradient")
assert torch.equal(sp[True][0], sp[False][0]) and torch.equal(sp[True][1], sp[False][1]), \
    "overlap changed the sequence-parallel result"
try:
    layer(xs)
except ValueError as exc:
    assert "sequence parallelism needs seq_len" in str(exc)
else:
    raise AssertionError("a sequence-parallel layer ran without seq_len")
if rank == 0:
    print(f"OK sequence-parallel transformer layer TP={p} matches TP=1", flush=True)
# The GELU MLP (GPT-2's), plain and sequence-parallel: fc1's shard of columns, GELU on it.
relu_y1 = y1
ref = build(tp1, activation="gelu")
y1, gx1 = run(ref, x, g)
assert not torch.allclose(y1, relu_y1), "activation='gelu' computed the ReLU layer"
y2, gx2 = run(layer := build(tp2, activation="gelu"), x, g)
close(y2, y1, "GELU output")
close(gx2, gx1, "GELU input gradient")
close(layer.fc1.weight.grad, ref.fc1.weight.grad[:, rank * m:(rank + 1) * m], "GELU fc1 gradient")
close(layer.fc1.bias.grad, ref.fc1.bias.grad[rank * m:(rank + 1) * m], "GELU fc1 bias gradient")
layer = build(tp2, activation="gelu", sequence_parallel=True)
xs = x.reshape(14, 32)[rows].detach().clone().requires_grad_(True)
ys = layer(xs, seq_len=7)
ys.backward(g.reshape(14, 32)[rows])
close(ys.detach(), y1.reshape(14, 32)[rows], "sequence-parallel GELU output")
close(xs.grad, gx1.reshape(14, 32)[rows], "sequence-parallel GELU input gradient")
close(layer.fc1.weight.grad, ref.fc1.weight.grad[:, rank * m:(rank + 1) * m],
      "sequence-parallel GELU fc1 gradient")
if rank == 0:
    print(f"OK GELU transformer layer TP={p} matches TP=1", flush=True)
try:
    TransformerLayer(32, 3, tp2)
except ValueError as exc:
    assert "must be a multiple of the TP size" in str(exc)
else:
    raise AssertionError("3 heads on 2 TP ranks were accepted")
if rank == 0:
    print(f"OK transformer layer TP={p} matches TP=1", flush=True)
