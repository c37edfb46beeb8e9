"""Provenance in results files (bench.recording.provenance, collect_meta) and how the README's
tables name it (bench.readme_tables); CPU only."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from bench import readme_tables as rt
from bench import recording as results

REPO = Path(__file__).resolve().parent.parent
HAS_GIT = shutil.which("git") is not None
needs_git = pytest.mark.skipif(not HAS_GIT, reason="no git executable")
PREFIXES = ("NCCL_", "CUDA_", "OMPI_", "MPICH_")


def git(cwd, *args) -> bytes:
    return subprocess.run(["git", "-c", "user.name=Test", "-c", "user.email=test@example.com",
                           "-c", "commit.gpgsign=false", *args], cwd=cwd, check=True,
                          capture_output=True).stdout


@pytest.fixture(autouse=True)
def plain_env(tmp_path, monkeypatch):
    """No declared commit, no git variables pointing elsewhere, and no repository search
    above tmp_path."""
    for name in ("GEMMLAB_GIT_COMMIT", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))


@pytest.fixture
def repo(tmp_path, monkeypatch):
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q")
    (path / "kernel.cu").write_text("// one\n")
    git(path, "add", "kernel.cu")
    git(path, "commit", "-q", "-m", "first")
    monkeypatch.setattr(results, "REPO", path)
    return path


def head(path) -> str:
    return git(path, "rev-parse", "HEAD").decode().strip()


@needs_git
def test_clean_checkout(repo):
    prov = results.provenance()
    assert prov["git_commit"] == head(repo) and len(prov["git_commit"]) == 40
    assert prov["git_dirty"] is False
    assert prov["git_diff_sha256"] is None
    assert prov["declared_commit"] is None


@needs_git
def test_modified_tracked_file_is_dirty_with_the_diff_hash(repo):
    # Not UTF-8: the diff is hashed as bytes.
    (repo / "kernel.cu").write_bytes(b"// two caf\xe9\n")
    expected = hashlib.sha256(subprocess.run(["git", "diff", "HEAD"], cwd=repo, check=True,
                                             capture_output=True).stdout).hexdigest()
    prov = results.provenance()
    assert prov["git_commit"] == head(repo)
    assert prov["git_dirty"] is True
    assert prov["git_diff_sha256"] == expected


@needs_git
def test_an_untracked_file_alone_is_not_dirty(repo):
    (repo / "notes.txt").write_text("scratch\n")
    prov = results.provenance()
    assert prov["git_commit"] == head(repo)
    assert prov["git_dirty"] is False and prov["git_diff_sha256"] is None


@needs_git
def test_no_repository_records_no_commit_and_the_declared_one_apart(tmp_path, monkeypatch):
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "kernel.cu").write_text("// one\n")
    monkeypatch.setattr(results, "REPO", copy)
    prov = results.provenance()
    assert (prov["git_commit"], prov["git_dirty"], prov["git_diff_sha256"]) == (None, None, None)
    assert prov["declared_commit"] is None
    monkeypatch.setenv("GEMMLAB_GIT_COMMIT", "0123abc")
    meta = results.collect_meta()
    assert meta["declared_commit"] == "0123abc"
    assert meta["git_commit"] is None and meta["git_dirty"] is None


def test_git_missing_records_no_commit(tmp_path, monkeypatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    prov = results.provenance()
    assert (prov["git_commit"], prov["git_dirty"], prov["git_diff_sha256"]) == (None, None, None)
    assert results.git_commit() == "unknown"


@needs_git
def test_declared_commit_never_replaces_the_real_head(repo, monkeypatch):
    monkeypatch.setenv("GEMMLAB_GIT_COMMIT", "0123abc")
    prov = results.provenance()
    assert prov["declared_commit"] == "0123abc"
    assert prov["git_commit"] == head(repo)
    assert results.git_commit() == head(repo)
    (repo / "kernel.cu").write_text("// two\n")
    assert results.git_commit() == head(repo) + "-dirty"


def test_env_records_nccl_cuda_and_mpi_variables(monkeypatch):
    for name in list(os.environ):
        if name.startswith(PREFIXES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "4")
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    monkeypatch.setenv("OMPI_X", "y")
    monkeypatch.setenv("MPICH_Y", "z")
    monkeypatch.setenv("FOO", "1")
    env = results.provenance()["env"]
    assert env == {"NCCL_MAX_NCHANNELS": "4", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "OMPI_X": "y",
                   "MPICH_Y": "z"}
    assert list(env) == ["CUDA_DEVICE_MAX_CONNECTIONS", "MPICH_Y", "NCCL_MAX_NCHANNELS",
                         "OMPI_X"]


def test_writing_results_does_not_initialise_mpi():
    code = ("import json, sys; import bench.recording as r; m = r.collect_meta(); "
            "print(json.dumps([m['mpi_version'], 'mpi4py.MPI' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True,
                         text=True, timeout=300).stdout
    assert json.loads(out.splitlines()[-1]) == [None, False]


def test_mpi_version_from_an_imported_mpi4py(monkeypatch):
    fake = types.ModuleType("mpi4py.MPI")
    fake.Get_library_version = lambda: "MPICH Version:\t4.2.0\nMPICH Release date:\tx\n"
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", fake)
    assert results.provenance()["mpi_version"] == "MPICH Version:\t4.2.0"
    fake.Get_library_version = lambda: 1 / 0
    assert results.provenance()["mpi_version"] is None


def test_nccl_version(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert results.provenance()["nccl_version"] is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 28, 9))
    assert results.provenance()["nccl_version"] == "2.28.9"

    def broken():
        raise RuntimeError("no NCCL")

    monkeypatch.setattr(torch.cuda.nccl, "version", broken)
    assert results.provenance()["nccl_version"] is None


BASE = {"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "command": "gemmlab x"}
TAIL = ", NVIDIA H200, torch 2.11.0, Triton 3.6.0; command: `gemmlab x`."
SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("meta,commit", [
    ({"git_commit": SHA, "git_dirty": False, "git_diff_sha256": None}, "commit `0123456`"),
    ({"git_commit": SHA, "git_dirty": True, "git_diff_sha256": "fedcba9876543210" * 4},
     "commit `0123456` (dirty, diff sha256 fedcba987654)"),
    ({"git_commit": SHA + "-dirty"}, "commit `0123456` (dirty)"),  # files before git_dirty
    ({"git_commit": "6d5e28a"}, "commit `6d5e28a`"),
    ({"git_commit": None, "declared_commit": "abcdef0123"},
     "declared commit `abcdef0` (a copied tree; not verified)"),
    # A copy that carries an old .git: both, the declared one first.
    ({"git_commit": SHA, "git_dirty": True, "declared_commit": "abcdef0123"},
     "declared commit `abcdef0` (a copied tree; not verified; the copy's own git HEAD, stale: "
     "`0123456` with changes)"),
    ({"git_commit": SHA, "declared_commit": SHA}, "declared commit `0123456` (a copied tree; "
     "not verified)"),  # files before git_dirty: whether the copy had changes is unknown
    # The copy's own git found the declared commit as HEAD and said whether the tree differs.
    ({"git_commit": SHA, "git_dirty": False, "declared_commit": "0123456"}, "commit `0123456`"),
    ({"git_commit": SHA, "git_dirty": True, "git_diff_sha256": "fedcba9876543210" * 4,
      "declared_commit": "0123456"}, "commit `0123456` (dirty, diff sha256 fedcba987654)"),
    ({"git_commit": None, "declared_commit": None}, "commit `?`"),
])
def test_table_provenance_names_the_commit_and_its_state(meta, commit):
    assert rt._provenance("d", BASE | meta) == f"Source: `d/results.json`, {commit}{TAIL}"


def test_table_provenance_states_the_warm_up_when_the_file_records_it():
    meta = BASE | {"git_commit": SHA, "git_dirty": False,
                   "timing": {"warmup_ms": 1000.0, "rep_ms": 100.0, "rounds": 3}}
    assert rt._provenance("d", meta) == ("Source: `d/results.json`, commit `0123456`"
                                         + TAIL[:-1] + "; kernel times after a 1000 ms "
                                         "warm-up.")


@pytest.mark.parametrize("argv0,program", [
    ("/venv/bin/gemmlab", "gemmlab"), (str(REPO / "bench" / "cli.py"), "gemmlab"),
    (str(REPO / "bench" / "train_stages.py"), "python3 -m bench.train_stages"),
    (str(REPO / "profiling" / "overhead.py"), "python3 -m profiling.overhead"),
    ("/elsewhere/tool.py", "tool.py")])
def test_the_recorded_command_is_how_the_process_was_started(monkeypatch, argv0, program):
    from bench.recording import collect_meta

    monkeypatch.setattr(sys, "argv", [argv0, "a b", "--out", "runs/x"])
    assert collect_meta()["command"] == f"{program} 'a b' --out runs/x"


@pytest.mark.parametrize("flags", [["-X", "dev", "-c"], ["-Sc"]])
def test_code_given_with_python_c_is_recorded(monkeypatch, flags):
    from bench.recording import collect_meta

    code = "import sys; from bench.cli import main; sys.exit(main())"
    monkeypatch.setattr(sys, "argv", ["-c", "bench", "--out", "runs/x"])
    monkeypatch.setattr(sys, "orig_argv", ["python3", *flags, code, "bench", "--out", "runs/x"])
    assert collect_meta()["command"] == f"python3 -c '{code}' bench --out runs/x"
