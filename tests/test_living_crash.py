"""The living index's writes as real kills: a writer is SIGKILLed before its N-th file operation or SQL
statement, for every N, during an add (uploads stored, then one transaction), a remove, an edit and a
compaction. After each kill: the write is wholly there or wholly absent, every write the writer had
acknowledged is there, nothing torn loads, and a re-run converges to what an uninterrupted run leaves.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _killer import killer_script

from indexer.index import Modality, VectorIndex, load_index_dir, save_index_dir

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

WRITER = killer_script(("mkdir", "replace", "rename", "unlink", "remove", "rmdir"), '''
    import sqlite3
    import numpy as np
    import indexer.items as items

    real_connect = sqlite3.connect

    class Counted:  # every SQL statement the store runs is a kill point too (COMMIT included)
        def __init__(self, conn):
            self._conn = conn

        def execute(self, *a, **k):
            counted(lambda: None)()
            return self._conn.execute(*a, **k)

        def executemany(self, *a, **k):
            counted(lambda: None)()
            return self._conn.executemany(*a, **k)

        def __getattr__(self, name):
            return getattr(self._conn, name)

    items.sqlite3.connect = lambda *a, **k: Counted(real_connect(*a, **k))
    from indexer.compact import compact
    from indexer.index import load_index_dir
    from indexer.items import ItemStore, NewImage

    op, target = sys.argv[2], sys.argv[3]

    def vec(seed):
        v = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
        return v / np.linalg.norm(v)

    ix = load_index_dir(target, verify="counts")
    if op != "create":
        store = ItemStore.open(ix)
        print("ARMED", count, flush=True)  # the steps of opening are covered by the "create" scenario
    if op == "create":
        print("ARMED", count, flush=True)
        ItemStore.open(ix).close()
    elif op == "add":
        rows = []
        for k in range(3):
            data = bytes([k]) * 100
            sha = f"{k:064x}"
            path = store.store_file(sha, ".png", data)
            rows.append(NewImage(vector=vec(k), sha256=sha, path=str(path), filename=f"n{k}.png",
                                 metadata={"k": k}, captions=[(f"caption {k}", f"caption {k}", vec(100 + k))]))
        seq, ids = store.add(rows)
        print("ACK", seq, flush=True)
    elif op == "remove":
        seq, found = store.remove([0, 1])
        print("ACK", seq, flush=True)
    elif op == "edit":
        print("ACK", store.edit(2, {"k": 99}, [("new words", "new words", vec(7))]), flush=True)
    elif op == "compact":
        store.close()
        compact(target)  # its own open of the store (a kill inside it included)
    with open(target + ".ack.tmp", "w") as f:  # a step after the write returned: a kill there must keep it
        f.write("done")
    os.replace(target + ".ack.tmp", target + ".ack")
    print("OPS", count)
''')


def _base(path: Path) -> None:
    """A small corpus index: 4 images, 4 captions (one each), 8-d unit vectors."""
    rng = np.random.default_rng(0)
    def unit(n):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)
    img, cap = unit(4), unit(4)
    save_index_dir(path, {"name": "x", "checkpoint_sha256": "abc", "factory": "Flat", "ground_truth": False},
                   Modality(VectorIndex.build(img), img, {"ids": [0, 1, 2, 3], "filenames": [f"b{i}" for i in range(4)],
                                                          "paths": [None] * 4, "captions": [[i] for i in range(4)],
                                                          "sha256": [None] * 4, "metadata": [{"k": -i} for i in range(4)]}),
                   Modality(VectorIndex.build(cap), cap, {"ids": [0, 1, 2, 3], "texts": [f"c{i}" for i in range(4)],
                                                          "image": [0, 1, 2, 3]}))


def _run(tmp_path: Path, kill_at: int, op: str, target: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "writer.py"
    if not script.exists():
        script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script), str(kill_at), op, str(target)], env=env,
                          capture_output=True, text=True, timeout=120)


def _state(path: Path) -> tuple:
    """What a server would serve: live image ids with their vectors and metadata, live captions."""
    from search.live import LiveIndex

    live = LiveIndex.open(load_index_dir(path))  # verifies every file: a torn generation raises
    snap = live.current
    im, cap = snap.index.images, snap.index.captions
    rows = [r for r in range(len(im.meta["ids"])) if not im.index.dead[r]]
    crows = [r for r in range(len(cap.meta["ids"])) if not cap.index.dead[r]]
    state = (sorted((int(im.meta["ids"][r]), tuple(np.round(im.vectors[r], 5)), str(sorted(live.metadata(r).items())))
                    for r in rows),
             sorted((int(cap.meta["ids"][r]), cap.meta["texts"][r], tuple(np.round(cap.vectors[r], 5))) for r in crows))
    if live.store is not None:  # no file under items/ that no live image names (after the sweep)
        live.store.remove_orphan_files(min_age=0)
        named = {p for (p,) in live.store.conn.execute(
            "SELECT path FROM images WHERE deleted_seq IS NULL AND path IS NOT NULL")}
        on_disk = {str(p) for p in live.store.files_folder().rglob("*") if p.is_file()}
        assert on_disk <= named, on_disk - named
        live.close()
    return state


@pytest.mark.parametrize("op,setup", [("create", []), ("add", ["create"]), ("remove", ["add"]), ("edit", ["add"]),
                                      ("compact", ["add", "remove"])])
def test_living_writes_killed_at_every_step(tmp_path, op, setup):
    base = tmp_path / "base" / "ix"
    _base(base)
    for s in setup:
        assert _run(tmp_path, 0, s, base).returncode == 0
    before = _state(base)
    ref = tmp_path / "ref" / "ix"
    shutil.copytree(base.parent, ref.parent)
    done = _run(tmp_path, 0, op, ref)
    assert done.returncode == 0, done.stderr[-2000:]
    total, after = int(done.stdout.split("OPS")[-1]), _state(ref)
    armed = int(done.stdout.split("ARMED")[1].split()[0])
    assert total - armed >= 3 and (before != after or op in ("compact", "create"))
    seen = set()
    for n in range(armed + 1, total + 1):
        work = tmp_path / f"kill{n}"
        shutil.copytree(base.parent, work)
        target = work / "ix"
        res = _run(tmp_path, n, op, target)
        assert res.returncode == -9, (n, res.returncode, res.stderr[-800:])
        state = _state(target)
        assert state in (before, after), f"{op} killed before step {n}: neither the old state nor the new one"
        if "ACK" in res.stdout:  # acknowledged: durable
            assert state == after, f"{op} killed before step {n}, after its acknowledgement: the write was lost"
        seen.add("old" if state == before else "new")
        if op != "compact" and state == after:
            continue  # done; re-running an add or a remove would be a second write
        rerun = _run(tmp_path, 0, op, target)
        assert rerun.returncode == 0, rerun.stderr[-800:]
        assert _state(target) == after, f"a re-run after a kill at step {n} did not converge"
    assert seen == {"old", "new"} or (op in ("compact", "create") and seen == {"old"})
