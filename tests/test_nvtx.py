"""NVTX ranges: where gemmlab pushes them and what they are called (recorded on CPU by
replacing the domain handle), CUDA stream naming, and the overhead probe."""

import json
import shutil

import pytest
import torch
from torch import nn

import profiling.nvtx as gemmlab_nvtx
from tp.comm.base import Communicator
from tp.layers import ColumnParallelLinear, RowParallelLinear
from tp.train import train
from tp.transformer import GPTConfig


class Loopback(Communicator):
    """One rank talking to itself: every collective is a copy."""

    name = "loopback"

    def __init__(self):
        super().__init__(0, 1)

    def _all_reduce(self, src, dst):
        dst.copy_(src)

    _all_gather = _reduce_scatter = _all_to_all = _all_reduce

    def _broadcast(self, buf, root):
        pass

    def _send(self, buf, dst):
        raise AssertionError("no peer")

    _recv = _send


class Recorder:
    """A domain handle that records (message, domain, payload) of every push."""

    def __init__(self):
        self.pushed = []

    def get_event_attributes(self, message=None, payload=None, **_):
        return message, gemmlab_nvtx.DOMAIN, payload

    def push_range(self, attributes):
        self.pushed.append(attributes)

    def pop_range(self):
        pass


@pytest.fixture
def ranges(monkeypatch):
    """The (message, domain, payload) of every range pushed, in order."""
    recorder = Recorder()
    monkeypatch.setattr(gemmlab_nvtx, "domain", recorder)
    return recorder.pushed


def test_collectives_are_named_after_backend_and_operation(ranges):
    comm = Loopback()
    x = torch.randn(4, 3)
    comm.all_reduce(x)
    comm.all_gather(x)
    comm.reduce_scatter(x)
    comm.broadcast(x)
    assert [m for m, _, _ in ranges] == ["loopback all_reduce", "loopback all_gather",
                                         "loopback reduce_scatter", "loopback broadcast"]
    assert {d for _, d, _ in ranges} == {"gemmlab"}


def test_tp_phases_are_ranges_per_layer(ranges):
    comm = Loopback()
    fc1 = ColumnParallelLinear(8, 16, comm, activation="relu", master=nn.Linear(8, 16),
                               name="fc1")
    fc2 = RowParallelLinear(16, 8, comm, master=nn.Linear(16, 8), chunks=2, name="fc2")
    x = torch.randn(6, 8, requires_grad=True)
    fc2(fc1(x)).sum().backward()
    names = [m for m, _, _ in ranges]
    assert names[:3] == ["fc1 forward", "compute Y", "cublas"]
    assert names[3:8] == ["fc2 forward", "compute chunk", "cublas", "compute chunk", "cublas"]
    assert [p for m, _, p in ranges if m == "compute chunk"] == [0, 1]
    assert names[8:] == ["fc2 backward", "compute dX", "cublas", "compute dW", "cublas",
                         "fc1 backward", "compute dX", "cublas", "compute dW", "cublas"]


def test_training_steps_and_transformer_layers_are_ranges(ranges):
    config = GPTConfig(seq_len=8, hidden=16, heads=2, layers=1)
    train(config, Loopback(), Loopback(), steps=2, batch=2, lr=1e-3, seed=0,
          device=torch.device("cpu"))
    names = [m for m, _, _ in ranges]
    assert [p for m, _, p in ranges if m == "train step"] == [0, 1]
    for name in ("forward", "backward", "optimizer step", "layer0 forward", "layer0.attention",
                 "layer0.fc_q forward", "layer0.fc2 forward", "layer0.fc1 backward",
                 "loopback all_reduce"):
        assert name in names, name
    assert "DP gradient average" not in names  # one DP rank: nothing to average


def test_streams_are_named_where_nvtx3_headers_and_a_compiler_exist():
    from profiling.cuda_toolkit import toolkit_include_dirs

    compiler = shutil.which("cc") or shutil.which("gcc")
    headers = [d for d in toolkit_include_dirs() if (d / "nvtx3" / "nvToolsExtCudaRt.h").is_file()]
    named = gemmlab_nvtx.name_stream(0, "gemmlab test stream")
    assert named == bool(compiler and headers), gemmlab_nvtx.stream_naming_unavailable_reason()
    assert (gemmlab_nvtx.stream_naming_unavailable_reason() is None) == named


def test_overhead_probe_reports_both_timings(tmp_path, capsys):
    from profiling import overhead

    assert overhead.main(["--size", "64", "--dtype", "fp32", "--calls", "5", "--rounds", "2",
                          "--device", "cpu", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "overhead.json").read_text())
    assert result["range_us"] > 0 and result["gemm_ms_with_ranges"] > 0
    assert result["gemm_ms_without_ranges"] > 0 and result["rounds"] == 2
    assert "NVTX range push/pop" in capsys.readouterr().out


def test_the_overhead_probe_takes_turns_on_which_timing_goes_first(monkeypatch):
    from profiling import overhead

    order = []
    monkeypatch.setattr(overhead, "gemm_ms", lambda a, b, calls: order.append(
        "off" if gemmlab_nvtx.domain is gemmlab_nvtx.NO_PROFILER else "on") or 1.0)
    overhead.measure(8, torch.float32, torch.device("cpu"), calls=1, rounds=3)
    assert order == ["on", "off", "off", "on", "on", "off"]


def test_the_overhead_probe_times_gemm_with_its_range_and_without(ranges, monkeypatch):
    """The probe's two timings differ by the range alone: opened, gemm() pushes one range
    per call; skipped, none, whatever domain was there before."""
    import backends
    from profiling import overhead

    a, b = torch.randn(4, 4), torch.randn(4, 4)
    before = gemmlab_nvtx.domain, gemmlab_nvtx.NO_PROFILER
    with overhead.gemm_range(opened=False):
        assert gemmlab_nvtx.domain is gemmlab_nvtx.NO_PROFILER  # what makes gemm() skip it
        backends.gemm(a, b, backend="torch_unfused")
    assert ranges == [] and (gemmlab_nvtx.domain, gemmlab_nvtx.NO_PROFILER) == before
    monkeypatch.setattr(gemmlab_nvtx, "NO_PROFILER", gemmlab_nvtx.domain)  # a skipping gemm()
    with overhead.gemm_range(opened=True):
        backends.gemm(a, b, backend="torch_unfused")
    assert [message for message, _, _ in ranges] == ["torch_unfused"]


class Untouchable(Loopback):
    """A communicator that fails the test if any collective is started."""

    def _all_reduce(self, src, dst):
        raise AssertionError("communication started")

    _all_gather = _reduce_scatter = _all_to_all = _all_reduce


def test_tp_layers_check_the_input_width_before_any_gemm_or_communication(monkeypatch):
    import tp.layers

    def no_gemm(*args, **kwargs):
        raise AssertionError("a GEMM was launched")

    monkeypatch.setattr(tp.layers, "gemm", no_gemm)
    comm = Untouchable()
    column = ColumnParallelLinear(8, 16, comm, name="fc1")
    row = RowParallelLinear(16, 8, comm, name="fc2")
    full_row = RowParallelLinear(16, 8, comm, input_is_parallel=False, name="fc3")
    with pytest.raises(ValueError, match=r"fc1: the input must be \(\.\.\., 8\) \(in_features\);"
                                         r" got \(6, 7\)"):
        column(torch.randn(6, 7))
    with pytest.raises(ValueError, match=r"fc2: the input must be \(\.\.\., 16\)"):
        row(torch.randn(2, 3, 15))
    with pytest.raises(ValueError, match=r"fc3: the input must be \(\.\.\., 16\)"):
        full_row(torch.randn(5))
