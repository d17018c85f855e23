"""Synthetic scenes generation speed on this machine (run on demand, not a test).

    python bench/data_synth.py [--images 5000] [--repeats 2] [--write]

Times ``generate_synthetic`` (what ``ltd data synth`` and ``ltd demo`` call) from an empty folder,
with all cores and with one worker, and checks that two runs with the same seed wrote byte-identical
JSON and images. With ``--write`` the table replaces the section "## Synthetic dataset generation" in
BENCHMARKS.md. Target: 5,000 images in ≤ 60 s on 2 cores.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import publish  # noqa: E402
from training.data.synthetic import generate_synthetic  # noqa: E402
from training.fsio import sha256_file  # noqa: E402

SECTION = "## Synthetic dataset generation (bench/data_synth.py)"


def tree_digest(root: Path) -> str:
    """sha256 over every file's relative path and digest, in sorted order."""
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(root)}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def timed_run(n: int, workers: int | None, tmp: Path, name: str) -> tuple[float, str, int]:
    out = tmp / name
    t0 = time.perf_counter()
    generate_synthetic(out, n_images=n, seed=0, workers=workers)
    secs = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    digest = tree_digest(out)
    shutil.rmtree(out)
    return secs, digest, size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--repeats", type=int, default=2, help="runs with all cores (best time reported)")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    if args.images < 1 or args.repeats < 2:
        p.error("--images must be ≥ 1 and --repeats ≥ 2 (the determinism check compares two runs)")
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ltd-bench-synth-") as d:
        tmp = Path(d)
        runs = [timed_run(args.images, None, tmp, f"all{i}") for i in range(args.repeats)]
        print(f"all cores: {[round(r[0], 1) for r in runs]} s", flush=True)
        one = timed_run(args.images, 1, tmp, "one")
        print(f"one worker: {one[0]:.1f} s", flush=True)
    digests = {r[1] for r in runs} | {one[1]}
    best = min(r[0] for r in runs)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    command = "python " + " ".join(["bench/data_synth.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [
        SECTION, "",
        f"Machine: {cpu}, {cores} cores, Python {platform.python_version()}. Date: {time.strftime('%Y-%m-%d')}. "
        f"Command: `{command}` (1-min load average at start: {load:.1f}).", "",
        f"`generate_synthetic` from an empty folder: {args.images:,} images of 224 px (JPEG) with 5 captions each, "
        f"seed 0, JSON + images written to a temp dir ({runs[0][2] / 2**20:.0f} MB).", "",
        "| what | time (s) | images/s | target |",
        "|---|---:|---:|---|",
        f"| {cores} worker processes (default), best of {args.repeats} | {best:.1f} | {args.images / best:,.0f} | "
        f"≤ 60 s for 5,000: {'met' if args.images / best >= 5000 / 60 else '**missed**'} |",
        f"| 1 worker | {one[0]:.1f} | {args.images / one[0]:,.0f} | |",
        "",
        f"Byte-identical output across the {args.repeats + 1} runs (sha256 over every file, both worker counts): "
        f"**{'yes' if len(digests) == 1 else 'NO'}**.",
    ]
    text = "\n".join(lines)
    publish(SECTION, text, args.write)
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
