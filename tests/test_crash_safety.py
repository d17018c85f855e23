"""Crash safety as real kills: a writer process is SIGKILLed before its N-th file operation, for
every N, and what it leaves must be the old state or the new one, never a torn mix; a re-run then
converges to exactly what an uninterrupted run writes, with no temporary files left.

The writer runs in a subprocess whose ``os`` file operations (mkdir, replace, rename, unlink,
remove, rmdir) are wrapped to count, and to SIGKILL the process itself at the chosen count (tests/_killer.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _killer import killer_script

from indexer.index import IndexDirError, load_index_dir

ROOT = Path(__file__).resolve().parents[1]

# The writer: builds, overwrites or appends to an index directory from deterministic vectors.
WRITER = killer_script(("mkdir", "replace", "rename", "unlink", "remove", "rmdir"), '''
    import numpy as np
    from indexer.index import Modality, VectorIndex, append_to_index_dir, open_for_append, save_index_dir

    op, target = sys.argv[2], sys.argv[3]

    def unit(n, seed):
        x = np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def mods(seed, n_img, n_cap):
        img, cap = unit(n_img, seed), unit(n_cap, seed + 100)
        return (Modality(VectorIndex.build(img), img, {"ids": list(range(n_img)), "paths": [f"p{seed}_{i}" for i in range(n_img)],
                                                      "sha256": [f"h{seed}_{i}" for i in range(n_img)]}),
                Modality(VectorIndex.build(cap), cap, {"ids": list(range(n_cap)), "texts": [f"t{seed}_{i}" for i in range(n_cap)],
                                                      "image": [-1] * n_cap}))

    manifest = {"name": "x", "checkpoint_sha256": "abc", "factory": "Flat", "ground_truth": False}
    if op == "build":
        save_index_dir(target, manifest, *mods(1, 4, 6))
    elif op == "overwrite":
        save_index_dir(target, manifest, *mods(2, 5, 3), overwrite=True)
    elif op == "append":  # idempotent, as `ltd index --append` is: items already present are skipped
        ix = open_for_append(target)
        add = mods(3, 3, 2)
        have = set(ix.images.meta["sha256"])
        keep = [i for i, h in enumerate(add[0].meta["sha256"]) if h not in have]
        if keep:
            meta = {k: [v[i] for i in keep] for k, v in add[0].meta.items()}
            meta["ids"] = [max(ix.images.ids) + 1 + j for j in range(len(keep))]
            append_to_index_dir(ix, (add[0].vectors[keep], meta), None)
    elif op == "checkpoint":
        import torch
        from training.checkpoint import save_checkpoint
        save_checkpoint(target, {"model": {"w": torch.arange(int(sys.argv[4]))}, "config": {}, "vocab": {}})
    print("OPS", count)
''')


def _run(tmp_path: Path, kill_at: int, op: str, target: Path, *extra: str) -> subprocess.CompletedProcess:
    script = tmp_path / "writer.py"
    if not script.exists():
        script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script), str(kill_at), op, str(target), *extra], env=env,
                          capture_output=True, text=True, timeout=120)


def _state(path: Path) -> tuple | None:
    """What a reader sees: None (no index) or the index's content; raises on a torn index."""
    try:
        ix = load_index_dir(path)
    except IndexDirError as e:
        if "not an index directory" in str(e):
            return None
        raise
    return (ix.images.ids, ix.images.meta.get("sha256"), np.asarray(ix.images.vectors).round(6).tolist(),
            ix.captions.meta["texts"], np.asarray(ix.captions.vectors).round(6).tolist())


def _files(path: Path) -> list[str]:
    """File names, generation numbers masked: re-running a finished overwrite writes the same content
    as the next generation."""
    import re

    return sorted(re.sub(r"\.g\d+\.", ".gN.", p.name) for p in path.iterdir()) if path.exists() else []


def _scenario(tmp_path: Path, op: str, setup: list[str]):
    """(total ops, state before, state after, files after) of an uninterrupted run of ``op``."""
    base = tmp_path / "base" / "ix"
    for s in setup:
        assert _run(tmp_path, 0, s, base).returncode == 0
    before = _state(base)
    ref = tmp_path / "ref" / "ix"
    shutil.copytree(base.parent, ref.parent) if base.exists() else ref.parent.mkdir(parents=True)
    done = _run(tmp_path, 0, op, ref)
    assert done.returncode == 0, done.stderr
    total = int(done.stdout.split("OPS")[-1])
    return base, total, before, _state(ref), _files(ref)


@pytest.mark.slow
@pytest.mark.parametrize("op,setup", [("build", []), ("overwrite", ["build"]), ("append", ["build"])])
def test_index_write_killed_at_every_step(tmp_path, op, setup):
    base, total, before, after, after_files = _scenario(tmp_path, op, setup)
    assert before != after and total >= 8
    seen = set()
    for n in range(1, total + 1):
        work = tmp_path / f"kill{n}"
        shutil.copytree(base.parent, work) if base.exists() else work.mkdir()
        target = work / "ix"
        res = _run(tmp_path, n, op, target)
        assert res.returncode == -9, (n, res.returncode, res.stderr[-500:])
        state = _state(target)  # never torn: loading either fails cleanly as "no index" or gives a whole one
        assert state in (before, after), f"killed before op {n}: a mix of old and new"
        seen.add("old" if state == before else "new")
        rerun = _run(tmp_path, 0, op, target)
        assert rerun.returncode == 0, rerun.stderr
        assert _state(target) == after, f"re-run after a kill at op {n} did not converge"
        assert _files(target) == after_files, f"leftovers after a kill at op {n}: {_files(target)}"
    # the kills landed on both sides of the commit (a first build has nothing to do after it)
    assert seen == ({"old"} if op == "build" else {"old", "new"})


@pytest.mark.slow
def test_checkpoint_write_killed_keeps_the_old_one_and_cleans_up(tmp_path):
    import torch

    from training.checkpoint import load_checkpoint

    target = tmp_path / "run" / "checkpoint.pt"
    assert _run(tmp_path, 0, "checkpoint", target, "3").returncode == 0
    total = int(_run(tmp_path, 0, "checkpoint", tmp_path / "x" / "c.pt", "5").stdout.split("OPS")[-1])
    for n in range(1, total + 1):
        res = _run(tmp_path, n, "checkpoint", target, "5")
        assert res.returncode == -9
        got = load_checkpoint(target, required=("model",))["model"]["w"]
        assert torch.equal(got, torch.arange(3))  # the old checkpoint, whole
    assert any(p.name.startswith(".checkpoint.pt.tmp") for p in target.parent.iterdir())  # a killed write's temporary
    assert _run(tmp_path, 0, "checkpoint", target, "5").returncode == 0
    assert torch.equal(load_checkpoint(target, required=("model",))["model"]["w"], torch.arange(5))
    assert [p.name for p in target.parent.iterdir()] == ["checkpoint.pt"]  # the next save removed it


@pytest.mark.slow
def test_swapped_or_truncated_data_files_are_refused(tmp_path):
    """Files copied in from another index, or cut short, are not served; verify=counts skips hashes only."""
    for name in ("a", "b"):
        assert _run(tmp_path, 0, "build", tmp_path / name).returncode == 0
    assert _run(tmp_path, 0, "overwrite", tmp_path / "b").returncode == 0  # other vectors, other sizes
    a = json.loads((tmp_path / "a" / "manifest.json").read_text())
    b = json.loads((tmp_path / "b" / "manifest.json").read_text())
    # same shape, other values: a same-size swap only the hash can catch
    assert _run(tmp_path, 0, "build", tmp_path / "c").returncode == 0
    c_npy = tmp_path / "c" / json.loads((tmp_path / "c" / "manifest.json").read_text())["files"]["images.npy"]["file"]
    vec = np.load(c_npy)
    np.save(c_npy, vec[::-1].copy())
    with pytest.raises(IndexDirError, match="sha256"):
        load_index_dir(tmp_path / "c")
    load_index_dir(tmp_path / "c", verify="counts")  # same size and counts: only hashing sees the swap
    shutil.copy(tmp_path / "b" / b["files"]["captions.npy"]["file"], tmp_path / "a" / a["files"]["captions.npy"]["file"])
    with pytest.raises(IndexDirError, match="torn or replaced"):
        load_index_dir(tmp_path / "a", verify="counts")
    p = tmp_path / "b" / b["files"]["images.faiss"]["file"]
    p.write_bytes(p.read_bytes()[:-7])
    with pytest.raises(IndexDirError, match="torn or replaced"):
        load_index_dir(tmp_path / "b")


def test_old_format_is_refused_with_the_fix(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "name": "x"}))
    with pytest.raises(IndexDirError, match="--overwrite"):
        load_index_dir(tmp_path)


def test_interrupted_first_build_folder_is_reused_but_foreign_folders_are_not(tmp_path):
    from indexer.index import check_target

    d = tmp_path / "ix"
    d.mkdir()
    (d / "images.g0001.npy").write_bytes(b"partial")
    (d / ".images.g0001.faiss.tmp999999").write_bytes(b"x")
    assert check_target(d, overwrite=False) is None  # leftovers of a killed first build
    assert _run(tmp_path, 0, "build", d).returncode == 0
    assert ".images.g0001.faiss.tmp999999" not in _files(d) and load_index_dir(d)
    e = tmp_path / "photos"
    e.mkdir()
    (e / "holiday.jpg").write_bytes(b"not ours")
    with pytest.raises(FileExistsError, match="not an index"):
        check_target(e, overwrite=False)


def test_two_threads_writing_one_file_do_not_share_a_temporary(tmp_path):
    """Two requests uploading the same image write the same content-named file at once: each thread writes
    through its own temporary, so both writes succeed and the file is whole (with one temporary name per
    process, one thread's rename took the other's half-written file away)."""
    import threading

    from training.fsio import atomic_write_bytes, temp_name

    path, data, errors = tmp_path / "same.jpg", os.urandom(1 << 20), []
    names: set[Path] = set()
    start = threading.Barrier(8)

    def write() -> None:
        names.add(temp_name(path))
        start.wait()
        try:
            for _ in range(20):
                atomic_write_bytes(path, data)
        except OSError as e:  # FileNotFoundError when another thread renamed this thread's temporary
            errors.append(e)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(names) == 8
    assert path.read_bytes() == data and [p.name for p in tmp_path.iterdir()] == ["same.jpg"]
