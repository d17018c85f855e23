"""Linear decodability probes (indexer/probe.py): a ridge probe reads back a linearly encoded target
almost exactly and pure noise only at the floor; `ltd probe` reads one model's two indexes and refuses
a pair built by different checkpoints."""
from __future__ import annotations

import json

import numpy as np

from indexer.probe import mean_cosine, probe, ridge_fit, ridge_predict


def _targets(n, k=16, seed=0):
    g = np.random.default_rng(seed)
    return g.normal(size=(n, k)) + 2.0  # a shared mean: the intercept-only floor is well above 0


def test_ridge_recovers_a_linear_map():
    g = np.random.default_rng(1)
    x = g.normal(size=(200, 8))
    w = g.normal(size=(8, 3))
    w_hat = ridge_fit(x, x @ w + 0.5, alpha=1e-8)
    assert np.allclose(w_hat[:-1], w, atol=1e-6) and np.allclose(w_hat[-1], 0.5, atol=1e-6)
    assert np.allclose(ridge_predict(x, w_hat), x @ w + 0.5, atol=1e-6)


def test_probe_separates_content_from_noise():
    y_fit, y_eval = _targets(400, seed=0), _targets(200, seed=1)
    g = np.random.default_rng(2)
    mix = g.normal(size=(16, 32))
    held = probe(y_fit @ mix, y_fit, y_eval @ mix, y_eval)          # embeddings that encode the targets
    lost = probe(g.normal(size=(400, 32)), y_fit, g.normal(size=(200, 32)), y_eval)  # embeddings that do not
    assert held["cosine"] > 0.999 and held["cosine"] > held["floor"] + 0.1
    assert abs(lost["cosine"] - lost["floor"]) < 0.03
    assert held["floor"] == lost["floor"] == mean_cosine(np.broadcast_to(y_fit.mean(0), y_eval.shape), y_eval)


def test_ltd_probe_cli(tiny_index_pair, capsys):
    from app.cli import main

    bl, ltd = str(tiny_index_pair["bl"]), str(tiny_index_pair["ltd"])
    assert main(["probe", "--fit", bl, "--eval", bl]) == 0
    out = json.loads(capsys.readouterr().out)
    for side in ("captions", "images"):
        assert -1 <= out[side]["floor"] <= 1 and -1 <= out[side]["cosine"] <= 1
        assert out[side]["n_fit"] == out[side]["n_eval"] > 0
    assert out["captions"]["n_fit"] == 5 * out["images"]["n_fit"]
    assert main(["probe", "--fit", bl, "--eval", ltd]) == 2
    assert "different checkpoints" in capsys.readouterr().err


def test_ltd_probe_grid_summarises_every_run_of_an_experiment(tiny_index_pair, tmp_path, capsys):
    """`ltd probe --grid OUT`: every cell's seeds probed (fit on val, scored on test), mean ± std per cell,
    the same numbers as probing each run by hand."""
    import shutil

    from app.cli import main
    from indexer.probe import probe_grid, probe_indexes

    for cell in ("bl", "ltd"):
        for seed in (0, 1):
            for split in ("val", "test"):  # the tiny pair has a test index only: it plays both splits here
                shutil.copytree(tiny_index_pair[cell], tmp_path / "indexes" / cell / f"seed{seed}" / split)
    (tmp_path / "indexes" / "ltd" / "seed2" / "test").mkdir(parents=True)  # no val index: skipped
    rows = {r["cell"]: r for r in probe_grid(tmp_path)}
    assert set(rows) == {"bl", "ltd"}
    for cell, row in rows.items():
        one = probe_indexes(tiny_index_pair[cell], tiny_index_pair[cell])
        assert row["seeds"] == ["seed0", "seed1"]
        for side in ("captions", "images"):
            assert row[side]["mean"] == one[side]["cosine"] and row[side]["std"] == 0.0
    assert main(["probe", "--grid", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"| bl | 2 | {rows['bl']['captions']['mean']:.4f} ± 0.0000 |" in out and "| floor (the mean target) |" in out
    assert main(["probe", "--grid", str(tmp_path), "--fit", str(tiny_index_pair["bl"])]) == 2
    assert main(["probe", "--fit", str(tiny_index_pair["bl"])]) == 2
    assert main(["probe", "--grid", str(tmp_path / "nothing")]) == 2
