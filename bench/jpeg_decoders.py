"""JPEG decoders: Pillow (draft mode) against libjpeg-turbo's own API (simplejpeg, PyTurboJPEG) with DCT
scaling, per image and end to end through the CNN, with the embeddings and Flickr8k test recall compared.

    python bench/jpeg_decoders.py --dataset /work/shared/datasets/flickr8k [--checkpoint best.pt] [--write]

1. What one decoding worker does per image (decode, resize, centre crop, float tensor; one process,
   CPU time, best of 3 interleaved rounds) on (a) the Flickr8k test split's JPEGs (224×224: no DCT scaling), (b)
   COCO-sized 640×480 JPEGs (quality 90, bench/embed_engines.py's generator) decoded for a 224-pixel
   model (`ltd index`'s draft decoding: 1/2 scale) and (c) the same as uploads (`search/media.py` keeps
   the short side ≥ 448: full scale). PyTurboJPEG (1.x, over Debian's libturbojpeg0) is measured here
   only, at the scale Pillow's draft mode picks. Pixels are compared with Pillow's, image by image.
2. The CPU cost per image of the decode and of the float conversion (``to_tensor``), before and after
   issue 59's rewrite of the latter.
3. With ``--checkpoint``: the Flickr8k test split embedded end to end (`embed_image_files`: decoding in
   the default worker pool beside the CNN) as before (Pillow, numpy to_tensor), with Pillow and the new
   to_tensor, and as now (simplejpeg): images/s, R@k / rsum of each (captions embedded once), and the
   cosine between each image's embedding before and now.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import publish  # noqa: E402
from bench._machine import load1, machine_line, today  # noqa: E402

SECTION = "## JPEG decoders (bench/jpeg_decoders.py)"


def _turbojpeg():
    try:
        import turbojpeg

        return turbojpeg, turbojpeg.TurboJPEG()
    except (ImportError, RuntimeError, OSError):  # the package, or Debian's libturbojpeg0, is absent
        return None, None


def turbo_pixels(data: bytes, min_side: int):
    """PyTurboJPEG at the scale ``load_image``'s draft mode picks (power of two, short side ≥ min_side)."""
    from PIL import Image

    from training.data import jpeg

    tj_mod, tj = _turbojpeg()
    w, h, _, _ = tj.decode_header(data)
    size = (w, h)
    if min_side and min(w, h) > 2 * min_side:
        im = Image.open(__import__("io").BytesIO(data))
        sc = min_side / min(w, h)
        im.draft("RGB", (max(1, int(w * sc + 1)), max(1, int(h * sc + 1))))
        size = im.size
    s = jpeg.scale_of((w, h), size)
    arr = tj.decode(data, pixel_format=tj_mod.TJPF_RGB, scaling_factor=(1, s) if s > 1 else None)
    return Image.fromarray(arr)


def decode_rates(sets: dict[str, tuple[list[bytes], int]], rounds: int = 3) -> dict:
    from PIL import Image

    from training.data import jpeg
    from training.data.images import Preprocess, load_image

    pre = Preprocess()
    decoders = {"pillow": None, "simplejpeg": None}
    if _turbojpeg()[1] is not None:
        decoders["turbojpeg"] = None

    def pixels(name, data, min_side) -> Image.Image:
        if name == "turbojpeg":
            return turbo_pixels(data, min_side)
        jpeg.backend = name
        return load_image(data, min_side=min_side)

    out = {}
    for label, (datas, min_side) in sets.items():
        ref = [np.asarray(pixels("pillow", d, min_side)) for d in datas]
        row = {}
        for name in decoders:
            got = [np.asarray(pixels(name, d, min_side)) for d in datas]
            diff = max(int(np.abs(a.astype(np.int16) - b).max()) if a.shape == b.shape else 999 for a, b in zip(got, ref))
            row[name] = {"max_pixel_diff": diff, "best_s": float("inf"), "size": list(got[0].shape)}
        for _ in range(rounds):
            for name in decoders:
                t = time.process_time()  # CPU time: on a shared machine, wall time mostly measures the others
                for d in datas:
                    pre(pixels(name, d, min_side))
                row[name]["best_s"] = min(row[name]["best_s"], time.process_time() - t)
        for name in decoders:
            row[name]["images_s"] = len(datas) / row[name]["best_s"]
        out[label] = row
        print(label, json.dumps(row), flush=True)
    jpeg.backend = "simplejpeg" if jpeg.simplejpeg is not None else "pillow"
    return out


def numpy_to_tensor(pre, img):
    """``Preprocess.to_tensor`` as it was before issue 59 (the same numbers, five new arrays)."""
    import torch

    arr = np.asarray(img, dtype=np.float32) / 255.0
    arr = (arr - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))


def to_tensor_cost(datas: list[bytes], rounds: int = 3) -> dict:
    """CPU µs per view of the float conversion, before and after, beside the decode it follows."""
    from training.data.images import Preprocess, load_image

    pre = Preprocess()
    views = [pre.crops(load_image(d))[0] for d in datas]
    fns = {"decode (simplejpeg)": lambda d, v: load_image(d), "to_tensor, numpy (before)": lambda d, v: numpy_to_tensor(pre, v),
           "to_tensor, in place (now)": lambda d, v: pre.to_tensor(v)}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.process_time()
            for d, v in zip(datas, views):
                fn(d, v)
            best[name] = min(best[name], time.process_time() - t)
    return {k: 1e6 * v / len(datas) for k, v in best.items()}


VARIANTS = {"before": ("pillow", True), "pillow": ("pillow", False), "simplejpeg": ("simplejpeg", False)}


def end_to_end(checkpoint: str, dataset: str) -> dict:
    """The test split embedded end to end per variant (decoder, numpy to_tensor?), alternating, best of 2."""
    from indexer.build import load_model
    from indexer.embed import embed_captions, embed_image_files
    from indexer.metrics import retrieval_metrics
    from training.data import jpeg
    from training.data.images import Preprocess
    from training.data.karpathy import load_karpathy

    lm = load_model(checkpoint)
    sp = load_karpathy(dataset, drop_missing=True).split("test")
    paths = [im.path for im in sp.images]
    txt = embed_captions(lm.model, [c.raw for c in sp.captions])
    c2i = np.asarray(sp.caption_to_image)
    res, embeds, now = {}, {}, Preprocess.to_tensor
    for name in ("before", "simplejpeg", "pillow", "before", "simplejpeg", "pillow"):
        jpeg.backend, legacy = VARIANTS[name]
        Preprocess.to_tensor = numpy_to_tensor if legacy else now  # forked decoding workers inherit it
        try:
            t = time.perf_counter()
            img, failed = embed_image_files(lm.model, paths, batch_size=32)
            dt = time.perf_counter() - t
        finally:
            Preprocess.to_tensor = now
        assert not failed
        embeds[name] = img
        m = retrieval_metrics(img @ txt.T, c2i)
        res[name] = {"images_s": max(res.get(name, {}).get("images_s", 0), len(paths) / dt), "rsum": m["rsum"],
                     "load1": load1(), **{k: m[k] for k in ("i2t_R@1", "i2t_R@5", "i2t_R@10", "t2i_R@1", "t2i_R@5",
                                                            "t2i_R@10")}}
        print(name, json.dumps(res[name]), flush=True)
    jpeg.backend = "simplejpeg" if jpeg.simplejpeg is not None else "pillow"
    a, b = embeds["before"], embeds["simplejpeg"]
    cos = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    res["cosine"] = {"min": float(cos.min()), "mean": float(cos.mean()), "max_abs_diff": float(np.abs(a - b).max())}
    res["images"], res["checkpoint"] = len(paths), checkpoint
    return res


def run(args) -> dict:
    from bench.embed_engines import make_jpegs
    from training.data.karpathy import load_karpathy

    res = {"machine": machine_line(), "date": today(), "load1_start": load1(),
           "command": "python bench/jpeg_decoders.py " + " ".join(args.argv)}
    sp = load_karpathy(args.dataset, drop_missing=True).split("test")
    flickr = [im.path.read_bytes() for im in sp.images[: args.images]]
    with tempfile.TemporaryDirectory() as tmp:
        coco = [p.read_bytes() for p in make_jpegs(Path(tmp), args.coco)]
    res["sets"] = {"flickr": len(flickr), "coco": len(coco)}
    res["rates"] = decode_rates({"Flickr8k test, 224×224, for a 224-px model": (flickr, 224),
                                 "640×480, for a 224-px model (draft: 1/2 scale)": (coco, 224),
                                 "640×480 upload (short side ≥ 448: full scale)": (coco, 448)})
    res["to_tensor_us"] = to_tensor_cost(flickr)
    print(json.dumps(res["to_tensor_us"]), flush=True)
    if args.checkpoint:
        res["e2e"] = end_to_end(args.checkpoint, args.dataset)
    res["load1_end"] = load1()
    return res


def render(res: dict) -> str:
    names = list(next(iter(res["rates"].values())))
    lines = [SECTION, "", f"Machine: {res['machine']}. Date: {res['date']}. Command: `{res['command']}` (1-minute load "
             f"{res['load1_start']:.1f} at the start, {res['load1_end']:.1f} at the end: the 2 cores were shared with "
             "other jobs throughout, so compare the decoders within a row, not across runs).", "",
             "Images per CPU-second of one decoding worker (decode, resize, centre crop, float tensor; process time, "
             "best of 3 interleaved rounds); "
             "in brackets the largest difference from Pillow's pixels (0: identical).", "",
             "| JPEGs | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, row in res["rates"].items():
        lines.append(f"| {label} | " + " | ".join(f"{row[n]['images_s']:.0f} ({row[n]['max_pixel_diff']})"
                                                  for n in names) + " |")
    tt = res["to_tensor_us"]
    lines += ["", "CPU µs per Flickr8k test image of the steps of a decoding worker (process time, best of 3): "
              + "; ".join(f"{k} {v:.0f}" for k, v in tt.items()) + ". The float conversion, not the decoder, bounded "
              "the CPU path; its in-place form gives the same numbers bit for bit (tests/test_jpeg.py)."]
    e = res.get("e2e")
    if e:
        lines += ["", f"End to end on the Flickr8k test split ({e['images']:,} images, `embed_image_files`: decoding in "
                  f"the default worker pool beside the CNN; checkpoint `{e['checkpoint']}`, a frozen EfficientNet-Lite0 "
                  "(ImageNet) baseline with a GloVe bi-GRU; wall-clock images/s, best of 2 alternating runs, on the "
                  "shared machine):", "",
                  "| decoding | images/s | i2t R@1 / R@5 / R@10 | t2i R@1 / R@5 / R@10 | rsum |", "|---|---:|---|---|---:|"]
        labels = {"before": "Pillow, old to_tensor (before)", "pillow": "Pillow, in-place to_tensor",
                  "simplejpeg": "simplejpeg, in-place to_tensor (now)"}
        for n, label in labels.items():
            r = e[n]
            lines.append(f"| {label} | {r['images_s']:.0f} | {r['i2t_R@1']:.1f} / {r['i2t_R@5']:.1f} / "
                         f"{r['i2t_R@10']:.1f} | {r['t2i_R@1']:.1f} / {r['t2i_R@5']:.1f} / {r['t2i_R@10']:.1f} | "
                         f"{r['rsum']:.2f} |")
        c = e["cosine"]
        lines += ["", f"Cosine between each image's embedding before and now: min {c['min']:.6f}, mean {c['mean']:.6f}; "
                  f"largest difference of any coordinate {c['max_abs_diff']:.2e}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", required=True, help="Karpathy JSON of Flickr8k (or its folder)")
    p.add_argument("--checkpoint", help="a run's best.pt: also embed the test split end to end with each decoder")
    p.add_argument("--images", type=int, default=1000, help="Flickr8k test images for the per-image rates")
    p.add_argument("--coco", type=int, default=200, help="640×480 JPEGs for the per-image rates")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    res = run(args)
    print(json.dumps(res, indent=2, default=str))
    publish(SECTION, render(res), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
