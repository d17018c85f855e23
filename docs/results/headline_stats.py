"""RESULTS.md's headline claims from their per-seed values in docs/results/: for each claim the seed-matched
differences (or, for a claim against a published number, the seed values minus it), mean ± sd, the 95 %
t-interval over seeds, a two-sided t-test (paired, or one-sample against the published number) and Holm's
step-down correction at 0.05 across all headline claims. The ensemble row's draws are whole ensembles (two
disjoint triples of seeds, flickr8k_clean_r2_ensemble/ensemble.py, from its committed per-query ranks).

    python docs/results/headline_stats.py [--intervals]   (prints RESULTS.md's "Multiplicity" table; with
                                                          --intervals also each claim's Δ and t-interval)
"""
import importlib.util
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np
from scipy import stats

R = Path(__file__).resolve().parent
CAP = R / "flickr8k_caption"


@cache
def ensemble_rsums() -> np.ndarray:
    """The Flickr-clean ensembles' test rsums, one a training draw (recomputed from their per-query ranks)."""
    spec = importlib.util.spec_from_file_location("ensemble", R / "flickr8k_clean_r2_ensemble" / "ensemble.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ensemble_rsums("test")


@cache
def grid_results(grid: str) -> dict:
    return json.loads((R / grid / "results.json").read_text())


def paired(grid: str, ref: str, cell: str, metric: str = "rsum", tag: str = "test", sign: float = 1.0):
    """Seed-matched Δ (cell − ref) of a grid's results.json, as `ltd experiment` computed it."""
    for p in grid_results(grid)["paired"]:
        if p["tag"] == tag and p["ref"] == ref and p["cell"] == cell:
            return sign * np.array(p[metric]["values"], dtype=float)
    raise KeyError(f"{grid}: {tag} {ref} -> {cell}")


def cell_values(grid: str, label: str, metric: str = "rsum", tag: str = "test"):
    runs = grid_results(grid)["runs"]
    return np.array([r["reports"][tag][metric] for r in sorted(runs, key=lambda r: r["seed"]) if r["label"] == label])


def report(path: Path) -> dict:
    return json.loads(path.read_text())


def caption_delta(folder: Path, a: str, b: str, key: str, judges=None, seeds=("s0", "s1", "s2")):
    """Seed-matched Δ a − b of captioners' test reports ({run}_{seed}/report.json), under one judge or the
    mean of several (None: the report's own key)."""
    def v(rep):
        return rep[key] if judges is None else np.mean([rep["judges"][j][key] for j in judges])
    return np.array([v(report(folder / f"{a}_{s}" / "report.json")) - v(report(folder / f"{b}_{s}" / "report.json"))
                     for s in seeds])


def judges_delta(key: str = "self_R@1", judges=("bl_s1", "ltd_s1", "dual_s0")):
    folder = CAP / "independent_judges"
    return np.array([np.mean([report(folder / f"{s}_srfl_ltd" / "report.json")["judges"][j][key] for j in judges])
                     - np.mean([report(folder / f"{s}_srfl_bl" / "report.json")["judges"][j][key] for j in judges])
                     for s in ("s0", "s1", "s2")])


# One entry a headline row, in the headline's order: (short name, per-seed values, the reference they are tested
# against: 0 for a difference, the published number for a claim against one).
CLAIMS = [
    ("§1: LTD constraint − baseline", lambda: paired("flickr8k_main", "baseline", "ltd_constraint"), 0.0),
    ("§1 parity: LTD − tuned baseline (5 seeds)",
     lambda: paired("flickr8k_parity", "baseline_tuned", "ltd_constraint"), 0.0),
    ("§1 parity, LTD's lr tuned too: LTD − tuned baseline (5 seeds)",
     lambda: paired("flickr8k_parity_lr", "baseline_tuned", "ltd_constraint_tuned"), 0.0),
    ("§1 parity at higher lr: LTD − tuned baseline (5 seeds)",
     lambda: paired("flickr8k_parity_lr2", "baseline_tuned", "ltd_constraint_tuned"), 0.0),
    ("dual β 10 − constraint (5 seeds)", lambda: paired("flickr8k_referee", "ltd_constraint", "ltd_dual_beta10"), 0.0),
    ("constraint − replayed λ (5 seeds)",
     lambda: paired("flickr8k_referee", "ltd_constraint", "ltd_replayed_other_seed", sign=-1), 0.0),
    ("mpnet captions: LTD own targets − none", lambda: paired("flickr8k_distill", "mpnet_captions", "mpnet_captions_ltd_self"), 0.0),
    ("same-image targets − own targets", lambda: paired("flickr8k_referee", "ltd_constraint", "ltd_same_image_targets"), 0.0),
    ("glove-mean targets − baseline", lambda: paired("flickr8k_referee", "baseline", "ltd_glove_mean"), 0.0),
    ("glove-randlstm targets − baseline", lambda: paired("flickr8k_targets", "baseline", "ltd_glove_randlstm"), 0.0),
    ("MiniLM captions − LTD MiniLM targets", lambda: paired("flickr8k_targets", "ltd_minilm", "minilm_captions"), 0.0),
    ("ITD sum dual − baseline", lambda: paired("flickr8k_itd_sum", "baseline", "itd_sum_dual"), 0.0),
    ("LTD − ITD, both constraints", lambda: paired("flickr8k_itd_sum", "ltd_constraint", "itd_sum_constraint", sign=-1), 0.0),
    ("triplet: LTD − baseline, t2i nDCG", lambda: paired("flickr8k_triplet_eta", "baseline", "ltd_constraint", "ndcg"), 0.0),
    ("SVL: LTD − baseline, clean test", lambda: paired("flickr8k_svl", "baseline", "ltd_constraint"), 0.0),
    ("fine-tuned with shortcuts − pretrained", lambda: paired("flickr8k_fne_sbert_svl_ft", "pretrained", "ft_sc"), 0.0),
    ("with shortcuts: LTD − none", lambda: paired("flickr8k_fne_sbert_svl_ft", "ft_sc", "ft_sc_ltd"), 0.0),
    ("demo: LTD − baseline, batch 16", lambda: paired("synthetic_small_batch_controls", "baseline", "ltd_constraint"), 0.0),
    ("demo: LTD − tuned baseline, batch 16",
     lambda: paired("synthetic_small_batch_controls", "baseline_tuned", "ltd_constraint"), 0.0),
    ("demo: LTD − baseline, batch 128 step-matched",
     lambda: paired("synthetic_small_batch_controls", "baseline_batch128_steps", "ltd_batch128_steps"), 0.0),
    ("Flickr-clean best single model − FV's 300.0",
     lambda: cell_values("flickr8k_clean_r2", "clean@text_hidden=512"), 300.0),
    ("Flickr-clean ensembles − FV's 300.0 (2 draws of 3 seeds)", ensemble_rsums, 300.0),
    ("Flickr-clean: LTD mpnet targets − none", lambda: paired("flickr8k_clean", "fne_gru_maxpool", "fne_gru_maxpool_ltd_mpnet"), 0.0),
    ("strongest CPU recipe: LTD mpnet − none", lambda: paired("flickr8k_fne_sbert_mpnet", "baseline", "ltd_constraint_mpnet"), 0.0),
    ("VSRN: LTD − baseline (5 seeds)", lambda: paired("flickr8k_vsrn", "baseline", "ltd_constraint"), 0.0),
    ("TERN: LTD − baseline (5 seeds)", lambda: paired("flickr8k_tern_5seeds", "baseline", "ltd_constraint"), 0.0),
    ("SR-FL − SCST, referee self-R@10",
     lambda: caption_delta(CAP / "converged", "srfl_bl", "scst", "self_R@10", judges=("ltd",)), 0.0),
    ("LTD judge − baseline judge, self-R@1 (3 judges)", lambda: judges_delta(), 0.0),
    ("SR-PL − CIDEr-only (half), unique captions %", lambda: caption_delta(CAP / "sr_pl", "srpl", "cidh", "unique_%"), 0.0),
    ("caption demo: SR-FL − SCST, referee self-R@10",
     lambda: caption_delta(R / "caption_demo" / "test", "srbl_A", "scst_A", "self_R@10", judges=("referee",)), 0.0),
    ("data parallel: two − one process, val rsum", lambda: paired("data_parallel", "one_process", "two_processes", tag="val"), 0.0),
]


def rows(level: float = 0.95, alpha: float = 0.05) -> list[dict]:
    """Every claim with its seed statistics, raw p and Holm's adjusted p (monotone step-down)."""
    out = []
    for name, get, ref in CLAIMS:
        d = get() - ref
        n, m, sd = len(d), float(d.mean()), float(d.std(ddof=1))
        half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / np.sqrt(n)
        p = float(2 * stats.t.sf(abs(m) / (sd / np.sqrt(n)), n - 1)) if sd > 0 else 0.0
        out.append({"claim": name, "n": n, "mean": m, "sd": sd, "lo": m - half, "hi": m + half, "p": p})
    order = sorted(range(len(out)), key=lambda i: out[i]["p"])
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(out) - rank) * out[i]["p"]))
        out[i]["p_holm"] = running
        out[i]["survives"] = running < alpha
    return out


def fmt(x: float, small: bool) -> str:
    return f"{x:+.4f}" if small else f"{x:+.1f}"


def table(intervals: bool = False) -> str:
    """The Markdown table RESULTS.md's "Multiplicity" section holds (tests/test_results_md.py compares them)."""
    lines = ["| headline claim | seeds | " + ("Δ (t-interval) | " if intervals else "") + "p | Holm p | survives |",
             "|---|---:|" + ("---:|" if intervals else "") + "---:|---:|---|"]
    for r in rows():
        small = "mean" in r and max(abs(r["lo"]), abs(r["hi"])) < 0.1  # nDCG
        ci = (f"{fmt(r['mean'], small)} [{fmt(r['lo'], small)}, {fmt(r['hi'], small)}]".replace("-", "−")
              if "mean" in r else "–")
        lines.append(f"| {r['claim']} | {r['n']} | " + (f"{ci} | " if intervals else "")
                     + f"{r['p']:.2g} | {r['p_holm']:.2g} | {'**yes**' if r['survives'] else 'no'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table("--intervals" in sys.argv[1:]))
