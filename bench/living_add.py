"""Adding 1,000 images to a served index while it answers text searches: search latency during the add
against idle, errors, and add throughput against offline `ltd index` on the same images, same engine.

    python bench/living_add.py [--dataset .../dataset_flickr8k.json] [--add 1000] [--concurrency 8] [--write]

1. trains the benches' tiny model (bench/_models.py: one epoch on 60 synthetic scenes; the image side is
   the real EfficientNet-Lite0 at 224 px, which is what embedding costs) and indexes the dataset's test
   split with it (`ltd index --runtime R`, R the resolved ``--runtime``);
2. serves a copy of that index with `ltd serve --writable --no-ui`, its image runtime pinned to
   ``--runtime`` (``LTD_IMAGE_RUNTIME``; auto: what the model would pick here, resolved once), the
   uploads embedded by its write embedder process (search/embed_process.py; ``--write-in-process``:
   on its write thread), warmed by one add of an image not among those timed;
3. the load: bench/api_load.py's keep-alive client (bench/_load_client.py) in a child process, text →
   image searches (k = 10) at ``--concurrency`` in flight, queries drawn from the index's own captions;
   idle for ``--idle`` requests, then all through the add, then idle again;
4. the add: the dataset's val images (``--add`` of them, none in the index) over REST, ``POST
   /api/models/{name}/items`` multipart, 32 files a request (the server's ``max_items_per_add``),
   ``--in-flight`` requests at a time (default 1; the server runs them one after another); each answer
   checked (``added`` true, a new id), the served count read back;
5. offline: `ltd index --images-dir` on the same images with the same checkpoint and engine (the same
   ``--runtime``), the server stopped, timed as a whole command and from its "loading the model" log line on.

Search latency "during the add" counts the requests sent between the first add request and the last
answer. Everything runs in ``--tmp`` (outside the repository); the dataset is read where it lies.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _server  # noqa: E402
from bench._common import publish, read_section, replace_marked  # noqa: E402
from bench._machine import load1, machine_line, today  # noqa: E402

SECTION = "## Adding images while serving (bench/living_add.py)"
DATASET = "/work/shared/datasets/flickr8k/dataset_flickr8k.json"
PER_REQUEST = 32
TARGETS = {"p99_ratio": 2.0, "errors": 0, "throughput": 0.8}


# ---- the load, in a child process -----------------------------------------------------------------
async def _load(host: str, port: int, bodies: list[bytes], k: int, concurrency: int, stop: Path,
                limit: int, parent: int | None = None) -> dict:
    from bench._load_client import RawConnection, _check

    starts, lat, errors = [], [], {}
    nxt = 0

    def stopped() -> bool:  # asked to, or orphaned: the bench that started it is gone (killed, failed)
        return stop.exists() or (parent is not None and os.getppid() != parent) or not stop.parent.is_dir()

    async def worker(conn: RawConnection) -> None:
        nonlocal nxt
        while nxt < limit and not (nxt % 16 == 0 and stopped()):
            body = bodies[nxt % len(bodies)]
            nxt += 1
            t_wall, t0 = time.time(), time.perf_counter()
            try:
                status, data = await conn.post_json("/api/search/text", body)
                why = _check(status, data, k)
            except Exception as e:  # a connection error counts, the load goes on
                await conn.close()
                why = type(e).__name__
            starts.append(t_wall)
            lat.append((time.perf_counter() - t0) * 1000)
            if why:
                errors[why] = errors.get(why, 0) + 1

    conns = [RawConnection(host, port) for _ in range(concurrency)]
    await asyncio.gather(*(worker(c) for c in conns))
    for c in conns:
        await c.close()
    return {"start": starts, "ms": lat, "errors": errors}


def load_child(spec: dict) -> int:
    """``--load-child SPEC.json``: send searches until ``spec['limit']`` are done or ``spec['stop']`` exists."""
    rng = np.random.default_rng(spec["seed"])
    texts = spec["texts"]
    bodies = [json.dumps({"query": texts[i], "model": spec["model"], "k": spec["k"]}).encode()
              for i in rng.integers(0, len(texts), 20_000)]
    out = asyncio.run(_load("127.0.0.1", spec["port"], bodies, spec["k"], spec["concurrency"], Path(spec["stop"]),
                            spec["limit"], spec.get("parent")))
    Path(spec["out"]).write_text(json.dumps(out))
    return 0


class Load:
    """The load client as a child process (its CPU is not the server's, nor the adder's GIL)."""

    def __init__(self, tmp: Path, name: str, spec: dict):
        self.out, self.stop = tmp / f"{name}.json", tmp / f"{name}.stop"
        spec = {**spec, "out": str(self.out), "stop": str(self.stop), "parent": os.getpid()}
        (tmp / f"{name}.spec.json").write_text(json.dumps(spec))
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--load-child",
                                      str(tmp / f"{name}.spec.json")], cwd=ROOT)

    def finish(self) -> dict:
        self.stop.touch()
        if self.proc.wait(timeout=600) != 0:
            raise RuntimeError(f"the load client failed ({self.proc.returncode})")
        return json.loads(self.out.read_text())


def _stats(ms: list[float]) -> dict:
    a = np.asarray(ms)
    return {"requests": len(a), "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max())}


# ---- the steps --------------------------------------------------------------------------------------
def ltd(*args: str, log: Path | None = None) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if log is not None:
        log.write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"ltd {' '.join(args)} failed:\n{(p.stdout + p.stderr)[-3000:]}")
    return wall, p.stdout + p.stderr


def new_images(dataset: Path, n: int, out: Path, split: str = "val") -> list[Path]:
    """The first ``n`` images of a split of the dataset, copied into ``out`` (outside the repository)."""
    data = json.loads(dataset.read_text())
    root = dataset.parent / "images"
    names = [im["filename"] for im in data["images"] if im["split"] == split][:n]
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(root / name, out / name)
    return [out / name for name in names]


def add_all(base: str, model: str, files: list[Path], in_flight: int = 1) -> dict:
    """POST ``files`` in requests of ``PER_REQUEST``, ``in_flight`` of them at a time (each sent when one
    of those before it is answered); every answer checked."""
    import httpx

    ids, errors, per = [], {}, []
    parts = [files[a:a + PER_REQUEST] for a in range(0, len(files), PER_REQUEST)]

    def send(c: httpx.Client, part: list[Path]):
        t = time.perf_counter()
        r = c.post(f"/api/models/{model}/items", files=[("file", (p.name, p.read_bytes(), "image/jpeg")) for p in part])
        return part, r, time.perf_counter() - t

    t0 = time.time()
    with httpx.Client(base_url=base, timeout=600) as c, ThreadPoolExecutor(in_flight, thread_name_prefix="add") as pool:
        for part, r, took in pool.map(lambda part: send(c, part), parts):
            per.append(took)
            if r.status_code != 201:
                errors[f"HTTP {r.status_code}"] = errors.get(f"HTTP {r.status_code}", 0) + 1
                continue
            items = r.json()["items"]
            bad = [it for it in items if not it.get("added")]
            if len(items) != len(part) or bad:
                errors["not added"] = errors.get("not added", 0) + len(part) - len(items) + len(bad)
            ids += [it["id"] for it in items]
        t1 = time.time()
        total = c.get(f"/api/models/{model}/items", params={"limit": 1}).json()["total"]
    return {"t0": t0, "t1": t1, "wall_s": t1 - t0, "ids": len(set(ids)), "errors": errors, "total_after": total,
            "request_s": per}


def after_model_load(log: str, ended: float) -> float | None:
    """Seconds from ``ltd index``'s "loading the model" log line (HH:MM:SS, local time) to its exit at ``ended``
    (epoch seconds): the command without its interpreter start and imports. None without that line."""
    m = re.search(r"^(\d\d):(\d\d):(\d\d) \S+ ltd\.index: loading the model", log, re.M)
    if m is None:
        return None
    end = time.localtime(ended)
    at = time.mktime((end.tm_year, end.tm_mon, end.tm_mday, *map(int, m.groups()), 0, 0, -1))
    return ended - at + (86_400 if at > ended else 0)


def resolved_runtime(ckpt: Path, name: str) -> str:
    """The image runtime ``name`` stands for with this checkpoint's backbone on this machine."""
    if name != "auto":
        return name
    from indexer.build import load_model

    return load_model(ckpt).model.image.backbone.image_runtime().name


def run(args) -> dict:
    from bench._models import tiny_checkpoint
    from indexer import image_roots
    from indexer.index import read_manifest

    tmp = Path(tempfile.mkdtemp(prefix="living_add_", dir=args.tmp))
    res = {"machine": machine_line(), "date": today(), "command": "python bench/living_add.py " + " ".join(args.argv), "nice": os.nice(0),
           "load1_start": load1(), "concurrency": args.concurrency, "tmp": str(tmp),
           "torch_threads": args.torch_threads}
    dataset = Path(args.dataset)
    t = time.perf_counter()
    ckpt = tiny_checkpoint(tmp, image_size=224)
    res["train_s"] = time.perf_counter() - t
    res["runtime"] = runtime = resolved_runtime(ckpt, args.runtime)
    res["write_in_process"], res["in_flight"] = args.write_in_process, args.in_flight
    res["base_index_s"], _ = ltd("index", "--checkpoint", str(ckpt), "--dataset", str(dataset), "--split", "test",
                                 "--images-root", str(dataset.parent / "images"), "--out", str(tmp / "base"),
                                 "--runtime", runtime, "--no-progress")
    files = new_images(dataset, args.add, tmp / "new")
    # added before the timing (a train image: not in the index, not among those timed): the write embedder is up
    (warm_file,) = new_images(dataset, 1, tmp / "warm", split="train")
    served = shutil.copytree(tmp / "base", tmp / "served")
    image_roots.record(served, read_manifest(served)["image_roots"])
    manifest = read_manifest(served)
    res["base_images"] = manifest["counts"]["images"]
    texts = json.loads((served / manifest["files"]["captions.json"]["file"]).read_text())["texts"]
    serve_args = ["--model", f"ltd={served}", "--writable", "--no-ui", "--log-level", "warning",
                  "--torch-threads", str(args.torch_threads)] + (["--write-in-process"] if args.write_in_process else [])
    with _server.serving(serve_args, tmp / "serve.log", timeout=600, env={"LTD_IMAGE_RUNTIME": runtime}) as (srv, base):
        res["warm_add_s"] = add_all(base, "ltd", [warm_file])["wall_s"]
        port = int(base.rsplit(":", 1)[1])
        spec = {"port": port, "model": "ltd", "k": 10, "concurrency": args.concurrency, "texts": texts}
        Load(tmp, "warm", {**spec, "seed": 9, "limit": 300}).finish()
        idle_cpu = _server.cpu_seconds(srv.pid)
        before = Load(tmp, "idle_before", {**spec, "seed": 1, "limit": args.idle})
        res["idle_before"] = before.proc.wait(timeout=600) == 0 and json.loads(before.out.read_text())
        res["idle_server_cpu_s"] = _server.cpu_seconds(srv.pid) - idle_cpu
        during = Load(tmp, "during", {**spec, "seed": 2, "limit": 10**9})
        time.sleep(2.0)  # the child is up and loading the server before the first add
        cpu0 = _server.cpu_seconds(srv.pid), _server.children_cpu_seconds(srv.pid)
        add = add_all(base, "ltd", files, args.in_flight)
        cpu1 = _server.cpu_seconds(srv.pid), _server.children_cpu_seconds(srv.pid)
        res["embedder_priority"] = _server.children_priority(srv.pid)
        res["during"] = during.finish()
        after = Load(tmp, "idle_after", {**spec, "seed": 3, "limit": args.idle})
        res["idle_after"] = after.proc.wait(timeout=600) == 0 and json.loads(after.out.read_text())
    res["add"] = {k: v for k, v in add.items() if k != "request_s"}
    res["add"]["request_p50_s"] = float(np.median(add["request_s"]))
    res["add"]["server_cpu_s"], res["add"]["embedder_cpu_s"] = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    cpu = _server.waited_children_cpu_seconds()
    wall, log = ltd("index", "--checkpoint", str(ckpt), "--images-dir", str(tmp / "new"), "--out",
                    str(tmp / "offline"), "--runtime", runtime, "--no-progress", log=tmp / "offline.log")
    res["offline"] = {"wall_s": wall, "images": read_manifest(tmp / "offline")["counts"]["images"],
                      "after_load_s": after_model_load(log, time.time()), "cpu_s": _server.waited_children_cpu_seconds() - cpu}
    res["load1_end"] = load1()
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def summarise(res: dict) -> dict:
    d = res["during"]
    t0, t1 = res["add"]["t0"], res["add"]["t1"]
    inside = [ms for s, ms in zip(d["start"], d["ms"]) if t0 <= s <= t1]
    idle = res["idle_before"]["ms"] + res["idle_after"]["ms"]
    out = {"idle": _stats(idle), "idle_before": _stats(res["idle_before"]["ms"]),
           "idle_after": _stats(res["idle_after"]["ms"]), "during": _stats(inside),
           "search_errors": sum(sum(r["errors"].values()) for r in (d, res["idle_before"], res["idle_after"])),
           "add_errors": sum(res["add"]["errors"].values())}
    out["p99_ratio"] = out["during"]["p99_ms"] / out["idle"]["p99_ms"]
    out["add_rate"] = res["add"]["ids"] / res["add"]["wall_s"]
    out["offline_rate"] = res["offline"]["images"] / res["offline"]["wall_s"]
    out["throughput"] = out["add_rate"] / out["offline_rate"]
    after = res["offline"]["after_load_s"]
    out["offline_rate_after_load"] = res["offline"]["images"] / after if after else None
    out["throughput_after_load"] = out["add_rate"] / out["offline_rate_after_load"] if after else None
    out["qps_during"] = len(inside) / (t1 - t0)
    ib = res["idle_before"]
    out["idle_cores"] = res["idle_server_cpu_s"] / (ib["start"][-1] + ib["ms"][-1] / 1000 - ib["start"][0]) \
        if "idle_server_cpu_s" in res else None
    return out


INTRO = f"""\
Served: `ltd serve --writable --no-ui`, a copy of a 1,000-image index (the Flickr8k test split, the benches'
tiny model: bench/_models.py, EfficientNet-Lite0 at 224 px), the image runtime pinned to the one offline
`ltd index` uses; the server embeds the uploads in its write embedder process (search/embed_process.py,
nice +5 and batch-scheduled by default), or with `--write-in-process` on its write thread (search/writes.py).
Load: bench/api_load.py's
keep-alive client (bench/_load_client.py), text → image searches (k = 10) at concurrency 8, from a child
process, idle before and after the add and all through it. Added: 1,000 Flickr8k val images (not in the
index) over REST, {PER_REQUEST} per `POST /api/models/{{name}}/items`, one request at a time (unless a block says
more are kept in flight), after one
warm-up add of another image (a train image). Offline: `ltd index --images-dir` on the same images, same checkpoint,
same `--runtime`, the server stopped."""


def nice_prefix(res: dict) -> str:
    """``nice -n N `` when the bench ran below normal priority (records before ``nice`` was kept: none)."""
    return f"nice -n {res['nice']} " if res.get("nice") else ""


def priority(res: dict) -> str:
    """What the write embedder ran at, where the record says (those before 2026-12-07 do not)."""
    return f" Write embedder: {res['embedder_priority']}." if res.get("embedder_priority") not in (None, "none") else ""


def mode(res: dict) -> str:
    return " --write-in-process" if res.get("write_in_process") else ""


def render(res: dict, s: dict) -> str:
    ok = lambda good: "yes" if good else "**no**"  # noqa: E731
    a, off = res["add"], res["offline"]
    in_flight = f", {res['in_flight']} add requests in flight" if res.get("in_flight", 1) > 1 else ""
    lines = [f"### `ltd serve --torch-threads {res['torch_threads']}{mode(res)}`{in_flight}", "",
             f"Machine: {res['machine']}. Image runtime: {res.get('runtime', 'torch')}. "
             f"Date: {res['date']}. Command: `{nice_prefix(res)}{res['command']}` (1-minute "
             f"load {res['load1_start']:.1f} at the start, {res['load1_end']:.1f} at the end; compare "
             f"the ratios, measured in the same run). Index: {res['base_images']:,} images; "
             f"load at concurrency {res['concurrency']}." + priority(res), "",
             "| what | value | target | met |", "|---|---:|---:|:-:|",
             f"| search p50 / p99, idle (before and after the add: {s['idle']['requests']:,} requests) | "
             f"{s['idle']['p50_ms']:.1f} / {s['idle']['p99_ms']:.1f} ms | | |",
             f"| search p50 / p99 during the add ({s['during']['requests']:,} requests, {s['qps_during']:.0f}/s) | "
             f"{s['during']['p50_ms']:.1f} / {s['during']['p99_ms']:.1f} ms | | |",
             f"| p99 during / p99 idle | {s['p99_ratio']:.2f}× | ≤ {TARGETS['p99_ratio']:g}× | "
             f"{ok(s['p99_ratio'] <= TARGETS['p99_ratio'])} |",
             f"| errors (searches; adds) | {s['search_errors']}; {s['add_errors']} | 0 | "
             f"{ok(s['search_errors'] + s['add_errors'] == 0)} |",
             f"| images added (new ids; served count after) | {a['ids']:,}; {a['total_after']:,} | | |",
             f"| add throughput under load ({a['wall_s']:.1f} s; p50 {a['request_p50_s']:.2f} s per request of "
             f"{PER_REQUEST}) | {s['add_rate']:.1f} images/s | | |",
             f"| offline `ltd index` ({off['wall_s']:.1f} s, the whole command) | {s['offline_rate']:.1f} images/s | | |",
             f"| add throughput / offline | {100 * s['throughput']:.0f} % | ≥ {100 * TARGETS['throughput']:.0f} % | "
             f"{ok(s['throughput'] >= TARGETS['throughput'])} |"]
    if s["offline_rate_after_load"]:
        lines += [f"| offline from its model load on ({off['after_load_s']:.0f} s: interpreter start and imports left "
                  f"out) | {s['offline_rate_after_load']:.1f} images/s | | |",
                  f"| add throughput / offline from its model load on | {100 * s['throughput_after_load']:.0f} % | "
                  f"≥ {100 * TARGETS['throughput']:.0f} % | {ok(s['throughput_after_load'] >= TARGETS['throughput'])} |"]
    if "server_cpu_s" in a and "cpu_s" in off:
        embedder = "in the server's" if res.get("write_in_process") else \
            f"{a['embedder_cpu_s']:.1f} s ({1000 * a['embedder_cpu_s'] / max(1, a['ids']):.1f} ms per image)"
        lines += [f"| CPU during the add: the server's processes (searches included); its write embedder | "
                  f"{a['server_cpu_s']:.1f} s; {embedder} | | |",
                  f"| CPU of offline `ltd index` (the whole command) | {off['cpu_s']:.1f} s "
                  f"({1000 * off['cpu_s'] / max(1, off['images']):.1f} ms per image) | | |"]
    if s.get("idle_cores") and not res.get("write_in_process"):
        lines += [f"| the server process alone (its embedder left out), idle / during the add | {s['idle_cores']:.2f} / "
                  f"{(a['server_cpu_s'] - a['embedder_cpu_s']) / a['wall_s']:.2f} cores | | |"]
    lines += ["",
              f"Idle p99 before / after the add: {s['idle_before']['p99_ms']:.1f} / {s['idle_after']['p99_ms']:.1f} ms; "
              f"max during the add {s['during']['max_ms']:.0f} ms."]
    return "\n".join(lines) + "\n"


def section(res: dict, s: dict) -> str:
    """The whole section: the intro and every ``--torch-threads`` block, this run's replaced."""
    cur = read_section(SECTION) or ""
    if "<!-- living_add:" not in cur:
        cur = f"{SECTION}\n\n{INTRO}\n"
    key = f"living_add:torch-threads-{res['torch_threads']}" + ("-in-process" if res.get("write_in_process") else "") \
        + (f"-in-flight-{res['in_flight']}" if res.get("in_flight", 1) > 1 else "")
    return replace_marked(cur, key, render(res, s))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--load-child"]:
        return load_child(json.loads(Path(argv[1]).read_text()))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default=DATASET, help="a Karpathy JSON beside an images/ folder (test: the index, "
                                                      "val: the images added)")
    p.add_argument("--add", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--idle", type=int, default=2000, help="searches timed idle, before and again after the add")
    p.add_argument("--torch-threads", type=int, default=0, help="the server's (0: torch's default, one per core)")
    p.add_argument("--runtime", default="auto", choices=("auto", "torch", "onnxruntime", "openvino"),
                   help="the image runtime of the server and of offline `ltd index` (auto: resolved once, here)")
    p.add_argument("--in-flight", type=int, default=1, metavar="N",
                   help="add requests the uploader keeps in flight (the server runs them one at a time)")
    p.add_argument("--write-in-process", action="store_true", help="the server embeds writes on its write thread")
    p.add_argument("--tmp", default=None, help="folder for the run (default: the system temp)")
    p.add_argument("--keep", action="store_true", help="keep the run's folder")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    if args.in_flight < 1:
        p.error("--in-flight must be at least 1")
    args.argv = argv
    res = run(args)
    s = summarise(res)
    print(json.dumps({k: v for k, v in res.items() if k not in ("during", "idle_before", "idle_after")} | {"summary": s},
                     indent=2, default=str))
    publish(SECTION, section(res, s), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
