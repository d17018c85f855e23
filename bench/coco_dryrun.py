"""A COCO-scale dry run without COCO: a synthetic corpus generated, embedded and indexed end to end.

    python bench/coco_dryrun.py --checkpoint runs/x/best.pt [--images 120000] [--write]

1. `ltd data synth --images N` writes N synthetic scenes (224 px JPEGs, 5 captions each);
2. `ltd index --images-dir … --captions-file … --factory auto` embeds every image and caption with the
   checkpoint (image runtime ``auto``) and builds the index; progress is logged, and the final
   progress lines give the images/s and captions/s of each stage;
3. the wall time of each command is recorded, and the time for real COCO (123,287 images,
   616,767 captions) is projected from the measured rates (see the section for the assumptions).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import publish  # noqa: E402
from bench._machine import load1, machine_line, today  # noqa: E402

SECTION = "## COCO-scale dry run (bench/coco_dryrun.py)"
COCO_IMAGES, COCO_CAPTIONS = 123_287, 616_767
_LINE = re.compile(r"(image embeddings|caption embeddings): ([\d,]+)(?:/[\d,]+ \(\d+ %\))? (\w+) in (\d+) s")


def ltd(args: list[str], log: Path) -> float:
    env = dict(os.environ, LTD_PROGRESS="log", LTD_PROGRESS_INTERVAL="60")
    t = time.perf_counter()
    with log.open("w") as fh:
        subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                       check=True)
    return time.perf_counter() - t


def stage_seconds(log: Path) -> dict[str, tuple[int, float]]:
    """The last progress line of each stage: (count, seconds)."""
    out = {}
    for m in _LINE.finditer(log.read_text()):
        out[m.group(1)] = (int(m.group(2).replace(",", "")), float(m.group(4)))
    return out


def run(args) -> dict:
    res = {"machine": machine_line(), "date": today(), "images": args.images,
           "command": "python bench/coco_dryrun.py " + " ".join(args.argv), "load1_start": load1()}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        tmp = Path(tmp)
        res["synth_s"] = ltd(["data", "synth", "--out", str(tmp / "ds"), "--images", str(args.images)], tmp / "synth.log")
        res["load1_after_synth"] = load1()
        d = json.loads(next((tmp / "ds").glob("dataset_*.json")).read_text())
        caps = tmp / "captions.txt"
        caps.write_text("\n".join(s["raw"] for im in d["images"] for s in im["sentences"]))
        res["captions"] = sum(len(im["sentences"]) for im in d["images"])
        res["index_s"] = ltd(["index", "--checkpoint", args.checkpoint, "--images-dir", str(tmp / "ds" / "images"),
                              "--captions-file", str(caps), "--factory", "auto", "--out", str(tmp / "ix")], tmp / "index.log")
        res["stages"] = stage_seconds(tmp / "index.log")
        res["manifest"] = {k: v for k, v in json.loads((tmp / "ix" / "manifest.json").read_text()).items()
                           if k in ("counts", "indexes")}
        res["index_bytes"] = sum(p.stat().st_size for p in (tmp / "ix").iterdir())
    res["load1_end"] = load1()
    return res


def render(res: dict, coco_img_s: float | None) -> str:
    st = res["stages"]
    n_img, t_img = st.get("image embeddings", (res["images"], float("nan")))
    _, t_cap = st.get("caption embeddings", (0, float("nan")))
    img_s, cap_s = n_img / t_img, res["captions"] / t_cap if t_cap else float("inf")
    rest = res["index_s"] - t_img - t_cap
    proj_img = COCO_IMAGES / (coco_img_s or img_s)
    proj = proj_img + COCO_CAPTIONS / cap_s + rest * COCO_IMAGES / res["images"]
    total = res["synth_s"] + res["index_s"]
    lines = [SECTION, "", f"Machine: {res['machine']}. Date: {res['date']}. Command: `{res['command']}` (1-minute load: "
             f"{res['load1_start']:.1f} at the start, {res['load1_after_synth']:.1f} after generating, {res['load1_end']:.1f} at "
             "the end; 2 cores).", "",
             "| step | wall | rate |", "|---|---:|---:|",
             f"| `ltd data synth --images {res['images']:,}` (224 px JPEGs, 5 captions each) | {res['synth_s']:.0f} s | "
             f"{res['images'] / res['synth_s']:.0f} images/s |",
             f"| `ltd index --images-dir … --captions-file … --factory auto`: whole command | {res['index_s']:.0f} s | |",
             f"| of which image embeddings ({n_img:,} images, decode + CNN + head) | {t_img:.0f} s | {img_s:.1f} images/s |",
             f"| of which caption embeddings ({res['captions']:,} captions) | {t_cap:.0f} s | {cap_s:.0f} captions/s |",
             f"| of which the rest (model load, file hashes, index build, writing) | {rest:.0f} s | |",
             f"| **end to end** (generate + index) | **{total / 60:.1f} min** | |", "",
             f"Index: {json.dumps(res['manifest'].get('indexes'))}; {res['index_bytes'] / 2**20:.0f} MB on disk.", "",
             f"**Projected for real COCO** ({COCO_IMAGES:,} images, {COCO_CAPTIONS:,} captions) on this machine under the same "
             f"load: images {proj_img / 60:.0f} min at {coco_img_s or img_s:.1f} images/s"
             + (" (`--coco-img-s`: an end-to-end rate measured for 640×480 JPEGs, whose decoding costs more than these "
                "224 px scenes)" if coco_img_s else "") +
             f", captions {COCO_CAPTIONS / cap_s / 60:.0f} min at {cap_s:.0f} captions/s, the rest scaled linearly with "
             f"the corpus ({rest * COCO_IMAGES / res['images'] / 60:.0f} min; the captions' IVF-PQ build is not in it: "
             f"the 1M × 256-d build took about 2 min) = **about {proj / 3600:.1f} h**.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--images", type=int, default=120_000)
    p.add_argument("--coco-img-s", type=float, default=None,
                   help="images/s for 640×480 JPEGs end to end (from bench/embed_engines.py) for the projection")
    p.add_argument("--tmp", default=None)
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    res = run(args)
    print(json.dumps(res, indent=2))
    text = render(res, args.coco_img_s)
    publish(SECTION, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
