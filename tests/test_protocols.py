"""COCO 1K (five folds), ECCV Caption mAP@R / R-P / R@1 and PMRP (indexer/protocols.py): against a plainly
written loop and against eccv-caption's own Metrics on the same similarity matrix; their reports and the
image bootstrap over them."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from indexer import protocols
from indexer.protocols import coco1k_report, protocol_metrics

N_IMG, PER = 50, 5


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    img, txt = rng.normal(size=(N_IMG, 8)), rng.normal(size=(N_IMG * PER, 8))
    c2i = np.repeat(np.arange(N_IMG), PER)
    txt = 0.6 * img[c2i] + txt  # captions near their images, so the metrics are not all zero
    return img @ txt.T, c2i


def _plain_1k(sims, c2i):
    """Five folds of consecutive images, each evaluated alone with obvious loops; the mean per metric."""
    size, out = N_IMG // 5, []
    for f in range(5):
        imgs = list(range(f * size, (f + 1) * size))
        caps = [j for j in range(len(c2i)) if c2i[j] in imgs]
        r = {}
        for k in (1, 5, 10):
            hits = 0
            for i in imgs:
                order = sorted(caps, key=lambda j: (-sims[i, j], j))
                hits += any(c2i[j] == i for j in order[:k])
            r[f"i2t_R@{k}"] = 100 * hits / len(imgs)
            hits = 0
            for j in caps:
                order = sorted(imgs, key=lambda i: (-sims[i, j], i))
                hits += c2i[j] in order[:k]
            r[f"t2i_R@{k}"] = 100 * hits / len(caps)
        r["rsum"] = sum(r.values())
        out.append(r)
    return {k: np.mean([r[k] for r in out]) for k in out[0]}


def test_coco1k_is_the_mean_of_five_folds_written_plainly(setup):
    sims, c2i = setup
    ours, ref = coco1k_report(sims, c2i), _plain_1k(sims, c2i)
    for k, v in ref.items():
        assert ours[f"coco1k_{k}"] == pytest.approx(v, abs=1e-9), k
    with pytest.raises(Exception, match="5 folds"):
        coco1k_report(sims[:48], c2i[c2i < 48])


def _ids():
    img_ids, cap_ids = 1000 + np.arange(N_IMG), 5000 + np.arange(N_IMG * PER)
    return img_ids, cap_ids


def _gt_files(folder, c2i, rng):
    """eccv-caption's JSON maps for the stand-in split: original, ECCV (a subset of queries, with more
    positives) and Plausible Match (more still)."""
    img_ids, cap_ids = _ids()
    orig_i2t = {str(img_ids[i]): [int(cap_ids[j]) for j in np.flatnonzero(c2i == i)] for i in range(N_IMG)}
    orig_t2i = {str(cap_ids[j]): [int(img_ids[c2i[j]])] for j in range(len(c2i))}
    maps = {"original": (orig_i2t, orig_t2i)}
    for name, p_extra, share in (("eccv", 0.05, 0.5), ("pm", 0.1, 0.8)):
        i2t = {k: v + [int(c) for c in cap_ids[rng.random(len(cap_ids)) < p_extra] if int(c) not in v]
               for k, v in orig_i2t.items() if rng.random() < share}
        t2i = {k: v + [int(i) for i in img_ids[rng.random(N_IMG) < p_extra] if int(i) not in v]
               for k, v in orig_t2i.items() if rng.random() < share}
        maps[name] = (i2t, t2i)
    for name, (i2t, t2i) in maps.items():
        (folder / f"{name}_image_to_caption.json").write_text(json.dumps(i2t))
        (folder / f"{name}_caption_to_image.json").write_text(json.dumps(t2i))
    return maps


@pytest.mark.slow
def test_every_number_equals_eccv_captions_own(setup, tmp_path, monkeypatch):
    pytest.importorskip("eccv_caption")
    import warnings

    from eccv_caption import Metrics

    from indexer.metrics import retrieval_metrics

    sims, c2i = setup
    _gt_files(tmp_path, c2i, np.random.default_rng(1))
    img_ids, cap_ids = _ids()
    monkeypatch.setattr(protocols, "eccv_data_dir", lambda: tmp_path)
    ix = SimpleNamespace(images=SimpleNamespace(meta={"cocoids": img_ids.tolist()}),
                         captions=SimpleNamespace(meta={"annids": cap_ids.tolist()}))
    ours, _ = protocol_metrics(ix, sims, c2i, ["coco1k", "eccv", "pmrp"], pm_dir=tmp_path)
    full = retrieval_metrics(sims, c2i)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = Metrics()
    m.set_coco_gts(str(tmp_path / "original_image_to_caption.json"), str(tmp_path / "original_caption_to_image.json"))
    m.set_eccv_gts(str(tmp_path / "eccv_image_to_caption.json"), str(tmp_path / "eccv_caption_to_image.json"))
    m.set_pm_gts(str(tmp_path / "pm_image_to_caption.json"), str(tmp_path / "pm_caption_to_image.json"))
    m.coco_ids = cap_ids  # its 1K folds: consecutive fifths of these caption ids (and their images)
    i2t = {int(img_ids[i]): [int(cap_ids[j]) for j in np.argsort(-sims[i], kind="stable")] for i in range(N_IMG)}
    t2i = {int(cap_ids[j]): [int(img_ids[i]) for i in np.argsort(-sims[:, j], kind="stable")] for j in range(len(c2i))}
    theirs = m.compute_all_metrics(i2t, t2i, target_metrics=["coco_1k_recalls", "coco_5k_recalls", "eccv_map_at_r",
                                                              "eccv_rprecision", "eccv_r1", "pmrp"], Ks=(1, 5, 10))
    for d in ("i2t", "t2i"):
        for k in (1, 5, 10):
            assert ours[f"coco1k_{d}_R@{k}"] == pytest.approx(100 * theirs[f"coco_1k_r{k}"][d], abs=1e-9)
            assert full[f"{d}_R@{k}"] == pytest.approx(100 * theirs[f"coco_5k_r{k}"][d], abs=1e-9)
        assert ours[f"eccv_{d}_mAP@R"] == pytest.approx(100 * theirs["eccv_map_at_r"][d], abs=1e-9)
        assert ours[f"eccv_{d}_R-P"] == pytest.approx(100 * theirs["eccv_rprecision"][d], abs=1e-9)
        assert ours[f"eccv_{d}_R@1"] == pytest.approx(100 * theirs["eccv_r1"][d], abs=1e-9)
        assert ours[f"pmrp_{d}"] == pytest.approx(100 * theirs[d], abs=1e-9)
    assert 0 < ours["eccv_i2t_mAP@R"] < 100 and ours["eccv_queries"]["i2t"] < N_IMG


def test_reports_name_their_protocol_and_the_bootstrap_covers_it(setup, tmp_path, monkeypatch):
    from indexer.ann import build_vector_index
    from indexer.bootstrap import paired_bootstrap
    from indexer.evaluate import EvalOptions, evaluate_index, render_markdown
    from indexer.index import Modality, save_index_dir

    sims, c2i = setup
    _gt_files(tmp_path, c2i, np.random.default_rng(1))
    monkeypatch.setattr(protocols, "eccv_data_dir", lambda: tmp_path)
    img_ids, cap_ids = _ids()
    rng = np.random.default_rng(3)
    reports = []
    for noise in (0.0, 0.8):
        img = rng.normal(size=(N_IMG, 8)).astype(np.float32)
        txt = (img[c2i] + noise * rng.normal(size=(len(c2i), 8))).astype(np.float32)
        img /= np.linalg.norm(img, axis=1, keepdims=True)
        txt /= np.linalg.norm(txt, axis=1, keepdims=True)
        images = {"ids": list(range(N_IMG)), "filenames": [""] * N_IMG, "paths": [""] * N_IMG,
                  "captions": [np.flatnonzero(c2i == i).tolist() for i in range(N_IMG)], "cocoids": img_ids.tolist()}
        caps = {"ids": list(range(len(c2i))), "texts": ["x"] * len(c2i), "image": c2i.tolist(), "annids": cap_ids.tolist()}
        ix = save_index_dir(tmp_path / f"ix{noise}", {"name": "t", "ground_truth": True, "factory": "Flat"},
                            Modality(build_vector_index(img, "Flat"), img, images),
                            Modality(build_vector_index(txt, "Flat"), txt, caps))
        rep = evaluate_index(ix, EvalOptions(relevance=None, per_query=True, protocols=("coco1k", "eccv", "pmrp"),
                                             pm_dir=tmp_path))
        reports.append(rep)
    rep = reports[0]
    assert rep["meta"]["protocol"].startswith("full split") and set(rep["meta"]["protocols"]) == {"coco1k", "eccv", "pmrp"}
    md = render_markdown({k: v for k, v in rep.items() if k != "per_query"})
    assert "COCO 1K: mean over 5 folds" in md and "ECCV Caption" in md and "mAP@R" in md and "PMRP" in md
    boot = paired_bootstrap(reports[1]["per_query"], reports[0]["per_query"], n_resamples=200)
    for key in ("coco1k_rsum", "eccv_i2t_mAP@R", "eccv_t2i_mAP@R", "pmrp_i2t", "pmrp_t2i"):
        assert boot[key]["lo"] <= boot[key]["delta"] <= boot[key]["hi"], key
    assert boot["coco1k_rsum"]["delta"] == pytest.approx(reports[0]["coco1k_rsum"] - reports[1]["coco1k_rsum"], abs=1e-3)
    assert boot["eccv_i2t_mAP@R"]["delta"] == pytest.approx(
        reports[0]["eccv_i2t_mAP@R"] - reports[1]["eccv_i2t_mAP@R"], abs=1e-3)
    assert boot["coco1k_rsum"]["delta"] > 0  # the noiseless model is better, and it shows


def test_protocol_bootstrap_equals_a_plain_resampling_loop():
    from indexer.bootstrap import protocol_intervals

    rng = np.random.default_rng(5)
    n_i, image = 12, np.repeat(np.arange(12), 3)
    a = {"eccv_t2i_map": np.where(rng.random(36) < 0.5, rng.random(36), np.nan)}
    b = {"eccv_t2i_map": np.where(np.isnan(a["eccv_t2i_map"]), np.nan, rng.random(36))}
    got = protocol_intervals(a, b, image, n_i, n_resamples=300, seed=2)["eccv_t2i_mAP@R"]
    d = 100 * (b["eccv_t2i_map"] - a["eccv_t2i_map"])
    draws = np.random.default_rng([2, 2, 0]).integers(0, n_i, size=(300, n_i))
    reps = []
    for row in draws:
        vals = [d[j] for i in row for j in np.flatnonzero(image == i) if not np.isnan(d[j])]
        reps.append(sum(vals) / max(len(vals), 1))
    lo, hi = np.percentile(reps, [2.5, 97.5])
    assert got["delta"] == pytest.approx(np.nanmean(d)) and got["lo"] == pytest.approx(lo) and got["hi"] == pytest.approx(hi)
