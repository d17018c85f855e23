"""Caption metrics: the COCO toolkit's scorers on hand-made cases, CIDEr-D three ways (toolkit, our
batched reward, an independent re-implementation here), the SCST reward's end token, METEOR without
Java, self-retrieval, unique and novel shares. The tokenizer: tests/test_ptb_tokenize.py."""
from __future__ import annotations

import math
import random
import shutil
from collections import Counter

import numpy as np
import pytest
import torch

from indexer.caption_metrics import CaptionMetricsError, coco_scores, novel_share, self_retrieval, unique_share
from training.captioning.cider import CiderD

pytest.importorskip("pycocoevalcap")
HAS_JAVA = shutil.which("java") is not None


def reference_cider_d(gts: dict, res: dict, df_refs: dict | None = None, n: int = 4, sigma: float = 6.0) -> dict:
    """CIDEr-D written from the paper's definition (Vedantam et al. 2015, with the toolkit's CIDEr-D
    details: clipped tf-idf, Gaussian length penalty on the bigram count, ×10), one dict per sentence."""
    df_refs = df_refs or gts

    def grams(words):
        return Counter(tuple(words[i:i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1))

    df = Counter(g for refs in df_refs.values() for g in {g for r in refs for g in grams(r.split())})
    log_n = math.log(len(df_refs))

    def vec(words):
        c = grams(words)
        return {g: tf * (log_n - math.log(max(1.0, df[g]))) for g, tf in c.items()}, sum(
            tf for g, tf in c.items() if len(g) == 2)

    out = {}
    for key, (hyp,) in res.items():
        vh, lh = vec(hyp.split())
        total = 0.0
        for ref in gts[key]:
            vr, lr = vec(ref.split())
            sims = []
            for k in range(1, n + 1):
                hk = {g: v for g, v in vh.items() if len(g) == k}
                rk = {g: v for g, v in vr.items() if len(g) == k}
                dot = sum(min(v, rk.get(g, 0.0)) * rk.get(g, 0.0) for g, v in hk.items())
                nh, nr = math.sqrt(sum(v * v for v in hk.values())), math.sqrt(sum(v * v for v in rk.values()))
                s = dot / (nh * nr) if nh and nr else dot
                sims.append(s * math.exp(-((lh - lr) ** 2) / (2 * sigma ** 2)))
            total += sum(sims) / n
        out[key] = 10.0 * total / len(gts[key])
    return out


def _random_corpus(seed: int, n_images: int = 40, words: str = "a b c d e f g h"):
    rng = random.Random(seed)
    w = words.split()
    gts = {i: [" ".join(rng.choices(w, k=rng.randint(1, 11))) for _ in range(rng.randint(1, 5))] for i in range(n_images)}
    res = {i: [" ".join(rng.choices(w, k=rng.randint(0, 11)))] for i in range(n_images)}
    res[0] = [gts[0][0]]
    return gts, res


def test_identical_captions_score_the_maximum():
    gts = {0: ["a dog runs on the grass"] * 3, 1: ["two cats sleep on a red sofa"] * 2, 2: ["a man rides a bike"]}
    res = {k: [v[0]] for k, v in gts.items()}
    s = coco_scores(gts, res, meteor=False)
    for k in ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L"):
        assert s[k] == pytest.approx(1.0, abs=1e-6), k
    assert s["CIDEr-D"] == pytest.approx(10.0)


def test_disjoint_captions_score_zero():
    gts = {0: ["a dog runs on the grass"], 1: ["two cats sleep on a sofa"]}
    res = {0: ["purple elephants juggle violins"], 1: ["quantum chromodynamics lecture notes"]}
    s = coco_scores(gts, res, meteor=False)
    for k in ("BLEU-1", "BLEU-4", "ROUGE-L", "CIDEr-D"):
        assert s[k] == pytest.approx(0.0, abs=1e-6), k


def test_known_cider_d_value():
    """Two images with one reference each. "a" is in both references, so its idf is log 2 − log 2 = 0;
    every other n-gram has idf log 2. Image 0's candidate equals its reference: cosine 1 for 1-, 2- and
    3-grams, and 0 for 4-grams (the sentence has none): CIDEr-D = 10 · (1 + 1 + 1 + 0) / 4 = 7.5.
    Image 1's candidate shares only "a" (weight 0): 0. The corpus score is their mean, 3.75."""
    gts = {0: ["a dog runs"], 1: ["a cat sits"]}
    res = {0: ["a dog runs"], 1: ["a bird"]}
    s = coco_scores(gts, res, meteor=False, tokenized=True)
    assert s["per_caption_CIDEr-D"] == pytest.approx({0: 7.5, 1: 0.0})
    assert s["CIDEr-D"] == pytest.approx(3.75)
    words = {w: i for i, w in enumerate("a dog runs cat sits bird".split())}
    enc = lambda t: [words[w] for w in t.split()]  # noqa: E731
    ours = CiderD([[enc(r) for r in gts[k]] for k in (0, 1)], base=len(words) + 1).score([enc(res[k][0]) for k in (0, 1)], [0, 1])
    np.testing.assert_allclose(ours, [7.5, 0.0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cider_d_three_implementations_agree(seed):
    from pycocoevalcap.cider.cider import Cider

    gts, res = _random_corpus(seed)
    _, toolkit = Cider().compute_score(gts, res)
    independent = reference_cider_d(gts, res)
    words = {w: i for i, w in enumerate("a b c d e f g h".split())}
    enc = lambda t: [words[w] for w in t.split()]  # noqa: E731
    keys = sorted(gts)
    ours = CiderD([[enc(r) for r in gts[k]] for k in keys]).score([enc(res[k][0]) for k in keys], keys)
    np.testing.assert_allclose(toolkit, [independent[k] for k in keys], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours, toolkit, rtol=1e-9, atol=1e-12)


def test_cider_d_with_document_frequencies_from_other_references():
    """The training reward takes document frequencies from the training references, not the scored ones."""
    gts, res = _random_corpus(5, n_images=12)
    train, _ = _random_corpus(6, n_images=30)
    words = {w: i for i, w in enumerate("a b c d e f g h".split())}
    enc = lambda t: [words[w] for w in t.split()]  # noqa: E731
    keys = sorted(gts)
    ours = CiderD([[enc(r) for r in gts[k]] for k in keys], df_refs=[[enc(r) for r in train[k]] for k in sorted(train)])
    expected = reference_cider_d(gts, res, df_refs=train)
    np.testing.assert_allclose(ours.score([enc(res[k][0]) for k in keys], keys), [expected[k] for k in keys], rtol=1e-9)


def test_cider_d_repeated_hypotheses_and_padding_are_scored_independently():
    refs = [[[4, 5, 6, 7]], [[8, 9, 4]], [[5, 5, 5]]]
    c = CiderD(refs, base=20)
    one = c.score([[4, 5, 6, 7], [8, 9]], [0, 1])
    arr = np.array([[4, 5, 6, 7, 1, 1], [8, 9, 3, 3, 3, 3], [4, 5, 6, 7, 0, 0]])
    batched = c.score(arr, [0, 1, 0], lengths=np.array([4, 2, 4]))
    np.testing.assert_allclose(batched, [one[0], one[1], one[0]])


@pytest.mark.parametrize("with_eos", [True, False])
def test_scst_reward_counts_the_end_token_like_the_self_critical_code(with_eos):
    """The SCST reward's CIDEr-D, with ``cider_eos``, equals the toolkit's Cider on the strings the
    self-critical code builds (``array_to_str``): every reference and a candidate that emitted <eos> end
    in an <eos> word, a candidate cut at the length limit does not; without it, the plain strings."""
    from pycocoevalcap.cider.cider import Cider

    from training.captioning.cider import with_end
    from training.captioning.scst import RewardSpec, SelfRetrievalReward

    rng, eos, max_len = random.Random(3), 3, 6
    refs = [[[rng.randint(4, 9) for _ in range(rng.randint(1, 9))] for _ in range(rng.randint(1, 5))] for _ in range(30)]
    ids = torch.full((30, max_len), 0, dtype=torch.long)
    hyps = []
    for i in range(30):
        n = rng.randint(0, max_len)  # n == max_len: cut at the limit, no <eos>
        words = refs[i][0][:n] if i % 3 == 0 else [rng.randint(4, 10) for _ in range(n)]
        ids[i, : len(words)] = torch.tensor(words, dtype=torch.long)
        if len(words) < max_len:
            ids[i, len(words)] = eos
        hyps.append(words + ([eos] if with_eos and len(words) < max_len else []))
    cider = CiderD(with_end(refs, eos) if with_eos else refs, base=12)
    reward = SelfRetrievalReward(cider, None, eos_id=eos, spec=RewardSpec(cider_eos=with_eos))
    got = reward(ids, np.arange(30), np.arange(30)).cider
    end = [eos] if with_eos else []
    gts = {i: [" ".join(map(str, r + end)) for r in refs[i]] for i in range(30)}
    _, want = Cider().compute_score(gts, {i: [" ".join(map(str, h))] for i, h in enumerate(hyps)})
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert any(len(h) == max_len for h in hyps) and any(h and h[-1] == eos for h in hyps) == with_eos


def test_meteor_without_java_is_skipped_with_a_reason(monkeypatch):
    import indexer.caption_metrics as cm

    monkeypatch.setattr(cm.shutil, "which", lambda name: None)
    gts, res = {0: ["a dog runs"], 1: ["a cat"]}, {0: ["a dog runs"], 1: ["a cat"]}
    s = cm.coco_scores(gts, res)
    assert "METEOR" not in s and "needs Java" in s["meteor_unavailable"] and "make java-deps" in s["meteor_unavailable"]
    with pytest.raises(CaptionMetricsError, match="needs Java"):
        cm.coco_scores(gts, res, meteor=True)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_JAVA, reason="METEOR needs java")
def test_meteor_with_java_orders_identical_above_disjoint():
    gts = {0: ["a dog runs on the grass"], 1: ["two cats sleep on a red sofa"]}
    same = coco_scores(gts, {k: [v[0]] for k, v in gts.items()}, meteor=True)["METEOR"]
    other = coco_scores(gts, {0: ["purple elephants juggle"], 1: ["violins in space"]}, meteor=True)["METEOR"]
    assert same > 0.9 and other < 0.05


def test_inputs_must_line_up():
    with pytest.raises(CaptionMetricsError, match="same keys"):
        coco_scores({0: ["a"]}, {1: ["a"]}, meteor=False)
    with pytest.raises(CaptionMetricsError, match="exactly one candidate"):
        coco_scores({0: ["a"]}, {0: ["a", "b"]}, meteor=False)


def test_self_retrieval_ranks_each_caption_against_all_images():
    # rows: images, columns: captions; caption j was generated for image j
    sims = np.array([[0.9, 0.1, 0.5],
                     [0.2, 0.3, 0.6],
                     [0.1, 0.8, 0.4]])
    r = self_retrieval(sims, ks=(1, 2))
    # caption 0: own 0.9 is the best (rank 1); caption 1: 0.8 (image 2) above own 0.3 → rank 2;
    # caption 2: own 0.4 below 0.5 and 0.6 → rank 3
    assert r["self_R@1"] == pytest.approx(100 / 3) and r["self_R@2"] == pytest.approx(200 / 3)
    assert r["self_medr"] == 2
    tie = self_retrieval(np.array([[0.5, 0.5], [0.5, 0.5]]), ks=(1,))
    assert tie["self_R@1"] == 50.0  # ties go to the smaller image index, as in indexer/metrics.py


def test_unique_and_novel_shares():
    caps = ["A dog runs.", "a dog runs", "A cat sleeps", "a bird flies"]
    assert unique_share(caps) == pytest.approx(3 / 4)
    assert novel_share(caps, ["a dog runs !", "a bird flies"]) == pytest.approx(1 / 4)
