"""Distributed embedding on Ray: shards are whole or absent and tied to their plan, the Ray engine
gives the local engine's embeddings and report on the same data, and a killed run resumes from the
shards it finished (a real SIGKILL of a real `ltd index --engine ray`)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from indexer import shards as sh

ROOT = Path(__file__).resolve().parents[1]
ray_installed = pytest.mark.skipif(__import__("importlib").util.find_spec("ray") is None,
                                   reason="Ray is not installed (extra [ray])")


def test_shards_are_planned_written_whole_and_tied_to_their_plan(tmp_path):
    shards = sh.plan_shards({"images": 5, "captions": 3}, 2)
    assert [(s.kind, s.start, s.stop) for s in shards] == [("images", 0, 2), ("images", 2, 4), ("images", 4, 5),
                                                          ("captions", 0, 2), ("captions", 2, 3)]
    folder = sh.open_shard_dir(tmp_path / "s", {"plan": 1})
    sh.write_shard(folder, shards[1], np.array([2]), np.ones((1, 4)), {3: "corrupt"})
    sh.write_shard(folder, shards[0], np.array([0, 1]), np.zeros((2, 4)))
    assert sh.done(folder, shards) == {shards[0].name, shards[1].name}
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporaries left
    ids, vecs, failed = sh.read_shards(folder, shards[:2], "images", 4)
    assert ids.tolist() == [0, 1, 2] and vecs.shape == (3, 4) and failed == {3: "corrupt"}
    assert [(s.kind, s.start, s.stop) for s in sh.plan_shards({"images": 3, "captions": 5}, 2, 4)] == [
        ("images", 0, 2), ("images", 2, 3), ("captions", 0, 4), ("captions", 4, 5)]
    assert sh.open_shard_dir(tmp_path / "s", {"plan": 1}) and sh.done(folder, shards)  # same plan: kept
    sh.open_shard_dir(tmp_path / "s", {"plan": 2})  # another checkpoint or corpus: afresh
    assert sh.done(folder, shards) == set()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a shard folder"):
        sh.open_shard_dir(tmp_path / "other", {"plan": 1})


def test_ray_timings_split_the_wall_time_into_its_parts():
    from indexer.ray_engine import _timings

    nan = float("nan")
    rows = [{"init_start": 102.0, "init_end": 105.0, "work_s": 10.0},  # first shard of actor 1
            {"init_start": 103.0, "init_end": 107.0, "work_s": 12.0},  # first shard of actor 2
            {"init_start": nan, "init_end": nan, "work_s": 8.0}]
    t = _timings(100.0, 130.0, rows, workers=2)
    assert t["wall_s"] == 30.0 and t["actor_start_s"] == 2.0 and t["model_load_s"] == 4.0
    assert t["embedding_s"] == 15.0 and t["other_s"] == 9.0  # 30 - 2 - 4 - 30 / 2


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny trained checkpoint and the synthetic dataset it was trained on."""
    from app.pipeline import train_run
    from tests.conftest import tiny_config
    from training.prepare import resolve_dataset_path

    root = tmp_path_factory.mktemp("ray_model")
    res = train_run(tiny_config("none", ["train.epochs=1"]), root / "run")
    return res.run_dir / "best.pt", Path(resolve_dataset_path("", synthetic_images=60))


@pytest.mark.slow
@ray_installed
def test_ray_and_local_engines_give_the_same_embeddings_and_report(trained, tmp_path):
    from indexer.build import EmbedEngine, IndexRequest, build_dataset_index
    from indexer.evaluate import EvalOptions, evaluate_index
    from indexer.ray_engine import RayOptions

    ckpt, dataset = trained
    local = build_dataset_index(ckpt, dataset, "test", IndexRequest(tmp_path / "local"))
    opts = RayOptions(workers=2, shard_size=8, shard_dir=tmp_path / "shards")
    dist = build_dataset_index(ckpt, dataset, "test", IndexRequest(tmp_path / "ray", engine=EmbedEngine(ray=opts)))
    from indexer.ray_engine import last_timings
    assert last_timings["embedding_s"] > 0 and last_timings["model_load_s"] > 0
    assert last_timings["wall_s"] >= last_timings["actor_start_s"] + last_timings["model_load_s"]
    assert not (tmp_path / "shards").exists()  # removed once the index is committed
    assert dist.images.ids == local.images.ids and dist.captions.ids == local.captions.ids
    cos = np.sum(np.asarray(dist.images.vectors) * np.asarray(local.images.vectors), axis=1)
    assert cos.min() > 0.9999, cos.min()  # local reads float16 cached features, Ray embeds from the files
    np.testing.assert_allclose(dist.captions.vectors, local.captions.vectors, atol=1e-5)
    keys = [k for k in evaluate_index(local, EvalOptions(relevance=None)) if k != "meta"]
    a = evaluate_index(local, EvalOptions(relevance=None))
    b = evaluate_index(dist, EvalOptions(relevance=None))
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}


def _corpus(dataset: Path, tmp_path: Path) -> tuple[Path, Path]:
    import json

    d = json.loads(dataset.read_text())
    captions = tmp_path / "captions.txt"
    captions.write_text("\n".join(s["raw"] for im in d["images"] for s in im["sentences"]))
    return dataset.parent / "images", captions


@pytest.mark.slow
@ray_installed
def test_a_killed_ray_run_resumes_from_its_finished_shards(trained, tmp_path):
    from indexer.build import EmbedEngine, IndexRequest, build_corpus_index
    from indexer.ray_engine import RayOptions

    ckpt, dataset = trained
    images, captions = _corpus(dataset, tmp_path)
    out, shards = tmp_path / "ix", tmp_path / "ix.shards"
    cmd = [sys.executable, "-m", "app.cli", "index", "--checkpoint", str(ckpt), "--out", str(out), "--images-dir",
           str(images), "--captions-file", str(captions), "--engine", "ray", "--shard-size", "2", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not list(shards.glob("*.npz")):
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert list(shards.glob("*.npz")), "no shard written within the time limit"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and what it started in its session
        proc.wait(timeout=30)
    before = {p.name: p.stat().st_mtime_ns for p in shards.glob("*.npz")}
    plan = sh.plan_shards({"images": 60, "captions": 300}, 2, 32)
    assert 0 < len(before) < len(plan) and not out.exists()
    opts = RayOptions(shard_size=2, shard_dir=shards)
    import indexer.ray_engine as re_mod

    sent, done_at_resume = [], set()
    real_run = re_mod._run

    def spy(todo, *a, **k):
        # Ray's workers run outside the killed session and may finish a shard after `before` was taken
        # (atomically: whole or absent); the resumed run must skip whatever is finished when it starts.
        done_at_resume.update(p.name for p in shards.glob("*.npz"))
        sent.extend(todo)
        return real_run(todo, *a, **k)

    re_mod._run = spy
    try:
        ix = build_corpus_index(ckpt, IndexRequest(out, engine=EmbedEngine(ray=opts)), images_dir=images,
                                captions_file=captions)
    finally:
        re_mod._run = real_run
    assert set(before) <= done_at_resume and {s.name for s in sent}.isdisjoint(done_at_resume)
    assert len(sent) == len(plan) - len(done_at_resume)
    local = build_corpus_index(ckpt, IndexRequest(tmp_path / "local"), images_dir=images, captions_file=captions)
    assert ix.images.meta["filenames"] == local.images.meta["filenames"]
    cos = np.sum(np.asarray(ix.images.vectors) * np.asarray(local.images.vectors), axis=1)
    assert cos.min() > 0.99999
    np.testing.assert_allclose(ix.captions.vectors, local.captions.vectors, atol=1e-5)


@pytest.mark.slow
@ray_installed
def test_a_local_cluster_runs_its_workers_at_the_commands_priority(tmp_path):
    """Ray starts workers 15 nice levels below the raylet by default, so an index run beside any other
    busy process got a sliver of the cores. Run in a child niced by 3: its workers must stay at 3."""
    code = ("import os, ray\n"
            "from indexer.ray_engine import RayOptions, start_cluster\n"
            "assert start_cluster(RayOptions(), threads=1)\n"
            "assert not start_cluster(RayOptions(), threads=1)  # already up: joined, not restarted\n"
            "print('NICE', os.nice(0), ray.get(ray.remote(lambda: os.nice(0)).remote()))\n"
            "ray.shutdown()\n")
    out = subprocess.run(["nice", "-n", "3", sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"})
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("NICE")]
    assert line, out.stderr[-2000:]
    driver, worker = map(int, line[0].split()[1:])
    assert driver == os.nice(0) + 3 and worker == driver
