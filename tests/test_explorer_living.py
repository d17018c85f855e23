"""The Explorer (two models' per-query disagreement) while one of them changes: it compares the items
both serve now — a removed item is neither a query nor a candidate, an item added to one model only is
left out — and its ranks are those of a plain recomputation over exactly those items."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import pair_settings
from test_living_index import png

from indexer import image_roots
from indexer.index import read_manifest
from search.writes import Upload


def first_ranks(scores: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """1 + how many candidates score above each query's ground truth (ties to the smaller index)."""
    gt = scores[np.arange(len(truth)), truth]
    above = (scores > gt[:, None]).sum(1)
    ties_before = np.array([(scores[q, : truth[q]] == gt[q]).sum() for q in range(len(truth))])
    return 1 + above + ties_before


@pytest.fixture
def svc(tiny_index_pair, tmp_path):
    """A loaded, writable service over copies of the tiny pair."""
    models = {}
    for name in ("bl", "ltd"):
        models[name] = str(shutil.copytree(tiny_index_pair[name], tmp_path / name))
        image_roots.record(models[name], read_manifest(models[name])["image_roots"])
    s = pair_settings(tiny_index_pair, models=models, writable=True).search_service()
    s.registry.load()
    yield s
    s.close()


def test_the_explorer_compares_what_both_models_serve_after_writes(svc):
    before = svc.explorer("bl", "ltd", limit=10**9)
    e = svc.registry.get("ltd")
    gone = int(e.index.images.ids[3])
    gone_caps = {int(e.index.captions.ids[c]) for c in e.live.caption_rows(e.image_pos[gone])}
    svc.writes.remove("ltd", gone)
    added = svc.writes.add("ltd", [Upload(png(7), "new.png", captions=["a new photo of shapes"])])[0]["id"]
    after = svc.explorer("bl", "ltd", limit=10**9)
    assert svc.explorer("ltd", "bl", limit=1)  # a pair first asked for after the writes answers too
    t2i = {r["query_id"]: r for r in after if r["direction"] == "t2i"}
    i2t = {r["query_id"]: r for r in after if r["direction"] == "i2t"}
    assert gone not in i2t and added not in i2t and not gone_caps & set(t2i)
    assert len(i2t) == len({r["query_id"] for r in before if r["direction"] == "i2t"}) - 1
    # t2i ranks, recomputed plainly over the shared images (the removed one is no candidate)
    a, b = svc.registry.get("bl"), svc.registry.get("ltd")
    shared = [int(i) for i in a.index.images.ids if int(i) != gone]
    for entry, side in ((a, "a_rank"), (b, "b_rank")):
        img = np.asarray(entry.index.images.vectors[[entry.image_pos[i] for i in shared]])
        caps = sorted(t2i)
        cap = np.asarray(entry.index.captions.vectors[[entry.caption_pos[c] for c in caps]])
        truth = np.array([shared.index(int(entry.index.images.ids[entry.caption_image[entry.caption_pos[c]]]))
                          for c in caps])
        want = first_ranks(cap @ img.T, truth)
        assert [t2i[c][side] for c in caps] == want.tolist()
        for c in caps:  # query_index is the caption's row in a's served index
            assert int(a.index.captions.ids[t2i[c]["query_index"]]) == c
    old = {(r["direction"], r["query_id"]): r["a_rank"] for r in before}
    assert all(r["a_rank"] <= old[(r["direction"], r["query_id"])] for r in after)  # one candidate fewer


def test_word_usage_after_writes_counts_only_what_both_models_serve(svc):
    """Word usage after a removal: the removed image's captions are no occurrence and no example; the
    rest is the table both models' generations measured (an added item is in neither)."""
    before = svc.explainer.word_usage("bl", "ltd", min_count=1)
    e = svc.registry.get("ltd")
    gone = int(e.index.images.ids[0])
    rows = e.live.caption_rows(e.image_pos[gone])
    gone_caps = {int(e.index.captions.ids[c]) for c in rows}
    words = sum(len(e.index.captions.meta["texts"][c].split()) for c in rows)
    svc.writes.remove("ltd", gone)
    svc.writes.add("ltd", [Upload(png(9), "new.png", captions=["a red square"])])
    after = svc.explainer.word_usage("bl", "ltd", min_count=1)
    assert after.captions == before.captions - len(gone_caps)
    assert 0 < before.occurrences - after.occurrences <= words
    examples = {x.caption_id for s in after.words for x in s.examples}
    assert examples and not examples & gone_caps
