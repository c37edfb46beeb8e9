"""bench.recording.Recorder: each row on disk as it is added, the result files at finish or
(marked) at an interrupt, and in an MPI job rank 0 alone writing while the others wait for
it in finish; CPU only."""

import json

from bench.recording import Recorder


def plot(rows, path):
    path.write_bytes(b"\x89PNG")


class FakeComm:
    """The calls a Recorder makes of an mpi4py communicator; ``barriers`` holds, per Barrier,
    which result files existed when it was called; ``allreduce`` answers as if another rank
    had been asked to stop when ``peer_stops``."""

    def __init__(self, rank, out, peer_stops=False):
        self.rank, self.out, self.barriers = rank, out, []
        self.peer_stops = peer_stops

    def Get_rank(self):
        return self.rank

    def allreduce(self, value):
        return value + self.peer_stops

    def Barrier(self):
        self.barriers.append(sorted(p.name for p in self.out.glob("results.*")))


def test_rows_reach_the_disk_as_they_are_added_and_the_files_at_finish(tmp_path):
    recorder = Recorder(tmp_path / "out", plot, meta={"knob": 3})
    recorder.add({"x": 1})
    lines = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"x": 1}]
    recorder.add({"x": 2, "y": 0.5})
    paths = recorder.finish()
    assert [p.name for p in paths] == ["results.json", "results.csv", "results.png"]
    written = json.loads(paths[0].read_text())
    assert written["rows"] == [{"x": 1}, {"x": 2, "y": 0.5}] and written["meta"]["knob"] == 3
    assert "interrupted" not in written["meta"]
    assert paths[1].read_text().splitlines() == ["x,y", "1,", "2,0.5"]


def test_only_rank_0_of_a_communicator_writes_and_every_rank_waits_for_it(tmp_path):
    out = tmp_path / "out"
    other = FakeComm(1, out)
    recorder = Recorder(out, plot, comm=other)
    recorder.add({"x": 1})
    assert not out.exists()  # rank 1 creates nothing
    assert recorder.finish() == [] and recorder.rows == [{"x": 1}]
    assert len(other.barriers) == 1
    root = FakeComm(0, out)
    recorder = Recorder(out, plot, comm=root)
    recorder.add({"x": 1})
    assert len(recorder.finish()) == 3
    # The barrier comes after the writing: ranks leave finish() once rank 0 has written.
    assert root.barriers == [["results.csv", "results.json", "results.jsonl", "results.png"]]


def test_an_interrupt_writes_what_finished_without_waiting_for_other_ranks(tmp_path):
    """Ctrl-C or SIGTERM may reach one rank alone: a barrier there could wait forever."""
    root = FakeComm(0, tmp_path)
    recorder = Recorder(tmp_path, plot, comm=root)
    recorder.add({"x": 1})
    paths = recorder.interrupt()
    assert [p.name for p in paths] == ["results.json", "results.csv", "results.png"]
    assert json.loads(paths[0].read_text())["meta"]["interrupted"] is True
    assert root.barriers == []


def test_the_meta_is_of_the_runs_start_not_of_its_end(tmp_path, monkeypatch):
    """A checkout or environment that changes while a run goes on does not relabel it."""
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    recorder = Recorder(tmp_path, plot)
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    recorder.add({"x": 1})
    meta = json.loads(recorder.finish()[0].read_text())["meta"]
    assert meta["env"]["NCCL_ALGO"] == "Ring"


def test_a_second_interrupt_while_writing_is_ignored(tmp_path):
    """Ctrl-C again while an interrupted run writes what finished (here: during the chart)
    would lose the chart and end in a traceback: ``gemmlab`` ignores it until it is done."""
    import os
    import signal
    import types

    from bench.cli import run

    def plot_interrupted(rows, path):
        os.kill(os.getpid(), signal.SIGINT)  # ignored: the chart is still drawn
        path.write_bytes(b"\x89PNG")

    def command(args, console):
        Recorder(tmp_path, plot_interrupted).add({"x": 1})
        raise KeyboardInterrupt

    class Quiet:
        def print(self, *args, **kwargs):
            pass

    assert run(types.SimpleNamespace(func=command), Quiet()) == 130
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["interrupted"] is True
    assert (tmp_path / "results.png").read_bytes() == b"\x89PNG"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_stop_asked_on_any_rank_stops_every_rank_at_the_same_row(tmp_path):
    """Another rank got Ctrl-C: this one keeps its row, raises KeyboardInterrupt in ``add``
    (where every rank agrees), and its interrupt waits for the others after writing."""
    import pytest

    root = FakeComm(0, tmp_path, peer_stops=True)
    recorder = Recorder(tmp_path, plot, comm=root)
    with pytest.raises(KeyboardInterrupt):
        recorder.add({"x": 1})
    paths = recorder.interrupt()
    assert json.loads(paths[0].read_text())["rows"] == [{"x": 1}]
    assert root.barriers == [["results.csv", "results.json", "results.jsonl", "results.png"]]
