"""Tensor-parallel layers, the transformer layer, ``gemmlab tp`` and ``gemmlab train`` on CPU
ranks, every program under ``mpiexec`` with a timeout."""

import json
import re

import pytest
import torch
import torch.nn.functional as F
from test_comm import PROGRAMS, mpirun, needs_mpi
from torch import nn


@needs_mpi
@pytest.mark.parametrize("ranks,comm", [(2, "mpi"), (4, "mpi"), (2, "ring"), (2, "symm"),
                                        (4, "symm")])
def test_layers_match_the_dense_layers(ranks, comm):
    result = mpirun(ranks, str(PROGRAMS / "layers.py"), "--comm", comm)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("column-parallel activation=None", "column-parallel activation=relu",
                 "column-parallel activation=gelu", "row-parallel",
                 "sequence-parallel column activation=None",
                 "sequence-parallel column activation=relu",
                 "sequence-parallel column activation=gelu", "sequence-parallel row",
                 "divisibility errors"):
        assert f"OK {line} on {ranks} ranks" in result.stdout


@needs_mpi
def test_transformer_layer_tp2_matches_tp1():
    result = mpirun(2, str(PROGRAMS / "transformer.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK transformer layer TP=2 matches TP=1" in result.stdout
    assert "OK sequence-parallel transformer layer TP=2 matches TP=1" in result.stdout
    assert "OK GELU transformer layer TP=2 matches TP=1" in result.stdout


@needs_mpi
def test_gemmlab_tp_on_cpu(tmp_path):
    result = mpirun(2, "-m", "bench.cli", "tp", "--device", "cpu", "--tokens", "96",
                    "--hidden", "32", "--iters", "2", "--warmup-iters", "1", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    timed = [r for r in rows if "ms" in r]
    assert {(r["layer"], r["phase"], r["tp"]) for r in timed} == {
        ("column", "forward", 2), ("column", "backward", 2), ("row", "forward", 2),
        ("row", "backward", 2), ("mlp", "forward+backward", 2), ("mlp", "forward+backward", 1)}
    for r in timed:  # every row checked (the MLP block's too) before it was timed
        assert r["ok"] and r["ms"] > 0 and r["max_rel_err"] <= 1e-5
    lapped = [r for r in rows if "overlap_efficiency" in r]
    assert {(r["layer"], r["phase"]) for r in lapped} == {("row", "forward"),
                                                          ("column", "backward")}
    for r in lapped:
        assert r["ok"] and r["max_rel_err"] <= 1e-5
        assert min(r[k] for k in ("compute_ms", "comm_ms", "serial_ms", "overlapped_ms")) > 0
        assert r["chunks"] == (4 if r["layer"] == "row" else 1) and r["sm_margin"] == 0


@needs_mpi
@pytest.mark.parametrize("comm", ["symm", "mpi"])
def test_gemmlab_tp_sequence_parallel_rows_on_cpu(tmp_path, comm):
    """The SP block and the decomposed overlaps (AG+GEMM, GEMM+RS), each checked before
    it is timed; a token count the TP size does not divide is a usage error."""
    result = mpirun(2, "-m", "bench.cli", "tp", "--device", "cpu", "--tokens", "96",
                    "--hidden", "32", "--iters", "2", "--warmup-iters", "1", "--comm", comm,
                    "--sequence-parallel", "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["rows"]
    sp = {(r["layer"], r["phase"]): r for r in rows if r["layer"].startswith("sp ")}
    assert set(sp) == {("sp mlp", "forward+backward"), ("sp column", "forward"),
                       ("sp row", "forward")}
    assert sp["sp mlp", "forward+backward"]["ms"] > 0
    for r in sp.values():
        assert r["ok"] and r["max_rel_err"] <= 1e-5
    for key in (("sp column", "forward"), ("sp row", "forward")):
        assert min(sp[key][k] for k in ("compute_ms", "comm_ms", "serial_ms",
                                        "overlapped_ms")) > 0
    odd = mpirun(2, "-m", "bench.cli", "tp", "--device", "cpu", "--tokens", "95",
                 "--hidden", "32", "--sequence-parallel", "--comm", comm)
    assert odd.returncode == 2
    assert "--tokens (95) divisible by the TP size 2" in odd.stdout + odd.stderr


@needs_mpi
@pytest.mark.parametrize("device, comm", [("cpu", "symm"), ("cpu", "mpi")])
def test_gemmlab_tp_cuda_graph_needs_a_gpu_and_a_stream_ordered_comm(device, comm):
    """--cuda-graph captures collectives, so it takes CUDA tensors and a communicator whose
    GPU collectives are enqueued on streams: anything else is a usage error, before any
    layer is built."""
    result = mpirun(2, "-m", "bench.cli", "tp", "--device", device, "--tokens", "32",
                    "--hidden", "16", "--comm", comm, "--cuda-graph")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--cuda-graph needs --device cuda and a stream-ordered communicator" in (
        result.stdout + result.stderr)


def test_graph_row_refuses_a_cpu_device():
    from bench.tp_bench import graph_row

    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        graph_row(None, torch.device("cpu"), 1e-5, 1, 0, {}, lambda: None, (), None)


def test_hidden_share_counts_what_overlap_saved_of_compute_plus_comm():
    """2 ms of compute and 1 ms of communication finished together in 2.25 ms: 0.75 ms of
    the communication was hidden, 75% of it and of the smaller of the two."""
    from bench.tp_bench import shares

    assert shares(2.0, 1.0, 2.25) == pytest.approx((0.75, 0.75))
    assert shares(1.0, 4.0, 4.0) == pytest.approx((0.25, 1.0))  # all of the compute hidden


def _train(tmp_path, name, ranks, *args):
    out = tmp_path / name
    result = mpirun(ranks, "-m", "bench.cli", "train", "--device", "cpu", "--steps", "4",
                    "--hidden", "64", "--heads", "4", "--seq", "32", "--batch", "8",
                    "--out", str(out), *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "results.json").read_text()), result.stdout


@needs_mpi
def test_training_follows_the_single_process_curve_with_any_layout(tmp_path):
    """DP, TP, both, and TP with sequence parallelism (each TP rank's loss is its tokens'
    part of the mean) all follow one process's loss curve."""
    single, _ = _train(tmp_path, "single", 1)
    assert len(single["loss"]) == 4 and single["loss"][-1] < single["loss"][0]
    assert single["summary"]["configuration"] == "DP 1 x TP 1"
    assert not single["summary"]["sequence_parallel"] and not single["summary"]["cuda_graph"]
    reference = str(tmp_path / "single" / "results.json")
    for ranks, tp, sp, label in ((2, 2, False, "DP 1 x TP 2"), (2, 1, False, "DP 2 x TP 1"),
                                 (4, 2, False, "DP 2 x TP 2"), (2, 2, True, "DP 1 x TP 2, SP"),
                                 (4, 2, True, "DP 2 x TP 2, SP")):
        run, stdout = _train(tmp_path, label.replace(" ", "").replace(",", "-"), ranks, "--tp",
                             str(tp), "--reference", reference,
                             *(["--sequence-parallel"] if sp else []))
        assert run["summary"]["configuration"] == label
        assert run["summary"]["sequence_parallel"] is sp
        assert max(abs(a - b) for a, b in zip(run["loss"], single["loss"])) < 1e-4
        assert re.search(r"largest \|loss - reference loss\| over 4 steps", stdout)


@needs_mpi
def test_train_rejects_a_layout_that_does_not_fit(tmp_path):
    result = mpirun(2, "-m", "bench.cli", "train", "--device", "cpu", "--tp", "1", "--dp", "3")
    assert result.returncode == 2
    assert "--tp 1 x --dp 3 must equal the 2 ranks" in result.stdout
    result = mpirun(2, "-m", "bench.cli", "train", "--device", "cpu", "--tp", "1",
                    "--batch", "5", "--steps", "1")
    assert result.returncode == 2 and result.stderr == ""
    assert result.stdout == "error: --batch 5 is not a multiple of the DP size 2\n"


@needs_mpi
def test_train_rejects_sequence_parallelism_on_tokens_the_tp_size_does_not_divide():
    result = mpirun(2, "-m", "bench.cli", "train", "--device", "cpu", "--tp", "2",
                    "--sequence-parallel", "--batch", "3", "--seq", "5", "--steps", "1")
    assert result.returncode == 2 and result.stderr == ""
    assert result.stdout == ("error: --sequence-parallel needs the tokens of each DP rank's "
                             "batch (--batch 3 / DP 1 x --seq 5 = 15) to be a multiple of "
                             "--tp 2\n")


@needs_mpi
@pytest.mark.parametrize("comm", ["mpi", "symm"])
def test_train_cuda_graph_needs_a_gpu_and_a_stream_ordered_comm(comm):
    """The graph captures the DP and TP collectives: on a CPU it is a usage error, before
    any model is built."""
    result = mpirun(1, "-m", "bench.cli", "train", "--device", "cpu", "--comm", comm,
                    "--cuda-graph", "--steps", "5")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout.startswith("error: --cuda-graph needs --device cuda and a "
                                    "stream-ordered communicator")


def _one_rank_gpt(sequence_parallel: bool):
    from mpi4py import MPI

    import tp.comm
    from tp.transformer import GPT, GPTConfig

    comm = tp.comm.create("mpi", MPI.COMM_SELF, "cpu")
    config = GPTConfig(seq_len=8, hidden=32, heads=4, layers=2)
    return GPT(config, comm, seed=1, sequence_parallel=sequence_parallel)


@needs_mpi
def test_sequence_parallel_gpt_on_one_rank_is_the_plain_gpt():
    """At TP = 1 the block is every token: the same logits (flattened), loss and
    gradients."""
    generator = torch.Generator().manual_seed(0)
    idx, targets = (torch.randint(0, 256, (3, 8), generator=generator) for _ in range(2))
    plain, sp = _one_rank_gpt(False), _one_rank_gpt(True)
    torch.testing.assert_close(sp(idx), plain(idx).reshape(24, 256), rtol=0, atol=0)
    loss_plain, loss_sp = plain.loss(idx, targets), sp.loss(idx, targets)
    torch.testing.assert_close(loss_sp, loss_plain, rtol=1e-6, atol=0)
    loss_plain.backward()
    loss_sp.backward()
    for (name, a), b in zip(plain.named_parameters(), sp.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_sequence_parallel_gpt_refuses_tokens_the_tp_size_does_not_divide():
    from types import SimpleNamespace

    from tp.transformer import GPT, GPTConfig

    two_ranks = SimpleNamespace(size=2, rank=0)  # refused before any communication
    model = GPT(GPTConfig(seq_len=8, hidden=16, heads=2, layers=1), two_ranks, overlap=False,
                sequence_parallel=True)
    with pytest.raises(ValueError, match="the B \\* T = 15 tokens to be a multiple of the "
                                         "TP size 2"):
        model(torch.zeros(3, 5, dtype=torch.int64))


@needs_mpi
def test_train_refuses_a_cuda_graph_on_cpu_before_building_anything():
    from mpi4py import MPI

    import tp.comm
    from tp.train import train
    from tp.transformer import GPTConfig

    comm = tp.comm.create("mpi", MPI.COMM_SELF, "cpu")
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device; got cpu"):
        train(GPTConfig(), comm, comm, steps=5, batch=2, lr=1e-3, seed=0,
              device=torch.device("cpu"), cuda_graph=True)


def _plain_layer(layer, x):
    """``TransformerLayer.forward`` written out in plain torch on the layer's own parameters
    (the TP layers hold (in, out) weights), with torch's tanh GELU in the MLP."""
    b, t, h = x.shape
    heads = layer.local_heads

    def linear(fc, z):
        return z @ fc.weight + fc.bias

    z = F.layer_norm(x, (h,), layer.ln1.weight, layer.ln1.bias, layer.ln1.eps)
    q, k, v = (linear(fc, z).view(b, t, heads, -1).transpose(1, 2)
               for fc in (layer.fc_q, layer.fc_k, layer.fc_v))
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    x = x + linear(layer.fc_o, attn.reshape(b, t, -1))
    z = F.layer_norm(x, (h,), layer.ln2.weight, layer.ln2.bias, layer.ln2.eps)
    return x + linear(layer.fc2, F.gelu(linear(layer.fc1, z), approximate="tanh"))


@needs_mpi
def test_the_gelu_mlp_is_torch_gelu_forward_and_backward(rng):
    """The GELU layer (fc1's GEMM with its bias fused, then GELU) against the same layer
    written in plain torch: output, input gradient and every parameter's gradient."""
    from mpi4py import MPI

    import tp.comm
    from tp.transformer import GPTConfig, TransformerLayer

    comm = tp.comm.create("mpi", MPI.COMM_SELF, "cpu")
    torch.manual_seed(5)
    layer = TransformerLayer(32, 4, comm, activation="gelu")
    x, g = torch.randn(2, 7, 32, generator=rng), torch.randn(2, 7, 32, generator=rng)
    results = []
    for forward in (layer, lambda x: _plain_layer(layer, x)):
        layer.zero_grad(set_to_none=True)
        xr = x.clone().requires_grad_(True)
        y = forward(xr)
        y.backward(g)
        results.append((y.detach(), xr.grad, {n: p.grad for n, p in layer.named_parameters()}))
    (y, gx, grads), (y_ref, gx_ref, grads_ref) = results
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gx, gx_ref)
    assert grads.keys() == grads_ref.keys() and len(grads) == 16
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], msg=name)
    with pytest.raises(ValueError, match="activation must be one of"):
        GPTConfig(activation="swish")


@needs_mpi
def test_a_transformer_layers_chunks_and_sm_margin_reach_every_tp_layer():
    """Sequence-parallel, the column-parallel layers' all-gather + GEMM is chunked too."""
    from mpi4py import MPI

    import tp.comm
    from tp.transformer import TransformerLayer

    comm = tp.comm.create("mpi", MPI.COMM_SELF, "cpu")
    layer = TransformerLayer(32, 4, comm, chunks=2, sm_margin=8, sequence_parallel=True)
    names = ("fc_q", "fc_k", "fc_v", "fc_o", "fc1", "fc2")
    assert {n: (getattr(layer, n).chunks, getattr(layer, n).sm_margin) for n in names} == {
        n: (2, 8) for n in names}


@needs_mpi
@pytest.mark.parametrize("layer", ["ColumnParallelLinear", "RowParallelLinear"])
def test_a_master_that_does_not_fit_the_layer_is_a_clear_error(layer):
    from mpi4py import MPI

    import tp.comm
    import tp.layers

    comm = tp.comm.create("mpi", MPI.COMM_SELF, "cpu")
    cls = getattr(tp.layers, layer)
    with pytest.raises(ValueError, match="master is 4 -> 6; expected 4 -> 4"):
        cls(4, 4, comm, master=nn.Linear(4, 6))
    with pytest.raises(ValueError, match="bias=True but the master has no bias"):
        cls(4, 4, comm, master=nn.Linear(4, 4, bias=False))
    assert cls(4, 4, comm, bias=False, master=nn.Linear(4, 4, bias=False)).bias is None
