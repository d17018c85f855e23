"""`ltd caption eval`: a captioner on a dataset split → report.json + report.md (+ captions.json).

Captions are beam-search decoded (beam 5 by default) from the cached grid features, then scored with
the COCO toolkit's metrics (``indexer/caption_metrics.py``), by self-retrieval under a frozen
retrieval checkpoint (each generated caption as a text→image query over the split's images), and by
the shares of unique and novel captions.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from indexer.caption_metrics import SPICE_UNSUPPORTED, coco_scores, novel_share, self_retrieval, unique_share
from training.captioning.checkpoint import captioner_from_checkpoint, load_caption_checkpoint
from training.captioning.data import grid_store, regions
from training.captioning.inference import CaptionDecoding, caption_rows
from training.captioning.retrieval_reward import load_judge
from training.data.convert import write_json_atomic
from training.data.karpathy import Dataset, DatasetError, load_karpathy
from training.fsio import sha256_file
from training.prepare import resolve_dataset_path

log = logging.getLogger(__name__)

REPORT_KEYS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D")


@dataclass(frozen=True)
class CaptionEvalOptions:
    """How :func:`evaluate_captioner` decodes and scores: beam search of width ``beam`` (``allow_unk``: the
    decoder may emit ``<unk>``, suppressed by default; the report records which) over at most ``max_images``
    images (0: all); ``meteor`` as ``indexer.caption_metrics.coco_scores`` takes it (None: when Java is there,
    False: skipped); ``retrieval``, a retrieval checkpoint that gives the report's ``self_R@k``, and
    ``judges`` (name → retrieval checkpoint) that score the same captions under further retrieval models;
    ``cache_dir``: the feature cache ("": the captioner's config's)."""

    retrieval: str | Path | None = None
    beam: int = 5
    meteor: bool | None = None
    max_images: int = 0
    cache_dir: str = ""
    judges: dict[str, str | Path] | None = None
    allow_unk: bool = False


def dataset_of(ckpt: dict, dataset: str | None, cache_dir: str = "") -> Dataset:
    """``--dataset`` (a Karpathy JSON or its folder), or the dataset the captioner was trained on."""
    if dataset:
        path = resolve_dataset_path(dataset, cache_dir=cache_dir)
    else:
        path = Path((ckpt.get("dataset") or {}).get("json") or "")
        if not path.is_file():
            raise DatasetError("the checkpoint does not name a dataset file that exists here: pass --dataset")
    return load_karpathy(path)


def evaluate_captioner(checkpoint: str | Path, *, dataset: str | None = None, split: str = "test",
                       options: CaptionEvalOptions | None = None) -> tuple[dict, list[dict]]:
    """(report, captions [{image_id, filename, caption, references}]) for one split, decoded and scored
    as ``options`` says (:class:`CaptionEvalOptions`; None: its defaults).

    The retrieval checkpoint gives the report's ``self_R@k``; each judge's scores are in
    ``report["judges"][name]`` (one decoding for all: e.g. the judge a captioner was trained with and an
    independent one)."""
    o = options or CaptionEvalOptions()
    retrieval, beam, max_images, cache_dir, allow_unk = o.retrieval, o.beam, o.max_images, o.cache_dir, o.allow_unk
    ckpt = load_caption_checkpoint(checkpoint)
    model, vocab, ccfg = captioner_from_checkpoint(ckpt)
    ds = dataset_of(ckpt, dataset, cache_dir)
    sp = ds.split(split)
    store = grid_store(ds, ccfg.data.image_size, cache_dir or ccfg.data.cache_dir)
    keep = [i for i, im in enumerate(sp.images) if im.index not in store.failed][: max_images or None]
    rows = np.array([sp.images[i].index for i in keep], dtype=np.int64)
    t0 = time.time()
    decoding = CaptionDecoding(beam=beam, allow_unk=allow_unk)
    caps = caption_rows(model, vocab, rows, lambda r: regions(store, r), decoding=decoding,
                        desc=f"{split} captions (beam {beam})")
    gen_seconds = time.time() - t0
    per_image = sp.image_to_captions
    refs = {j: [sp.captions[c].raw for c in per_image[i]] for j, i in enumerate(keep)}
    scores = coco_scores(refs, {j: [c] for j, c in enumerate(caps)}, meteor=o.meteor)
    train_caps = [c.raw for c in ds.split("train").captions] if "train" in ds.split_counts() else []
    report: dict = {k: round(100 * scores[k], 2) for k in REPORT_KEYS if k in scores}
    report.update({"unique_%": round(100 * unique_share(caps), 2),
                   "novel_%": round(100 * novel_share(caps, train_caps), 2) if train_caps else None,
                   "n_images": len(keep), "mean_length": round(float(np.mean([len(c.split()) for c in caps])), 2)})
    scored: dict[Path, dict] = {}  # a checkpoint given as --retrieval and as a --judge is scored once

    def judged(path: str | Path) -> dict:
        key = Path(path).resolve()
        if key not in scored:
            judge = load_judge(path, ds, vocab.words, cache_dir=cache_dir)
            sims = judge.similarities(judge.model.embed_texts(caps), torch.as_tensor(rows)).numpy()  # (captions, images)
            scored[key] = {k: round(v, 2) for k, v in self_retrieval(sims.T).items()}
        return dict(scored[key])

    if retrieval:
        report.update(judged(retrieval))
    if o.judges:
        report["judges"] = {name: {**judged(path), "path": str(path), "sha256": sha256_file(path)[:16]}
                            for name, path in o.judges.items()}
    report["meta"] = {
        "checkpoint": str(checkpoint), "checkpoint_sha256": sha256_file(checkpoint)[:16],
        "train_name": ccfg.train.name, "stage": ckpt.get("stage"), "epoch": ckpt.get("epoch"),
        "dataset": {"name": ds.name, "json": str(ds.json_path), "split": sp.name},
        "retrieval": {"path": str(retrieval), "sha256": sha256_file(retrieval)[:16]} if retrieval else None,
        "beam": beam, "max_len": vocab.max_len, "unk": "allowed" if allow_unk else "suppressed",
        "tokenizer": "PTB (the COCO toolkit's CoreNLP 3.4.1 PTBTokenizer, Python port)",
        "meteor": "computed" if "METEOR" in scores else scores.get("meteor_unavailable"), "spice": SPICE_UNSUPPORTED,
        "generation_seconds": round(gen_seconds, 2), "captions_per_second": round(len(keep) / max(gen_seconds, 1e-9), 1)}
    out = [{"image_id": sp.images[i].id, "filename": sp.images[i].filename, "caption": c,
            "cider_d": round(scores["per_caption_CIDEr-D"][j] * 100, 2), "references": refs[j]}
           for j, (i, c) in enumerate(zip(keep, caps))]
    return report, out


def render_caption_markdown(report: dict) -> str:
    m = report["meta"]
    ds = m["dataset"]
    cols = [k for k in REPORT_KEYS if k in report]
    lines = [f"# Captioning evaluation: {m.get('train_name') or Path(m['checkpoint']).parent.name}", "",
             f"- dataset: {ds['name']} / {ds['split']} ({report['n_images']} images); beam {m['beam']}, "
             f"at most {m['max_len']} words, <unk> {m.get('unk', 'allowed')}; mean length {report['mean_length']}",
             f"- checkpoint: `{m['checkpoint']}` (sha256 {m['checkpoint_sha256']}…, stage {m.get('stage')}, "
             f"epoch {m.get('epoch')})", f"- tokenisation: {m['tokenizer']}", "",
             "| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols),
             "| " + " | ".join(f"{report[k]:.1f}" for k in cols) + " |", ""]
    if "self_R@1" in report:
        r = m["retrieval"]
        lines += [f"Self-retrieval (generated caption → its image among {report['n_images']}) under "
                  f"`{r['path']}` (sha256 {r['sha256']}…):", "",
                  "| R@1 | R@5 | R@10 | med r |", "|---:|---:|---:|---:|",
                  f"| {report['self_R@1']:.1f} | {report['self_R@5']:.1f} | {report['self_R@10']:.1f} | "
                  f"{report['self_medr']:g} |", ""]
    if report.get("judges"):
        lines += [f"Self-retrieval of the same captions under further judges ({report['n_images']} images):", "",
                  "| judge | R@1 | R@5 | R@10 | med r | checkpoint |", "|---|---:|---:|---:|---:|---|"]
        lines += [f"| {name} | {j['self_R@1']:.1f} | {j['self_R@5']:.1f} | {j['self_R@10']:.1f} | {j['self_medr']:g} | "
                  f"`{j['path']}` ({j['sha256']}…) |" for name, j in report["judges"].items()]
        lines.append("")
    novel = f"{report['novel_%']:.1f} %" if report.get("novel_%") is not None else "n/a (no train split)"
    lines += [f"Unique captions: {report['unique_%']:.1f} %; novel captions (not in the training set): {novel}.", "",
              "Scores ×100 (CIDEr-D as the COCO toolkit computes it, document frequencies from this split's "
              "references)." + ("" if "METEOR" in report else f" METEOR not computed: {m['meteor']}.")
              + f" {m['spice']}.", "",
              f"Generation: {m['captions_per_second']} captions/s ({m['generation_seconds']} s).", ""]
    return "\n".join(lines)


def write_caption_report(out_dir: str | Path, report: dict, captions: list[dict]) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "captions.json", captions, indent=1)
    jp = write_json_atomic(out_dir / "report.json", report, indent=2)
    mp = out_dir / "report.md"
    tmp = mp.with_suffix(".md.tmp")
    tmp.write_text(render_caption_markdown(report))
    tmp.replace(mp)
    return jp, mp
