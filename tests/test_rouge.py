"""indexer.rouge against rouge-score (and against TERN's coco-caption ROUGE-L for aggregate="tern")."""

from __future__ import annotations

import random

import numpy as np
import pytest

rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
from rouge_score import tokenize as rs_tokenize  # noqa: E402

from indexer import rouge  # noqa: E402
from indexer.rouge import rouge_l_matrix, tokenize  # noqa: E402

SCORER = rouge_scorer.RougeScorer(["rougeL"])
WORDS = "a A the dog Dog cat man on in red ball runs grass , . ! - 's two 2 3-year-old".split()

HAND_MADE = [
    ("", ""),
    ("", "a dog"),
    ("a dog", ""),
    ("...", "!!"),
    ("a dog runs.", "A DOG RUNS"),
    ("a dog a dog a dog", "dog a"),
    ("the the the the", "the"),
    ("a man's 3-year-old child", "man s 3 year old"),
    ("café naïve über", "caf na ve ber"),
    ("x " * 64, "x " * 64),
    ("x " * 65, "x " * 3),
    (" ".join(["a", "b"] * 40), " ".join(["b", "a"] * 41)),
    (" ".join(map(str, range(130))), " ".join(map(str, range(0, 200, 2)))),
]


def _sentence(rng: random.Random, lengths=(0, 1, 2, 5, 9, 12, 14, 20, 25, 40, 63, 64, 65, 70, 129)) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.choice(lengths)))


def _f(reference: str, query: str) -> float:
    return SCORER.score(reference, query)["rougeL"].fmeasure


def test_tokenize_matches_rouge_score() -> None:
    rng = random.Random(0)
    texts = [q for pair in HAND_MADE for q in pair] + [_sentence(rng) for _ in range(200)]
    texts += ["Hello,World!  foo_bar\tBAZ\n9x", "İstanbul ǅ straße ﬁ"]
    for t in texts:
        assert tokenize(t) == rs_tokenize.tokenize(t, None), t


@pytest.mark.slow
def test_pairs_match_rouge_score() -> None:
    rng = random.Random(1)
    pairs = HAND_MADE + [(_sentence(rng), _sentence(rng)) for _ in range(200)]
    queries = [q for q, _ in pairs]
    refs = [[r] for _, r in pairs]  # one reference per group: the matrix holds every pair
    m = rouge_l_matrix(queries, refs)
    assert m.dtype == np.float32 and m.shape == (len(pairs), len(pairs))
    for i in range(len(pairs)):
        for j in range(i % 13, len(pairs), 13):  # a deterministic sample of columns keeps it fast
            assert m[i, j] == pytest.approx(_f(refs[j][0], queries[i]), abs=1e-6), (queries[i], refs[j])
        assert m[i, i] == pytest.approx(_f(refs[i][0], queries[i]), abs=1e-6)


@pytest.mark.parametrize("aggregate", ["max", "mean"])
def test_group_aggregation(aggregate: str) -> None:
    rng = random.Random(2)
    queries = [_sentence(rng) for _ in range(25)] + [""]
    groups = [[_sentence(rng) for _ in range(rng.randint(0, 6))] for _ in range(20)] + [[]]
    m = rouge_l_matrix(queries, groups, aggregate=aggregate)
    for i, q in enumerate(queries):
        for g, refs in enumerate(groups):
            scores = [_f(r, q) for r in refs]
            expected = 0.0 if not scores else max(scores) if aggregate == "max" else float(np.mean(scores))
            assert m[i, g] == pytest.approx(expected, abs=1e-6)


def test_max_equals_rouge_score_multi_reference() -> None:
    refs = ["a dog runs on the grass", "two dogs play", "the red ball"]
    q = "a dog plays with the red ball"
    m = rouge_l_matrix([q], [refs])
    assert m[0, 0] == pytest.approx(SCORER.score_multi(refs, q)["rougeL"].fmeasure, abs=1e-6)


def _coco_rouge_l(candidate: str, refs: list[str], beta: float = 1.2) -> float:
    """coco-caption's Rouge.calc_score as TERN calls it, written out from its definition."""

    def lcs(a: list[str], b: list[str]) -> int:
        t = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i in range(1, len(a) + 1):
            for j in range(1, len(b) + 1):
                t[i][j] = t[i - 1][j - 1] + 1 if a[i - 1] == b[j - 1] else max(t[i - 1][j], t[i][j - 1])
        return t[-1][-1]

    c = candidate.lower().split(" ")
    prec, rec = [], []
    for r in refs:
        tr = r.lower().split(" ")
        n = lcs(tr, c)
        prec.append(n / len(c))
        rec.append(n / len(tr))
    p, r = max(prec), max(rec)
    return (1 + beta**2) * p * r / (r + beta**2 * p) if p and r else 0.0


def test_tern_aggregate_matches_coco_caption_rouge() -> None:
    rng = random.Random(3)
    queries = [_sentence(rng) for _ in range(20)] + ["A dog  runs .", "a dog runs ."]
    groups = [[_sentence(rng) for _ in range(5)] for _ in range(12)] + [["a dog runs .", "A  cat"]]
    m = rouge_l_matrix(queries, groups, aggregate="tern")
    for i, q in enumerate(queries):
        for g, refs in enumerate(groups):
            assert m[i, g] == pytest.approx(_coco_rouge_l(q, refs), abs=1e-6)


def test_chunk_and_block_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(4)
    queries = [_sentence(rng) for _ in range(40)]
    groups = [[_sentence(rng) for _ in range(3)] for _ in range(15)]
    full = rouge_l_matrix(queries, groups)
    monkeypatch.setattr(rouge, "_QUERY_CHUNK", 3)
    monkeypatch.setattr(rouge, "_REF_BLOCK", 4)
    monkeypatch.setattr(rouge, "_AGG_ROWS", 2)
    np.testing.assert_array_equal(rouge_l_matrix(queries, groups), full)


def test_own_caption_scores_one_and_bad_aggregate_raises() -> None:
    groups = [["a dog runs", "a black dog"], ["two cats sleep", "cats on a sofa"]]
    queries = [c for g in groups for c in g]
    m = rouge_l_matrix(queries, groups)
    np.testing.assert_array_equal(m[[0, 1], 0], 1.0)
    np.testing.assert_array_equal(m[[2, 3], 1], 1.0)
    with pytest.raises(ValueError):
        rouge_l_matrix(queries, groups, aggregate="median")
