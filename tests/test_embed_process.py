"""The write path's embedder process (search/embed_process.py): the same vectors as the server's own
model, the server's errors for bad uploads, a lower priority, no pickle on the pipe, and a child that
dies — killed mid-write, or orphaned by its server — never leaves a write half done or a process behind."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import Pipe
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import torch
from test_living_index import png

from indexer.build import load_model
from indexer.index import read_manifest
from search.embed_process import EmbedderSpec, ProcessEmbedder, child_nice, run_in_background
from search.errors import BadRequest, NotReady, UnsupportedMediaType
from search.media import UploadDecoder
from search.registry import resolve_checkpoint
from training.fsio import sha256_file

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def checkpoint(tiny_index_pair) -> Path:
    index = Path(tiny_index_pair["ltd"])
    return resolve_checkpoint(index, read_manifest(index), None)


@pytest.fixture(scope="module")
def embedder(checkpoint):
    proc = ProcessEmbedder(
        EmbedderSpec(checkpoint=str(checkpoint), sha256=sha256_file(checkpoint), nice=child_nice(10))
    )
    yield proc
    proc.close()


def nice_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_the_child_gives_the_servers_vectors_at_a_lower_priority(embedder, checkpoint):
    uploads = [png(s) for s in range(5)]
    min_side = 2 * load_model(checkpoint).model.image.backbone.preprocess.resize
    decoded = []
    got = embedder.embed(uploads, min_side, on_decoded=lambda: decoded.append(1))
    model, decoder = load_model(checkpoint).model.eval(), UploadDecoder()
    with torch.inference_mode():
        want = model.image(model.image.prepare([decoder.decode(u, min_side) for u in uploads])).float().numpy()
    assert got.shape == want.shape and decoded == [1]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert nice_of(embedder.pid) == min(19, os.nice(0) + 10)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="the batch scheduling policy is Linux's")
def test_a_background_thread_is_niced_and_batch_and_so_are_the_threads_it_starts():
    """``run_in_background``: the calling thread's nice raised (never lowered) and SCHED_BATCH, inherited by
    the threads it starts (the image runtime's pool, in the child); the other threads keep theirs."""
    seen = {}

    def child():
        tid = threading.get_native_id()
        seen["child"] = (os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid))

    def background(nice):
        tid = threading.get_native_id()
        run_in_background(nice)
        run_in_background(0)  # a lower value leaves the nice as it is
        seen["self"] = (os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid))
        t = threading.Thread(target=child)
        t.start()
        t.join()

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=background, args=(min(19, base + 3),))
    t.start()
    t.join()
    assert seen["self"] == seen["child"] == (min(19, base + 3), os.SCHED_BATCH)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER and os.getpriority(os.PRIO_PROCESS, 0) == base


def test_a_refused_priority_change_leaves_the_thread_as_it_was(monkeypatch, caplog):
    def refused(*a):
        raise PermissionError("refused")

    monkeypatch.setattr(os, "setpriority", refused, raising=False)
    monkeypatch.setattr(os, "sched_setscheduler", refused, raising=False)
    result = []
    t = threading.Thread(target=lambda: result.append(run_in_background(19)))
    t.start()
    t.join()
    assert result == [None] and "could not" in caplog.text


def test_the_child_stores_the_uploads_it_embeds(embedder, tmp_path):
    """``embed_and_store``: the same vectors as ``embed``, and each upload written whole under the folder,
    named by its sha256, with the record (sha256, path, file metadata) an in-process add makes of it."""
    from search.write_images import save_upload

    uploads, folder = [png(s) for s in (11, 12, 11)], tmp_path / "items"
    vectors, records = embedder.embed_and_store(uploads, 128, folder)
    np.testing.assert_allclose(vectors, embedder.embed(uploads, 128), atol=1e-6)
    for data, rec in zip(uploads, records):
        assert Path(rec["path"]).read_bytes() == data and rec["sha256"] == hashlib.sha256(data).hexdigest()
        assert {k: v for k, v in rec.items() if k != "metadata"} == \
            {k: v for k, v in save_upload(tmp_path / "again", data).items() if k != "metadata"} | {"path": rec["path"]}
        assert rec["metadata"]["width"] == 64 and rec["metadata"]["bytes"] == len(data)
    assert len(list(folder.rglob("*.png"))) == 2  # the same bytes twice: one file
    with pytest.raises(UnsupportedMediaType):  # one upload is not an image: nothing is stored
        embedder.embed_and_store([png(13), b"not an image"], 128, tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_bad_uploads_are_the_servers_errors_and_the_child_serves_on(embedder):
    pid = embedder.pid or (embedder.start() or embedder.pid)
    with pytest.raises(UnsupportedMediaType):
        embedder.embed([png(1), b"this is not an image"], 128)
    with pytest.raises(BadRequest):  # an image type's magic bytes, then nothing decodable
        embedder.embed([b"\x89PNG\r\n\x1a\n" + b"\0" * 64], 128)
    assert embedder.embed([png(2)], 128).shape[0] == 1 and embedder.pid == pid


def test_nothing_on_the_pipe_is_unpickled(embedder, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(ForkingPickler, "loads", refuse)  # what Connection.recv() would unpickle with
    assert embedder.embed([png(3), png(4)], 128).shape[0] == 2


def test_a_child_killed_mid_write_fails_that_write_with_503_and_the_next_write_starts_another(embedder):
    embedder.start()
    old = embedder.pid
    with pytest.raises(NotReady):  # killed between decoding and answering with the vectors
        embedder.embed([png(s) for s in range(32)], 128, on_decoded=lambda: os.kill(old, signal.SIGKILL))
    assert embedder.embed([png(5)], 128).shape[0] == 1 and embedder.pid != old


def _frames(*frames):
    return [f if isinstance(f, bytes) else json.dumps(f).encode() for f in frames]


_SHA = "ab" * 32
_BAD_ANSWERS = {
    "a shape for other images": ("embed", _frames({"decoded": 1}, {"shape": [2, 4]}, b"\0" * 32)),
    "a shape that is not one": ("embed", _frames({"decoded": 1}, {"shape": "1x4"})),
    "a negative shape": ("embed", _frames({"decoded": 1}, {"shape": [1, -4]})),
    "a torn frame": ("embed", _frames({"decoded": 1}, {"shape": [1, 4]}, b"\0" * 15)),
    "a stored record outside the folder": ("store", _frames(
        {"decoded": 1}, {"shape": [1, 4]}, b"\0" * 16,
        [{"sha256": _SHA, "path": f"/elsewhere/ab/{_SHA}.png", "metadata": {}}])),
    "a record that is not a file's": ("files", _frames(
        {"decoded": 1, "skipped": {}}, {"shape": [1, 4]}, b"\0" * 16, [{"sha256": "no", "metadata": {}}])),
    "a file's record outside the ingest root": ("files", _frames(
        {"decoded": 1, "skipped": {}}, {"shape": [1, 4]}, b"\0" * 16,
        [{"sha256": _SHA, "path": "/etc/passwd", "metadata": {}}])),
    "skipped files that are not its paths": ("files", _frames({"decoded": 0, "skipped": {"5": "why"}})),
    "skipped files that are not a mapping": ("files", _frames({"decoded": 0, "skipped": ["why"]})),
}


@pytest.mark.parametrize("case", sorted(_BAD_ANSWERS))
def test_a_child_answering_what_was_not_asked_is_stopped_and_the_write_fails_with_503(case, tmp_path):
    """The parent checks every frame the child sends against its request: a child that answers another
    request's frame (or a broken one) is killed, the write is 503, and nothing it said is used."""
    call, frames = _BAD_ANSWERS[case]
    ours, theirs = Pipe()
    proc = ProcessEmbedder(EmbedderSpec(checkpoint="unused", sha256="0" * 64), timeout=10)
    proc._proc, proc._conn = subprocess.Popen(["sleep", "60"]), ours
    fake = proc._proc

    def child():
        head = json.loads(theirs.recv_bytes())
        for _ in range(head["n"]):
            theirs.recv_bytes()
        for frame in frames:
            theirs.send_bytes(frame)

    t = threading.Thread(target=child)
    t.start()
    with pytest.raises(NotReady):
        if call == "files":
            proc.embed_files([tmp_path / "a.png"], 128, tmp_path)
        elif call == "store":
            proc.embed_and_store([png(1)], 128, tmp_path)
        else:
            proc.embed([png(1)], 128)
    t.join(10)
    assert fake.wait(5) == -signal.SIGKILL and proc.pid is None


def test_a_checkpoint_changed_since_the_server_checked_it_is_refused(checkpoint):
    proc = ProcessEmbedder(EmbedderSpec(checkpoint=str(checkpoint), sha256="0" * 64))
    with pytest.raises(RuntimeError, match="changed on disk"):
        proc.start()
    proc.close()


def test_a_child_whose_server_is_killed_exits(checkpoint, tmp_path):
    script = tmp_path / "server.py"
    script.write_text(
        "import sys, time\n"
        "from search.embed_process import EmbedderSpec, ProcessEmbedder, child_nice\n"
        f"p = ProcessEmbedder(EmbedderSpec(checkpoint={str(checkpoint)!r}, sha256={sha256_file(checkpoint)!r}))\n"
        "p.start(); print(p.pid, flush=True); time.sleep(600)\n"
    )
    server = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    child = int(server.stdout.readline())
    assert Path(f"/proc/{child}").exists()
    server.kill()
    server.wait()
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break  # exited; a zombie until init reaps it
        time.sleep(0.1)
    alive = (
        Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    )
    assert not alive
