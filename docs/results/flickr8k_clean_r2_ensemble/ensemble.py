"""The Flickr-clean ensembles (grids/flickr8k_clean_r2_ensemble.yaml): six seeds of flickr8k_clean_r2's val
choice, split before the run into two disjoint triples (seeds 0-2 and 3-5). An ensemble scores each
image–caption pair by the mean of its members' cosine similarities (the same as one index of the members'
unit vectors concatenated and scaled by 1/√3) and is scored like one model.

Two steps, so that the numbers recompute from committed files:

    python ensemble.py build GRID_OUT   # from the grid's index folders (the members' embeddings, not
                                        # committed: ~25 MB a member and split) → per_query/{val,test}.npz
                                        # here: every member's and both ensembles' per-query ranks
    python ensemble.py                  # from per_query/*.npz alone → the Markdown of ensemble.md

The report gives, per triple and split, the members alone, the ensemble's rsum with its image-bootstrap
interval (images resampled with all their captions, indexer/bootstrap.py), and ensemble − the members' mean
(paired per query); then the two ensembles as two training draws: their mean, sd and t-interval (1 degree
of freedom), against FV's 300.0 (Klein et al. 2015, GMM+HGLMM: two Fisher-vector encodings of the
sentence concatenated, one CCA).
"""
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from indexer.bootstrap import recall_points, resample_image_means
from indexer.evaluate import ground_truth, similarities
from indexer.index import load_index_dir
from indexer.metrics import retrieval_query_metrics
from indexer.relevance import rouge_relevance
from training.progress import quiet

HERE = Path(__file__).resolve().parent
CELL = "clean_h512"
TRIPLES = {"seeds 0-2": (0, 1, 2), "seeds 3-5": (3, 4, 5)}
FV = 300.0
KEYS = ("i2t_first_rank", "t2i_first_rank", "t2i_ndcg")


def build(grid_out: Path) -> None:
    """Every member's and ensemble's per-query arrays, from the members' index folders."""
    out = HERE / "per_query"
    out.mkdir(exist_ok=True)
    done = {name: t for name, t in TRIPLES.items()  # a triple whose members have all finished
            if all((grid_out / "indexes" / CELL / f"seed{s}" / "test").is_dir() for s in t)}
    for split in ("val", "test"):
        seeds = [s for t in done.values() for s in t]
        ixs = {s: load_index_dir(grid_out / "indexes" / CELL / f"seed{s}" / split) for s in seeds}
        first = ixs[seeds[0]]
        for ix in ixs.values():  # the same images and captions in the same order
            assert list(ix.images.ids) == list(first.images.ids) and list(ix.captions.ids) == list(first.captions.ids)
        c2i, mask = ground_truth(first)
        c2i = c2i[mask]
        with quiet():
            rel = rouge_relevance(first)[mask]
        sims = {f"s{s}": similarities(ix)[:, mask] for s, ix in ixs.items()}
        for name, members in done.items():
            sims[name] = np.mean([sims[f"s{s}"] for s in members], axis=0)
        arrays = {"t2i_image": c2i}
        for name, s in sims.items():
            i2t, t2i = retrieval_query_metrics(s, c2i, relevance=rel)
            arrays[f"{name}/i2t_first_rank"] = i2t["first_rank"].astype(np.int32)
            arrays[f"{name}/t2i_first_rank"] = t2i["first_rank"].astype(np.int32)
            arrays[f"{name}/t2i_ndcg"] = next(v for k, v in t2i.items() if k.startswith("ndcg")).astype(np.float32)
        tmp = out / f".{split}.npz.tmp"
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
        tmp.replace(out / f"{split}.npz")


def load(split: str) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
    """{member or ensemble: {key: per-query array}}, and each caption query's image."""
    z = np.load(HERE / "per_query" / f"{split}.npz")
    names = sorted({k.split("/")[0] for k in z.files if "/" in k})
    return {n: {k: z[f"{n}/{k}"] for k in KEYS} for n in names}, z["t2i_image"]


def rsum(q: dict) -> float:
    return float(recall_points(q["i2t_first_rank"]).mean() + recall_points(q["t2i_first_rank"]).mean())


def image_bootstrap(i2t: np.ndarray, t2i: np.ndarray, image: np.ndarray, n: int = 10_000, seed: int = 0):
    """95 % interval of mean(i2t) + mean(t2i) when images are drawn with replacement, each with its captions."""
    reps, _ = resample_image_means(np.random.default_rng(seed), i2t, t2i, image, [], n)
    return np.percentile(reps, [2.5, 97.5])


def t_interval(x: np.ndarray) -> tuple[float, float, float, float]:
    """mean, sd and the 95 % t-interval over training draws (NaN for one draw: no interval)."""
    if len(x) < 2:
        return float(np.mean(x)), float("nan"), float("nan"), float("nan")
    n, m, sd = len(x), float(np.mean(x)), float(np.std(x, ddof=1))
    half = stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)
    return m, sd, m - half, m + half


def ensemble_rsums(split: str = "test") -> np.ndarray:
    """The ensembles' rsums, one a training draw (docs/results/headline_stats.py reads them)."""
    qs, _ = load(split)
    return np.array([rsum(qs[name]) for name in TRIPLES if name in qs])


def report() -> str:
    lines = [f"{CELL} (flickr8k_clean_r2's val choice), seeds 0-5, two triples; recomputed from per_query/*.npz\n",
             "| split | triple | members alone: rsum | mean | ensemble rsum | 95 % CI (images) | "
             "ensemble − mean member | 95 % CI (images) | ensemble t2i nDCG |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for split in ("val", "test"):
        qs, image = load(split)
        for name, members in TRIPLES.items():
            if name not in qs:
                continue
            ens, r = qs[name], [rsum(qs[f"s{s}"]) for s in members]
            lo, hi = image_bootstrap(recall_points(ens["i2t_first_rank"]), recall_points(ens["t2i_first_rank"]), image)
            mean_pts = {d: np.mean([recall_points(qs[f"s{s}"][f"{d}_first_rank"]) for s in members], axis=0)
                        for d in ("i2t", "t2i")}
            d_i2t = recall_points(ens["i2t_first_rank"]) - mean_pts["i2t"]
            d_t2i = recall_points(ens["t2i_first_rank"]) - mean_pts["t2i"]
            dlo, dhi = image_bootstrap(d_i2t, d_t2i, image)
            nd = f"{ens['t2i_ndcg'].mean():.4f}" if split == "test" else "–"
            lines.append(f"| {split} | {name} | {' / '.join(f'{x:.1f}' for x in r)} | {np.mean(r):.1f} | "
                         f"{rsum(ens):.1f} | [{lo:.1f}, {hi:.1f}] | {d_i2t.mean() + d_t2i.mean():+.1f} | "
                         f"[{dlo:+.1f}, {dhi:+.1f}] | {nd} |")
    e = ensemble_rsums("test")
    m, sd, lo, hi = t_interval(e)
    qs, _ = load("test")
    singles = np.array([rsum(qs[f"s{s}"]) for t in TRIPLES.values() for s in t if f"s{s}" in qs])
    sm, ssd, slo, shi = t_interval(singles)
    lines += ["", "Test, over training draws (t-intervals):", "",
              "| what | draws | mean ± sd | 95 % t-interval | − FV's 300.0 |", "|---|---:|---:|---:|---:|",
              f"| ensemble of three | {len(e)} ({' / '.join(f'{x:.1f}' for x in e)}) | {m:.1f} ± {sd:.1f} | "
              f"[{lo:.1f}, {hi:.1f}] | {m - FV:+.1f} [{lo - FV:+.1f}, {hi - FV:+.1f}] |",
              f"| one member | {len(singles)} | {sm:.1f} ± {ssd:.1f} | [{slo:.1f}, {shi:.1f}] | "
              f"{sm - FV:+.1f} [{slo - FV:+.1f}, {shi - FV:+.1f}] |"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"]:
        build(Path(sys.argv[2]))
    else:
        print(report(), end="")
