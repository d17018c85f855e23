"""Sharded index directories (indexer/shards_index.py) searched in one process (search/sharded.py):
the same answers as one index, crash-safe writes, routing by inverted list."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _killer import killer_script

from indexer.index import IndexDirError, Modality, VectorIndex, read_manifest, save_index_dir
from indexer.shards_index import open_sharded, shard_index_dir
from indexer.shards_search import exact_top
from search.sharded import load_sharded, missing_shards

ROOT = Path(__file__).resolve().parents[1]
KILLS = 6  # kill points spread over the build (each costs two writer processes, ~4 s each)


def clustered(n: int, d: int, seed: int, centers: int = 64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centers, d)).astype(np.float32)
    x = c[rng.integers(0, centers, n)] + 0.35 * rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_index(path: Path, n_img: int, n_cap: int, factory: str = "Flat", d: int = 16, seed: int = 0) -> None:
    img, cap = clustered(n_img, d, seed), clustered(n_cap, d, seed + 1)
    links = [i % n_img for i in range(n_cap)]
    images = {"ids": [1000 + i for i in range(n_img)], "filenames": [f"f{i}.jpg" for i in range(n_img)],
              "captions": [[c for c in range(n_cap) if links[c] == i] for i in range(n_img)]}
    captions = {"ids": [5000 + c for c in range(n_cap)], "texts": [f"text {c}" for c in range(n_cap)], "image": links}
    build = (lambda v: VectorIndex.build(v, "Flat")) if factory == "Flat" else \
        (lambda v: VectorIndex.build(v, factory, nprobe=8, rerank=10))
    manifest = {"name": path.name, "checkpoint_sha256": "c" * 64, "factory": factory, "ground_truth": True}
    save_index_dir(path, manifest, Modality(build(img), img, images), Modality(build(cap), cap, captions))


def test_sharded_flat_gives_one_index_top_k(tmp_path):
    one, many = tmp_path / "one", tmp_path / "many"
    make_index(one, 300, 500)
    make_index(many, 300, 500)
    manifest = shard_index_dir(many, 3, "id")
    assert [s["counts"]["images"] for s in manifest["sharding"]["shards"]] == [100, 100, 100]
    assert not list(many.glob("images.g*")), "the unsharded generation's files are gone"
    from indexer.index import load_index_dir

    a, b = load_index_dir(one), load_sharded(many)
    q = clustered(20, 16, 9)
    for side in ("images", "captions"):
        sa, ra = getattr(a, side).index.search(q, 10)
        sb, rb = getattr(b, side).index.search(q, 10)
        np.testing.assert_array_equal(ra, rb)
        np.testing.assert_allclose(sa, sb, rtol=1e-5, atol=1e-5)
        assert getattr(b, side).meta == getattr(a, side).meta  # rows, ids and links as one index has them
        np.testing.assert_array_equal(getattr(b, side).vectors[ra[0]], getattr(a, side).vectors[ra[0]])
    np.testing.assert_allclose(b.images.vectors.scores(q[0]), np.asarray(a.images.vectors) @ q[0], rtol=1e-5)


def test_exact_top_reads_in_chunks():
    x = clustered(1000, 8, 3)
    q = clustered(4, 8, 4)
    s, r = exact_top(x, q, 7, chunk=64)
    want = np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(r, want)


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth)]))


@pytest.mark.parametrize("by", ["id", "list"])
def test_sharded_ivfpq_recall_matches_unsharded(tmp_path, by):
    one, many = tmp_path / "one", tmp_path / "many"
    make_index(one, 3000, 600, factory="IVF32,PQ8x4", d=32)
    make_index(many, 3000, 600, factory="IVF32,PQ8x4", d=32)
    shard_index_dir(many, 4, by)
    from indexer.index import load_index_dir

    a, b = load_index_dir(one), load_sharded(many)
    q = clustered(200, 32, 11)
    truth = np.argsort(-(q @ np.asarray(a.images.vectors).T), axis=1)[:, :10]
    r_one = _recall(a.images.index.search(q, 10)[1], truth)
    r_many = _recall(b.images.index.search(q, 10)[1], truth)
    assert r_many >= r_one - 0.01, (r_one, r_many)
    visits, queries = b.images.index.visits
    if by == "list":
        assert visits / queries < 4, "a query visits only the shards owning the lists it probes"
    else:
        assert visits == 4 * queries


def test_by_list_needs_ivf(tmp_path):
    make_index(tmp_path / "x", 50, 50)
    with pytest.raises(ValueError, match="IVF"):
        shard_index_dir(tmp_path / "x", 2, "list")


def test_a_shard_that_changed_is_refused(tmp_path):
    make_index(tmp_path / "x", 60, 60)
    m = shard_index_dir(tmp_path / "x", 2, "id")
    shard = tmp_path / "x" / m["sharding"]["shards"][1]["dir"]
    npy = next(shard.glob("images.g*.npy"))
    data = bytearray(npy.read_bytes())
    data[-1] ^= 1
    npy.write_bytes(bytes(data))
    with pytest.raises(IndexDirError, match="sha256|does not match"):
        load_sharded(tmp_path / "x")
    smf = shard / "manifest.json"
    smf.write_text(smf.read_text().replace('"shard": 1', '"shard": 7'))
    with pytest.raises(IndexDirError, match="shard 1"):
        open_sharded(tmp_path / "x")


def test_missing_shards_collects_only_inside_the_block(tmp_path):
    make_index(tmp_path / "x", 40, 40)
    shard_index_dir(tmp_path / "x", 2, "id")
    ix = load_sharded(tmp_path / "x")

    class Down:
        n = 2

        def __init__(self, real):
            self.real = real

        def submit(self, s, side, q, k):
            if s == 1:
                class Fail:
                    def result(self, timeout=None):
                        from search.sharded import ShardDown
                        raise ShardDown("gone")
                return Fail()
            return self.real.submit(s, side, q, k)

    ix.images.index.engine = Down(ix.images.index.engine)
    with missing_shards() as missing:
        s, r = ix.images.index.search(clustered(2, 16, 5), 5)
    assert missing == {1}
    assert (r >= 0).all() and all(row % 2 == 0 for row in r.ravel())  # shard 0 holds the even rows


# ---- crash safety: a killed shard build is never loaded ------------------------------------------
WRITER = killer_script(("mkdir", "replace", "rename", "unlink", "remove", "rmdir"), '''
    sys.path[:0] = [os.getcwd(), sys.argv[4]]
    from test_sharded_index import make_index
    from pathlib import Path
    from indexer.shards_index import shard_index_dir

    target = Path(sys.argv[3])
    if sys.argv[2] == "build":
        make_index(target, 30, 40)
        shard_index_dir(target, 3, "id")
    else:
        src = target.with_name(target.name + ".src")  # overwrite with another index, sharded anew
        make_index(src, 50, 20, seed=5)
        shard_index_dir(src, 2, "id", out=target, overwrite=True)
''')


def _run(script: Path, kill_at: int, op: str, target: Path) -> int:
    return subprocess.run([sys.executable, str(script), str(kill_at), op, str(target), str(ROOT / "tests")],
                          cwd=ROOT, capture_output=True, timeout=600).returncode


@pytest.mark.slow
def test_killed_shard_builds_leave_the_old_index_or_none(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    base = tmp_path / "base"
    assert _run(script, 0, "build", base) == 0
    before = load_sharded(base)
    old_ids = before.images.meta["ids"]
    probe = tmp_path / "probe"
    _run(script, 0, "build", probe)
    n_calls = _count_calls(script, tmp_path)
    assert n_calls > 10
    for kill_at in np.linspace(1, n_calls, KILLS).astype(int).tolist():  # kills spread over the writes
        fresh, again = tmp_path / f"fresh{kill_at}", tmp_path / f"again{kill_at}"
        _run(script, kill_at, "build", fresh)
        if (fresh / "manifest.json").is_file() and "sharding" in read_manifest(fresh):
            assert load_sharded(fresh).images.meta["ids"] == old_ids  # whole, or not sharded at all
        elif (fresh / "manifest.json").is_file():
            with pytest.raises(IndexDirError):
                open_sharded(fresh)
        subprocess.run(["cp", "-a", str(base), str(again)], check=True)
        _run(script, kill_at, "overwrite", again)
        ix = load_sharded(again)  # the old sharded index or the new one, never a mix
        assert ix.images.meta["ids"] in (old_ids, [1000 + i for i in range(50)])
        assert ix.manifest["sharding"]["count"] in (2, 3)
        subprocess.run(["rm", "-rf", str(again) + ".src"], check=True)
        assert _run(script, 0, "overwrite", again) == 0  # the next write cleans up
        names = {p.name for p in again.iterdir()}
        assert len([n for n in names if n.startswith("shards.g")]) == 1, names


def _count_calls(script: Path, tmp_path: Path) -> int:
    code = script.read_text().replace("os.kill(os.getpid(), signal.SIGKILL)", "pass")
    code += "\nprint(count)\n"
    counter = tmp_path / "count.py"
    counter.write_text(code)
    out = subprocess.run([sys.executable, str(counter), "0", "build", str(tmp_path / "counted"), str(ROOT / "tests")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    return int(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_batched_merge_equals_the_per_query_merge():
    """The front's one-array merge of every shard's answers gives each query what merging it alone gives:
    ties by row, missing rows (−1) dropped, fewer than k padded."""
    from search.live_views import top_rows
    from search.sharded import _merge

    rng = np.random.default_rng(3)
    for n, shards, k, width in ((7, 2, 5, 5), (5, 3, 10, 4), (4, 4, 3, 3), (3, 1, 8, 2)):
        answers, asked = {}, {}
        for s in range(shards):
            sc = rng.integers(0, 4, (n, width)).astype(np.float32) / 4  # few values: many ties
            rr = np.stack([rng.choice(np.arange(s, 1000, shards), width, replace=False) for _ in range(n)])
            rr[rng.random((n, width)) < 0.2] = -1  # a shard with fewer rows than asked
            answers[s], asked[s] = (sc, rr), list(range(n))
        got_s, got_r = _merge(answers, asked, n, k)
        for i in range(n):
            s = np.concatenate([answers[x][0][i] for x in answers])
            r = np.concatenate([answers[x][1][i] for x in answers])
            want_s, want_r = top_rows(s[r >= 0], r[r >= 0], k)
            assert got_r[i, : len(want_r)].tolist() == want_r.tolist()
            np.testing.assert_array_equal(got_s[i, : len(want_s)], want_s)
            assert (got_r[i, len(want_r):] == -1).all() and np.isneginf(got_s[i, len(want_s):]).all()
        partial = {s: (a[0][:2], a[1][:2]) for s, a in answers.items()}  # some shards asked fewer queries
        partial_asked = {s: [0, 1] for s in answers}
        if shards > 1:
            partial_asked[0] = [0, 1]
            partial[shards - 1] = (answers[shards - 1][0][:1], answers[shards - 1][1][:1])
            partial_asked[shards - 1] = [1]
            ps, pr = _merge(partial, partial_asked, 2, k)
            s = np.concatenate([partial[x][0][partial_asked[x].index(1)] for x in partial])
            r = np.concatenate([partial[x][1][partial_asked[x].index(1)] for x in partial])
            want_s, want_r = top_rows(s[r >= 0], r[r >= 0], k)
            assert pr[1, : len(want_r)].tolist() == want_r.tolist()


def test_top_rows_decides_ties_at_the_cut_by_row():
    """Rows tied with the k-th best score: the smaller rows are kept (argpartition alone keeps any)."""
    from search.live_views import top_rows

    rng = np.random.default_rng(0)
    for _ in range(300):
        m, k = int(rng.integers(1, 30)), int(rng.integers(1, 35))
        scores, rows = rng.integers(0, 4, m).astype(np.float32), rng.permutation(100)[:m]
        got_s, got_r = top_rows(scores, rows, k)
        order = np.lexsort((rows, -scores))[:k]
        assert got_r.tolist() == rows[order].tolist() and got_s.tolist() == scores[order].tolist()


class _Reply:
    def __init__(self, outcome):
        self.outcome, self.cancelled = outcome, False

    def result(self, timeout_s=None):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def cancel(self):
        self.cancelled = True


@pytest.mark.parametrize("first, second, whole", [
    ("died", "ok", True),        # its replica died with the call: sent once more, another replica answers
    ("died", "died", False),     # no live replica: one resend, then a missing shard
    ("error", "ok", False),      # the search itself failed: not resent
])
def test_a_call_whose_replica_died_is_sent_once_more(first, second, whole):
    ray = pytest.importorskip("ray")
    from indexer.shards_ray import RayShards, _Call
    from indexer.shards_search import ShardDown

    outcome = {"died": ray.exceptions.RayActorError(), "error": ValueError("bad"), "ok": ("scores", "rows")}
    replies = [_Reply(outcome[first]), _Reply(outcome[second])]
    sent = []
    shards = RayShards([None], ["s"], timeout=5.0, probe_s=0)

    def send():
        sent.append(1)
        return replies[len(sent) - 1]
    call = _Call(shards, 0, send)
    if whole:
        assert call.result() == ("scores", "rows") and shards.down() == []
    else:
        with pytest.raises(ShardDown):
            call.result()
        assert shards.down() == [0]
    assert len(sent) == (1 if first == "error" else 2)
