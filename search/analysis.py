"""What the served models tell about each other and about their training.

- ``Explorer``: every test query of two models on the same split, sorted by how much they disagree
  on the rank of the first ground truth (``indexer.disagreement``), computed once per pair.
- ``training_rows`` / ``training_figure``: the ``metrics.jsonl`` of each model's training run
  (when it sits next to the checkpoint), and the λ, L_rec, L_con and val rsum curves drawn from them.
"""
from __future__ import annotations

import dataclasses
import json
import threading

import numpy as np

from indexer.disagreement import compare_indexes
from indexer.index import IndexDir, Modality
from search.errors import BadRequest
from search.registry import ModelEntry
from training.plots import figure_from_rows, label_for, plt

_PYPLOT_LOCK = threading.Lock()  # pyplot's figure registry is not thread-safe; servers draw from threads


class Explorer:
    """The Explorer tab's rows for each pair of models, computed once per pair and kept (thread-safe:
    one lock around the cache; the first call for a pair does the work)."""

    def __init__(self):
        self._rows: dict[tuple[str, str], tuple[tuple, list[dict]]] = {}  # pair → (their writes, rows)
        self._lock = threading.Lock()

    def rows(self, a: ModelEntry, b: ModelEntry, *, direction: str = "both", winner: str = "any",
             limit: int = 200) -> list[dict]:
        """Every test query of ``a`` and ``b`` (two models on the same split), most disagreement first,
        filtered by ``direction`` (``t2i``, ``i2t`` or ``both``) and ``winner`` (``a``, ``b``, ``tie`` or
        ``any``), at most ``limit``. BadRequest for one model twice; IndexDirError (from
        ``indexer.disagreement``) for indexes of different splits."""
        if a.name == b.name:
            raise BadRequest("the explorer needs two different models")
        key, stamp = (a.name, b.name), (a.generation, a.seq, b.generation, b.seq)
        with self._lock:
            if self._rows.get(key, (None,))[0] != stamp:  # a write to either model: compare afresh
                sh = shared_items(a, b)
                rows = compare_indexes(sh.a, sh.b, relevance=sh.relevance if sh.relevance is not None else False)
                for r in rows:  # query_index: the query's row in a's served index, as for every other route
                    r["query_index"] = int((sh.caption_rows if r["direction"] == "t2i" else sh.image_rows)
                                           [r["query_index"]])
                self._rows[key] = (stamp, rows)
            rows = self._rows[key][1]
        if direction in ("t2i", "i2t"):
            rows = [r for r in rows if r["direction"] == direction]
        if winner in ("a", "b", "tie"):
            rows = [r for r in rows if r["winner"] == winner]
        return rows[:limit]


def _alive(entry: ModelEntry, side: str) -> dict[int, int]:
    """id → row of what ``entry`` serves now on ``side`` (removed items left out)."""
    ids = getattr(entry.index, side).ids
    if entry.live is None:  # an entry built by hand: its index as it is
        return {int(i): r for r, i in enumerate(ids)}
    pos = entry.image_pos if side == "images" else entry.caption_pos
    return {int(i): r for r, i in enumerate(ids) if pos.get(int(i)) == r}


def _caption_images(entry: ModelEntry) -> np.ndarray:
    if entry.caption_image is not None:
        return np.asarray(entry.caption_image)
    return np.array([-1 if j is None else int(j) for j in entry.index.captions.meta["image"]], np.int64)


@dataclasses.dataclass(frozen=True)
class SharedItems:
    """Two models' indexes cut to the items both serve (``shared_items``)."""

    a: IndexDir
    b: IndexDir
    relevance: np.ndarray | None  # ROUGE-L, captions × images of the cut, when known
    image_rows: np.ndarray  # row in a's served index of each image of the cut
    caption_rows: np.ndarray  # … and of each caption


def shared_items(a: ModelEntry, b: ModelEntry) -> SharedItems:
    """``a``'s and ``b``'s indexes cut to the items both serve now, as plain arrays: images alive in both,
    and the captions alive in both that belong to one of those images in both (what their ground truth
    compares; a removed item is in neither, an item added to one model only is left out). With the
    ROUGE-L relevance of those rows when ``a`` has it cached and every row is one of its base rows
    (items added through the API have none: nDCG is then left out)."""
    ia, ib = _alive(a, "images"), _alive(b, "images")
    images = [i for i in ia if i in ib]
    new_row = {i: k for k, i in enumerate(images)}
    ca, cb = _alive(a, "captions"), _alive(b, "captions")
    la, lb = _caption_images(a), _caption_images(b)
    a_img_ids, b_img_ids = a.index.images.ids, b.index.images.ids
    captions, c2i = [], []
    for c, ra in ca.items():
        rb = cb.get(c)
        if rb is None or la[ra] < 0 or lb[rb] < 0:
            continue
        image = int(a_img_ids[la[ra]])
        if image == int(b_img_ids[lb[rb]]) and image in new_row:
            captions.append(c)
            c2i.append(new_row[image])
    per_image: list[list[int]] = [[] for _ in images]
    for k, i in enumerate(c2i):
        per_image[i].append(k)

    def cut(e: ModelEntry, img_rows: np.ndarray, cap_rows: np.ndarray) -> IndexDir:
        im, cap = e.index.images, e.index.captions
        names, texts = im.meta.get("filenames") or [None] * len(im.ids), cap.meta["texts"]
        images_side = Modality(im.index, np.asarray(im.vectors[img_rows], np.float32),
                               {"ids": images, "filenames": [names[r] for r in img_rows], "captions": per_image})
        captions_side = Modality(cap.index, np.asarray(cap.vectors[cap_rows], np.float32),
                                 {"ids": captions, "texts": [texts[r] for r in cap_rows], "image": c2i})
        return dataclasses.replace(e.index, images=images_side, captions=captions_side)

    rows = {e.name: (np.array([alive_i[i] for i in images], np.int64), np.array([alive_c[c] for c in captions], np.int64))
            for e, alive_i, alive_c in ((a, ia, ca), (b, ib, cb))}
    rel_full = a.relevance()
    img_rows, cap_rows = rows[a.name]
    rel = None
    if rel_full is not None and (not len(img_rows) or img_rows.max() < rel_full.shape[1]) \
            and (not len(cap_rows) or cap_rows.max() < rel_full.shape[0]):
        rel = np.ascontiguousarray(rel_full[np.ix_(cap_rows, img_rows)], np.float32)
    return SharedItems(cut(a, *rows[a.name]), cut(b, *rows[b.name]), rel, img_rows, cap_rows)


def training_rows(entry: ModelEntry) -> list[dict]:
    """The rows of the model's metrics.jsonl ([] when its run folder is not next to the checkpoint)."""
    if entry.run_dir is None:
        return []
    path = entry.run_dir / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def training_figure(entries: list[ModelEntry], smooth: int = 5, figsize: tuple[float, float] = (11, 6.2)):
    """(matplotlib figure or None, names without a metrics file): λ (log), L_rec with η, L_con, val rsum,
    one line per model."""
    series, missing = [], []
    for e in entries:
        rows = training_rows(e)
        if not rows:
            missing.append(e.name)
            continue
        label, eta = label_for(e.name, (e.index.manifest.get("model") or {}).get("loss"))
        series.append((label, eta, rows))
    if not series:
        return None, missing
    with _PYPLOT_LOCK:
        fig = figure_from_rows(series, smooth=max(1, int(smooth)), figsize=figsize)
        plt.close(fig)  # the caller renders the Figure object itself; keep pyplot's registry from growing
    return fig, missing


def plain_ids(ix: IndexDir) -> IndexDir:
    """``ix`` with its sides' ids as plain lists: a served snapshot's are live views (search/live_views.py),
    which ``indexer.disagreement.check_comparable`` would never find equal to another model's (it compares
    them with ``!=``, and a view has no ``__eq__``), so two served models were never comparable."""
    sides = {n: dataclasses.replace(m, meta={**m.meta, "ids": list(m.meta["ids"])})
             for n, m in (("images", ix.images), ("captions", ix.captions))}
    return dataclasses.replace(ix, **sides)
