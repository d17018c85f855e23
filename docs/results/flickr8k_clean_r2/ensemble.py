"""The Flickr-clean round 2 (grids/flickr8k_clean_r2.yaml): an ensemble of a cell's seed models, each
pair's similarity the mean of the members' cosine similarities (the same as one index of the members'
unit vectors concatenated and scaled by 1/√n), scored like one model; beside it every member alone.
On test: the image bootstrap (indexer/bootstrap.py, images with all their captions) of the ensemble's
own rsum and of ensemble − the members' mean, paired per query.

    python ensemble.py GRID_OUT/indexes/CELL_LABEL [SEEDS...]   (default seeds 0 1 2)
"""
import sys
from pathlib import Path

import numpy as np

from indexer.bootstrap import paired_bootstrap, recall_points, resample_image_means
from indexer.evaluate import ground_truth, similarities
from indexer.index import load_index_dir
from indexer.metrics import retrieval_query_metrics
from indexer.relevance import rouge_relevance
from training.progress import quiet


def scores(folder: Path, seeds: list[str], split: str) -> list[dict]:
    """Per-query results of every member, then of the ensemble (bootstrap.py's keys)."""
    ixs = [load_index_dir(folder / f"seed{s}" / split) for s in seeds]
    for ix in ixs[1:]:  # the same images and captions in the same order
        assert list(ix.images.ids) == list(ixs[0].images.ids) and list(ix.captions.ids) == list(ixs[0].captions.ids)
    c2i, mask = ground_truth(ixs[0])
    c2i = c2i[mask]
    with quiet():
        rel = rouge_relevance(ixs[0])[mask] if split == "test" else None
    sims = [similarities(ix)[:, mask] for ix in ixs]
    per_query = []
    for s in [*sims, np.mean(sims, axis=0)]:  # the members, then the ensemble
        i2t, t2i = retrieval_query_metrics(s, c2i, relevance=rel)
        q = {"i2t_first_rank": i2t["first_rank"], "t2i_first_rank": t2i["first_rank"], "t2i_image": c2i}
        if rel is not None:
            q["t2i_ndcg"] = next(v for k, v in t2i.items() if k.startswith("ndcg"))
        per_query.append(q)
    return per_query


def rsum(q: dict) -> float:
    """rsum from per-query ranks (what retrieval_metrics reports)."""
    return float(recall_points(q["i2t_first_rank"]).mean() + recall_points(q["t2i_first_rank"]).mean())


def stack(qs: list[dict]) -> dict:
    return {k: np.stack([q[k] for q in qs]) for k in qs[0]}


if __name__ == "__main__":
    folder, seeds = Path(sys.argv[1]), sys.argv[2:] or ["0", "1", "2"]
    print(f"{folder.name}, seeds {' '.join(seeds)}\n")
    print("| split | members alone: rsum | mean | ensemble rsum | 95 % CI (images) | ensemble − mean member | 95 % CI (images) "
          "| ensemble t2i nDCG |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for split in ("val", "test"):
        qs = scores(folder, seeds, split)
        r = [rsum(q) for q in qs[:-1]]
        ens = qs[-1]
        own, _ = resample_image_means(np.random.default_rng(0), recall_points(ens["i2t_first_rank"]),
                                      recall_points(ens["t2i_first_rank"]), ens["t2i_image"], [], 10_000)
        lo, hi = np.percentile(own, [2.5, 97.5])
        members, ensemble = stack(qs[:-1]), stack([ens] * len(seeds))  # paired: ensemble − each member, averaged
        d = paired_bootstrap(members, ensemble)["rsum"]
        nd = f"{ens['t2i_ndcg'].mean():.4f}" if "t2i_ndcg" in ens else "–"
        print(f"| {split} | {' / '.join(f'{x:.1f}' for x in r)} | {np.mean(r):.1f} | {rsum(ens):.1f} | "
              f"[{lo:.1f}, {hi:.1f}] | {d['delta']:+.1f} | [{d['lo']:+.1f}, {d['hi']:+.1f}] | {nd} |")
