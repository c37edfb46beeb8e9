"""One GPT trained four ways: checkpoints of ``gemmlab train`` (atomic save, bit-exact resume
on one process and on two TP ranks, refusals), ``gemmlab generate`` and the stages' report
(``bench.train_stages``), on the CPU; multi-rank runs under ``mpiexec`` with a timeout."""

import io
import json
import re
import shutil

import pytest
import torch
from rich.console import Console
from test_comm import mpirun, needs_mpi

pytestmark = needs_mpi

# A tiny GELU model: four steps take well under a second.
MODEL = ("--device", "cpu", "--hidden", "32", "--heads", "4", "--seq", "16", "--batch", "4",
         "--layers", "1", "--activation", "gelu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real runs, each ``--out`` a directory here: ``serial`` (one process, 4 steps); at TP 2
    ``tp2`` (4 steps), ``tp2-first`` (2 steps, saved in ``ckpt``) and ``tp2-resumed`` (from
    ``ckpt`` to step 4, saved there again)."""
    root = tmp_path_factory.mktemp("runs")
    ckpt = str(root / "ckpt")
    for name, ranks, args in (
            ("serial", 1, ("--steps", "4")),
            ("tp2", 2, ("--tp", "2", "--steps", "4")),
            ("tp2-first", 2, ("--tp", "2", "--steps", "2", "--checkpoint", ckpt)),
            ("tp2-resumed", 2, ("--tp", "2", "--steps", "4", "--resume", ckpt,
                                "--checkpoint", ckpt))):
        result = mpirun(ranks, "-m", "bench.cli", "train", *MODEL, *args,
                        "--out", str(root / name))
        assert result.returncode == 0, result.stdout + result.stderr
    return root


def _results(runs, name):
    return json.loads((runs / name / "results.json").read_text())


def test_a_resumed_tp2_run_repeats_the_uninterrupted_losses_exactly(runs):
    from tp import checkpoint

    whole, first, resumed = (_results(runs, n) for n in ("tp2", "tp2-first", "tp2-resumed"))
    assert first["loss"] == whole["loss"][:2]
    assert resumed["loss"] == whole["loss"]  # ==: every bit of every step
    assert [(r["step"], r["loss"]) for r in resumed["rows"]] == [(2, whole["loss"][2]),
                                                                 (3, whole["loss"][3])]
    assert resumed["summary"]["resumed_from"] == 2 and whole["summary"]["resumed_from"] is None
    saved = runs / "ckpt" / "step-00000002"
    assert sorted(p.name for p in saved.iterdir()) == [
        "checkpoint.json", "model.pt", "rank-dp0-tp0.pt", "rank-dp0-tp1.pt"]
    manifest = checkpoint.read_manifest(saved)
    assert manifest["step"] == 2 and manifest["loss"] == whole["loss"][:2]
    assert manifest["settings"]["tp"] == 2 and manifest["settings"]["dp"] == 1
    assert manifest["settings"]["model"]["activation"] == "gelu"
    dense = torch.load(saved / "model.pt", weights_only=True)  # the TP = 1 layout
    assert dense["layers.0.fc1.weight"].shape == (32, 128)
    assert dense["layers.0.fc1.bias"].shape == (128,)
    assert dense["layers.0.fc2.weight"].shape == (128, 32)
    assert checkpoint.find(runs / "ckpt") == runs / "ckpt" / "step-00000004"  # the latest


def test_resuming_with_another_layout_is_refused_on_every_rank(runs):
    result = mpirun(2, "-m", "bench.cli", "train", *MODEL, "--dp", "2", "--steps", "4",
                    "--resume", str(runs / "ckpt" / "step-00000002"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == (f"error: --resume {runs / 'ckpt' / 'step-00000002'} was saved by "
                             f"another run or layout: tp 2 in the checkpoint, 1 here; dp 1 in "
                             f"the checkpoint, 2 here\n")


@pytest.mark.parametrize("argv, message", [
    (("--activation", "relu", "--tp", "2"), "activation 'gelu' in the checkpoint, 'relu' here"),
    (("--tp", "2", "--seed", "1", "--batch", "8"),
     "seed 0 in the checkpoint, 1 here; batch 4 in the checkpoint, 8 here"),
    (("--tp", "2", "--dtype", "bf16"), "dtype 'fp32' in the checkpoint, 'bf16' here"),
    (("--tp", "2", "--steps", "2"), "is at step 2: --steps 2 (the total, from step 0) leaves "
                                    "nothing to train"),
    (("--tp", "2", "--cuda-graph"), "--cuda-graph cannot be combined with --checkpoint or "
                                    "--resume"),
])
def test_checkpoint_options_that_cannot_work_are_usage_errors(runs, argv, message):
    from bench.cli import build_parser
    from bench.commands.train import _check_checkpoints, _config
    from bench.session import UsageError
    from tp.checkpoint import run_settings

    args = build_parser().parse_args(["train", *MODEL, "--steps", "4", *argv, "--resume",
                                      str(runs / "ckpt" / "step-00000002")])
    settings = run_settings(_config(args), tp=args.tp, dp=1, seed=args.seed,
                            sequence_parallel=False, batch=args.batch, lr=args.lr,
                            dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype],
                            device_type="cpu", backend=args.backend)
    with pytest.raises(UsageError, match=re.escape(message)):
        _check_checkpoints(args, settings)


def test_a_checkpoint_dir_holding_later_steps_needs_overwrite(runs):
    from bench.cli import build_parser
    from bench.commands.train import _check_checkpoints
    from bench.session import UsageError

    def check(*argv):
        args = build_parser().parse_args(["train", *MODEL, *argv])
        return _check_checkpoints(args, {})

    with pytest.raises(UsageError, match=r"holds checkpoints past step 0 \(step-00000002, "
                                         r"step-00000004\); pass --overwrite"):
        check("--checkpoint", str(runs / "ckpt"))
    assert check("--checkpoint", str(runs / "ckpt"), "--overwrite") == 0
    with pytest.raises(UsageError, match="--checkpoint-every must be >= 1 and needs "
                                         "--checkpoint DIR; got 2"):
        check("--checkpoint-every", "2")


def test_a_checkpoint_dir_that_cannot_be_written_is_refused_before_training(runs, monkeypatch):
    """Found by writing there (root ignores mode bits; an immutable directory refuses root
    too), before the first step: not after the last one, losing the run."""
    import tempfile

    from bench.cli import build_parser
    from bench.commands.train import _check_checkpoints
    from bench.session import UsageError

    def refused(**kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    args = build_parser().parse_args(["train", *MODEL, "--checkpoint", str(runs / "ckpt"),
                                      "--overwrite"])
    with pytest.raises(UsageError, match=r"--checkpoint .*ckpt is not writable \(Permission "
                                         r"denied\)"):
        _check_checkpoints(args, {})


def _one_rank():
    from mpi4py import MPI

    import tp.comm

    return tp.comm.create("mpi", MPI.COMM_SELF, "cpu")


def _train(steps, **kwargs):
    from tp.train import train
    from tp.transformer import GPTConfig

    comm = _one_rank()
    config = GPTConfig(seq_len=16, hidden=32, heads=4, layers=1, activation="gelu")
    return train(config, comm, comm, steps=steps, batch=4, seed=3, device=torch.device("cpu"),
                 **{"lr": 3e-3, **kwargs})


def test_one_process_resumes_exactly_and_an_interrupted_save_is_no_checkpoint(tmp_path,
                                                                              monkeypatch):
    from tp import checkpoint

    whole = _train(5)
    first = _train(3, checkpoint=tmp_path, checkpoint_every=2)
    assert first.loss == whole.loss[:3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000003"]
    for start in ("step-00000002", "step-00000003"):
        resumed = _train(5, resume=tmp_path / start)
        assert resumed.first_step == int(start[5:]) and len(resumed.step_ms) == 5 - int(start[5:])
        assert resumed.loss == whole.loss  # ==: every bit of every step
    with pytest.raises(ValueError, match="lr 0.003 in the checkpoint, 0.001 here"):
        _train(5, resume=tmp_path, lr=1e-3)

    # A save killed before its commit (here while writing the rank's file) leaves a
    # .partial directory, never a step-* one: the latest checkpoint is still step 3.
    real = checkpoint._fsynced

    def killed(path, obj):
        if path.name.startswith("rank-"):
            raise KeyboardInterrupt
        real(path, obj)

    monkeypatch.setattr(checkpoint, "_fsynced", killed)
    with pytest.raises(KeyboardInterrupt):
        _train(4, resume=tmp_path, checkpoint=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".step-00000004.partial", "step-00000002", "step-00000003"]
    assert checkpoint.find(tmp_path) == tmp_path / "step-00000003"
    monkeypatch.setattr(checkpoint, "_fsynced", real)
    assert _train(4, resume=tmp_path, checkpoint=tmp_path).loss == whole.loss[:4]
    assert checkpoint.find(tmp_path) == tmp_path / "step-00000004"
    assert not (tmp_path / ".step-00000004.partial").exists()  # the retry replaced it


def _generate(*argv):
    """``gemmlab generate argv`` in this process: (exit status, stdout)."""
    from bench.cli import build_parser, run

    out = io.StringIO()
    status = run(build_parser().parse_args(["generate", *argv]), Console(file=out, width=160))
    return status, out.getvalue()


def test_generate_is_deterministic_for_a_seed_and_greedy_ignores_it(runs):
    ckpt = str(runs / "ckpt")  # the TP 2 run's, gathered into the dense layout
    def draw(seed, *more):
        return _generate(ckpt, "--prompt", "def f(x):", "--tokens", "40", "--seed", seed,
                         "--device", "cpu", *more)

    once, again, other = draw("1"), draw("1"), draw("2")
    assert once[0] == again[0] == other[0] == 0
    assert once == again and once != other
    assert once[1].startswith("def f(x):")
    greedy = draw("1", "--temperature", "0")
    assert greedy == draw("2", "--temperature", "0") and greedy[0] == 0
    status, out = _generate(str(runs / "nothing"), "--prompt", "x", "--device", "cpu")
    assert status == 2 and out.startswith("error: ") and "is not a checkpoint" in out
    assert _generate(ckpt, "--prompt", "", "--device", "cpu") == (
        2, "error: --prompt must not be empty (the model continues a text)\n")


def test_an_incomplete_or_damaged_checkpoint_is_one_error_line(runs, tmp_path):
    """A copy of the TP 2 checkpoint without one rank's file cannot be resumed, and without
    (or with a damaged) model.pt cannot be read by generate: each a clear error, before any
    step."""
    import shutil

    from bench.cli import build_parser
    from bench.commands.train import _check_checkpoints
    from bench.session import UsageError
    from tp import checkpoint

    copy = tmp_path / "step-00000002"
    shutil.copytree(runs / "ckpt" / "step-00000002", copy)
    (copy / "rank-dp0-tp1.pt").unlink()
    args = build_parser().parse_args(["train", *MODEL, "--tp", "2", "--steps", "4",
                                      "--resume", str(copy)])
    settings = checkpoint.read_manifest(copy)["settings"]
    with pytest.raises(UsageError, match=f"--resume {copy} is incomplete: no rank-dp0-tp1.pt"):
        _check_checkpoints(args, settings)
    (copy / "model.pt").write_bytes(b"not a torch file")
    status, out = _generate(str(copy), "--prompt", "x", "--device", "cpu")
    assert status == 2 and out.startswith(f"error: cannot load {copy / 'model.pt'}: "), out
    (copy / "model.pt").unlink()
    assert _generate(str(copy), "--prompt", "x", "--device", "cpu") == (
        2, f"error: {copy} is incomplete: no model.pt\n")


def test_generate_sees_only_the_last_seq_len_tokens(runs):
    from tp import checkpoint
    from tp.generate import generate

    model, manifest = checkpoint.load_dense(runs / "ckpt", _one_rank())
    assert manifest["step"] == 4 and model.config.seq_len == 16
    prompt = torch.tensor(list(b"a long prompt, longer than the context of 16 bytes"))
    whole = generate(model, prompt, 12, temperature=0)
    cropped = generate(model, prompt[-16:], 12, temperature=0)
    assert len(whole) == len(prompt) + 12 and torch.equal(whole[:len(prompt)], prompt)
    assert torch.equal(whole[-12:], cropped[-12:])
    with pytest.raises(ValueError, match="non-empty 1-D tensor of ids in \\[0, 256\\)"):
        generate(model, torch.tensor([256]), 1)


def test_the_stages_report_compares_runs_of_one_model(runs, tmp_path, capsys):
    from bench import train_stages

    names = ("serial", "tp2", "tp2-resumed")
    out = tmp_path / "stages"
    assert train_stages.main([*(str(runs / n) for n in names), "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    serial, tp2, resumed = (_results(runs, n) for n in names)
    rows = report["rows"]
    assert [r["stage"] for r in rows] == ["DP 1 x TP 1, cpu", "DP 1 x TP 2, cpu",
                                          "DP 1 x TP 2, cpu"]
    assert report["baseline"] == "DP 1 x TP 1, cpu"
    assert rows[0]["speedup"] == 1.0 and rows[0]["max_loss_diff"] == 0.0
    assert [r["ranks"] for r in rows] == [1, 2, 2] and all(r["steps"] == 4 for r in rows)
    for row, run in zip(rows[1:], (tp2, resumed)):
        assert row["speedup"] == serial["summary"]["ms_per_step"] / run["summary"]["ms_per_step"]
        assert row["max_loss_diff"] == max(abs(a - b) for a, b in zip(run["loss"],
                                                                       serial["loss"]))
        assert row["final_loss"] == run["loss"][-1]
    # The runs' own difference (the loop above): rounding, or 0 where the CPU's kernels sum
    # TP 2's partial products in the serial run's order (seen on the GPU machine's host).
    assert rows[1]["max_loss_diff"] == rows[2]["max_loss_diff"] < 1e-4
    assert (out / "results.csv").read_text().splitlines()[0] == (
        "stage,dtype,ranks,steps,ms_per_step,tokens_per_s,speedup,final_loss,max_loss_diff")
    assert (out / "results.png").stat().st_size > 0

    other = tmp_path / "other"  # the serial run, as if trained from another seed
    shutil.copytree(runs / "serial", other)
    edited = _results(runs, "serial")
    edited["summary"]["seed"] = 1
    (other / "results.json").write_text(json.dumps(edited))
    capsys.readouterr()
    assert train_stages.main([str(runs / "serial"), str(other)]) == 2
    assert capsys.readouterr().out == (f"error: {other / 'results.json'} is not the same model "
                                       f"as {runs / 'serial' / 'results.json'}: seed 0 vs 1\n")
    assert train_stages.main([str(runs / "tp2"), str(runs / "tp2-resumed")]) == 2
    assert "no serial CPU run" in capsys.readouterr().out
