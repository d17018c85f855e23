"""Distributed embedding on Ray (extra ``[ray]``): ``ltd index --engine ray [--address HOST:PORT]``.

The corpus becomes a Ray Dataset with one row per shard (its kind, number and items: image paths or
caption texts). ``map_batches`` sends the rows to a pool of ``workers`` actors, each of which loads
the checkpoint's model once and, per row, embeds the items (images decoded in a worker process
beside the CNN, as locally) and writes the shard file (``indexer/shards.py``: whole or absent). The
driver then reads the shards back in item order and the index is built from them as on the local
engine. Shards already on disk are not sent again, so a killed run resumes where it stopped.

Without ``address`` the command starts a local Ray cluster on this machine and stops it at the end;
with one it joins an existing cluster (README: "Indexing on a Ray cluster"), whose nodes need this
package installed and the image files at the same paths (a shared file system).
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer import shards as sh
from training.errors import Unavailable
from training.progress import progress

log = logging.getLogger(__name__)


CAPTION_SHARD_FACTOR = 16


@dataclass
class RayOptions:
    address: str | None = None  # None: start a local cluster
    workers: int = 1  # actors (one model each)
    shard_size: int = 1024  # images per shard: each restarts the decode pipeline; a kill loses at most one
    shard_dir: Path | None = None  # default: next to the index directory, OUT.shards
    threads: int | None = None  # torch threads per actor; default cores / workers on a local cluster, else 1

    @property
    def caption_shard_size(self) -> int:
        """A caption costs ~1/200 of an image to embed (bi-GRU vs CNN + JPEG decoding on 2 cores), so
        caption shards hold 16× as many items: 1,024-caption shards spent more time in Ray's per-task
        hand-offs than in the encoder (0.05 s of work each)."""
        return CAPTION_SHARD_FACTOR * self.shard_size


@dataclass(frozen=True)
class ActorSetup:
    """What each embedding actor starts from. ``device`` is the driver's device setting when the run was
    submitted (``training.device``): the actor's process takes it as its own."""

    checkpoint: str
    folder: str  # the shard folder
    device: str
    runtime: str | None
    threads: int  # torch threads of the actor


class _Embedder:
    """One Ray actor: the model loaded once, then one shard per call."""

    def __init__(self, setup: ActorSetup):
        started = time.time()  # wall clock: the driver compares it with its own (exact on one machine)
        # lazy: in the actor, so the start-up time it reports includes loading torch and the model code
        import torch

        from indexer.build import load_model
        from training.device import set_device

        torch.set_num_threads(setup.threads)
        set_device(setup.device)  # this process computes where the driver asked
        self.lm = load_model(setup.checkpoint, setup.runtime)
        self.threads = setup.threads  # sizes the decoder pool: actors sharing a node must not each take all its cores
        self.folder = Path(setup.folder)
        self.init = (started, time.time())  # reported with the actor's first shard, then NaN

    def __call__(self, batch: dict) -> dict:
        # lazy: this module stays torch-free where it is unpickled (see __init__)
        from indexer.embed import embed_captions, embed_image_files
        from training.data.decode_pool import default_workers
        from training.progress import quiet

        t0 = time.perf_counter()
        names, counts = [], []
        with quiet():  # one actor's shards, silent as before: the driver counts them all
            for kind, index, start, stop, items in zip(batch["kind"], batch["index"], batch["start"], batch["stop"],
                                                       batch["items"]):
                shard = sh.Shard(str(kind), int(index), int(start), int(stop))
                items = [str(x) for x in items]
                positions = np.arange(shard.start, shard.stop)
                if shard.kind == "images":
                    decoders = default_workers(len(items), 32, self.threads)
                    vecs, failed = embed_image_files(self.lm.model, items, workers=decoders)
                    ok = np.array([p for k, p in enumerate(positions) if k not in failed], np.int64)
                    sh.write_shard(self.folder, shard, ok, vecs, {int(positions[k]): r for k, r in failed.items()})
                else:
                    sh.write_shard(self.folder, shard, positions, embed_captions(self.lm.model, items))
                names.append(shard.name)
                counts.append(len(items))
        init, self.init = self.init, (float("nan"), float("nan"))
        pad = [float("nan")] * (len(names) - 1)
        return {"name": np.array(names), "n": np.array(counts), "init_start": np.array([init[0], *pad]),
                "init_end": np.array([init[1], *pad]), "work_s": np.array([time.perf_counter() - t0, *pad])}


# Where the last run's time went (``ray_embed`` fills it; benchmarks and the log read it).
last_timings: dict[str, float] = {}


def _timings(t_start: float, t_end: float, rows: list[dict], workers: int) -> dict[str, float]:
    """Split a Ray run's wall time: cluster start, until the first actor began loading (process start,
    imports, scheduling), model load, embedding (per worker), and the rest (shard hand-offs, output)."""
    starts = [r["init_start"] for r in rows if np.isfinite(r["init_start"])]
    loads = [r["init_end"] - r["init_start"] for r in rows if np.isfinite(r["init_start"])]
    work = float(np.nansum([r["work_s"] for r in rows]))
    out = {"wall_s": t_end - t_start, "actor_start_s": (min(starts) - t_start) if starts else float("nan"),
           "model_load_s": max(loads) if loads else float("nan"), "embedding_s": work / max(1, workers)}
    out["other_s"] = out["wall_s"] - out["actor_start_s"] - out["model_load_s"] - out["embedding_s"]
    return out


def start_cluster(opts: RayOptions, threads: int) -> bool:
    """Join ``opts.address``, or start a local cluster sized for the actors; False when Ray was already up."""
    import ray  # lazy: optional extra (.[ray])

    if ray.is_initialized():
        return False
    # A local cluster's workers run at this command's priority: Ray's default raises their niceness
    # by 15, so beside any other busy process they would get a small share of the cores.
    kw = {} if opts.address else {"num_cpus": max(os.cpu_count() or 1, opts.workers * threads) + 1,
                                  "object_store_memory": 300 * 2**20, "include_dashboard": False,
                                  "_system_config": {"worker_niceness": 0}}
    ray.init(address=opts.address, log_to_driver=False, logging_level=logging.WARNING, **kw)
    return True


def quiet_ray_data() -> None:
    """Our own progress bar reports the run: Ray Data's bars (logged every few seconds when stdout is
    not a terminal) and its INFO lines about the execution plan only add noise and driver work."""
    from ray.data import DataContext  # lazy: optional extra (.[ray])

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.enable_operator_progress_bars = False
    ctx.enable_auto_log_stats = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "progress bars disabled"


def _run(todo: list[sh.Shard], items: dict[str, list[str]], folder: Path, checkpoint: Path, opts: RayOptions,
         runtime: str | None) -> None:
    try:  # lazy: optional extra (.[ray]); its absence is reported
        import ray
    except ImportError:
        raise Unavailable("--engine ray needs Ray: pip install 'ltd-retrieval[ray]'") from None
    from training.device import default_device  # lazy: the module stays torch-free (see _Embedder)

    cores = os.cpu_count() or 1
    threads = opts.threads or (max(1, cores // opts.workers) if opts.address is None else 1)
    t_start = time.time()
    started = start_cluster(opts, threads)
    quiet_ray_data()
    try:
        rows = [{"kind": s.kind, "index": s.index, "start": s.start, "stop": s.stop,
                 "items": items[s.kind][s.start : s.stop]} for s in todo]
        ds = ray.data.from_items(rows, override_num_blocks=len(rows))
        setup = ActorSetup(str(checkpoint), str(folder), default_device(), runtime, threads)
        out = ds.map_batches(_Embedder, batch_size=1, compute=ray.data.ActorPoolStrategy(size=opts.workers),
                             num_cpus=threads, fn_constructor_kwargs={"setup": setup})
        total = sum(s.stop - s.start for s in todo)
        with progress(total, desc=f"embedding on Ray ({opts.workers} workers)", unit="item") as bar:
            rows = []
            for row in out.iter_rows():
                bar.update(int(row["n"]))
                rows.append({k: float(row[k]) for k in ("init_start", "init_end", "work_s")})
        last_timings.clear()
        last_timings.update(_timings(t_start, time.time(), rows, opts.workers))
        log.info("Ray run %.1f s: cluster + actors up after %.1f s, model load %.1f s, embedding %.1f s per worker, "
                 "the rest %.1f s", *(last_timings[k] for k in ("wall_s", "actor_start_s", "model_load_s",
                                                                 "embedding_s", "other_s")))
    finally:
        if started:
            ray.shutdown()


def ray_embed(checkpoint: str | Path, checkpoint_sha256: str, image_paths: list[Path], texts: list[str], dim: int,
              opts: RayOptions, *, runtime: str | None = None) -> tuple[np.ndarray, dict[int, str], np.ndarray]:
    """(image vectors of the readable images in order, {position: reason} of the others, caption vectors),
    embedded on the process's device (``training.device``), which the actors take as theirs."""
    items = {"images": [str(Path(p).resolve()) for p in image_paths], "captions": list(texts)}
    plan = {"checkpoint_sha256": checkpoint_sha256, "shard_size": opts.shard_size,
            "caption_shard_size": opts.caption_shard_size, "runtime": runtime or "",
            **{f"{k}_digest": sh.items_digest(v) for k, v in items.items()},
            **{f"{k}_count": len(v) for k, v in items.items()}}
    folder = sh.open_shard_dir(opts.shard_dir, plan)
    shards = sh.plan_shards({k: len(v) for k, v in items.items()}, opts.shard_size, opts.caption_shard_size)
    finished = sh.done(folder, shards)
    todo = [s for s in shards if s.name not in finished]
    if finished:
        log.info("resuming from %s: %d of %d shards already embedded", folder, len(finished), len(shards))
    if todo:
        _run(todo, items, folder, Path(checkpoint), opts, runtime)
    missing = [s.name for s in shards if not (folder / s.name).is_file()]
    if missing:
        raise Unavailable(f"the Ray run finished without shards {', '.join(missing[:3])}…; run the command again")
    ids, img, failed = sh.read_shards(folder, shards, "images", dim)
    order = np.argsort(ids, kind="stable")
    _, txt, _ = sh.read_shards(folder, shards, "captions", dim)
    return img[order], failed, txt


def remove_shards(opts: RayOptions) -> None:
    """After the index is committed the shards are no longer needed."""
    if opts.shard_dir is not None and (Path(opts.shard_dir) / "plan.json").is_file():
        shutil.rmtree(opts.shard_dir, ignore_errors=True)
