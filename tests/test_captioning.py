"""Captioning library: vocabulary, decoding (beam search against exhaustive search), the self-critical
gradient on a toy policy with a known optimum, retrieval losses, negative mining, the model's
teacher-forced and step-by-step paths, and checkpoint safety."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from training.captioning.decoding import Specials, allowed_log_probs, beam_search, greedy, sample
from training.captioning.negatives import NegativeSampler
from training.captioning.retrieval_reward import retrieval_loss
from training.captioning.scst import mean_of_others, scst_loss
from training.captioning.vocab import CaptionVocab, sequence_lengths
from training.captioning.xe import feedback_probability

SP = Specials(pad=0, bos=2, eos=3, unk=None)  # id 1 (<unk> in a real vocabulary) is let through here
WORDS = (1, 4, 5)  # three words: the tokens a caption may contain besides <eos>


# ---- vocabulary ---------------------------------------------------------------------------------
def test_vocab_lowercases_drops_punctuation_maps_rare_words_and_truncates():
    caps = ["A dog, runs!"] * 5 + ["a dog sits"] * 4 + ["The CAT"]
    v = CaptionVocab.build(caps, min_count=5, max_len=3)
    assert {"a", "dog", "runs"} <= set(v.words) and "sits" not in v.words and "cat" not in v.words
    assert v.encode("A DOG sits on the mat") == [v.vocab.index["a"], v.vocab.index["dog"], v.unk_id]
    t = v.encode_batch(["a dog", "a dog runs a dog runs"])
    assert t.shape == (2, 4) and t[0, 2] == v.eos_id and t[0, 3] == v.pad_id and t[1, 3] == v.eos_id
    d = json.loads(json.dumps(v.to_dict()))  # plain types only
    assert CaptionVocab.from_dict(d) == v
    assert v.decode([v.vocab.index["a"], v.unk_id, v.eos_id, v.vocab.index["dog"]]) == "a <unk>"


def test_sequence_lengths_stop_at_the_first_eos():
    ids = torch.tensor([[4, 5, 3, 0], [4, 4, 4, 4], [3, 0, 0, 0]])
    assert sequence_lengths(ids, 3).tolist() == [2, 4, 0]


def test_scheduled_sampling_schedule():
    assert [feedback_probability(e) for e in (0, 4, 5, 9, 10, 20, 25, 60)] == pytest.approx(
        [0, 0, 0.05, 0.05, 0.1, 0.2, 0.25, 0.25])


# ---- decoding against exhaustive search -----------------------------------------------------------
class HistoryModel:
    """A toy 'captioner' whose next-word distribution depends on the whole history (through a hash
    kept in the state) and on the image (row), so a beam that reorders its state wrongly is caught."""

    def __init__(self, n_images: int, vocab: int = 6, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.log_softmax(torch.randn(n_images, 97, vocab, generator=g) * 2, -1)

    def state(self, n: int, per_image: int) -> tuple:
        return (torch.zeros(n * per_image, dtype=torch.long), torch.arange(n).repeat_interleave(per_image))

    def step(self, words, state):
        h, img = state
        h = (h * 7 + words + 1) % 97
        return self.table[img, h], (h, img)

    def score(self, image: int, seq: tuple, max_len: int) -> float:
        h, total, words = torch.zeros(1, dtype=torch.long), 0.0, torch.tensor([SP.bos])
        st = (h, torch.tensor([image]))
        for w in list(seq) + ([SP.eos] if len(seq) < max_len else []):
            logp, st = self.step(words, st)
            total += float(allowed_log_probs(logp, SP)[0, w])
            words = torch.tensor([w])
        return total


def exhaustive(model: HistoryModel, image: int, max_len: int) -> list[tuple[float, tuple]]:
    seqs = [s for n in range(max_len + 1) for s in itertools.product(WORDS, repeat=n)]
    return sorted(((model.score(image, s, max_len), s) for s in seqs), reverse=True)


def _words(ids_row) -> tuple:
    out = []
    for t in ids_row.tolist():
        if t in (SP.eos, SP.pad):
            break
        out.append(t)
    return tuple(out)


@pytest.mark.parametrize("max_len", [1, 2, 3])
def test_wide_beam_search_finds_the_exhaustive_optimum(max_len):
    n = 3
    model = HistoryModel(n, seed=max_len)
    beam = 3 ** max_len + 1  # wider than the number of partial sequences: beam search becomes exact
    best, scores, beams = beam_search(model.step, model.state(n, beam), n, max_len, beam, SP)
    for i in range(n):
        ranked = exhaustive(model, i, max_len)
        assert _words(best[i]) == ranked[0][1]
        assert float(scores[i]) == pytest.approx(ranked[0][0], abs=1e-5)
        top = [_words(b) for b in beams[i, :5]]
        assert top == [s for _, s in ranked[:5]]  # the beams, best first, are the 5 best sequences


def test_beam_of_one_is_greedy_and_beam_five_is_never_worse_here():
    n, max_len = 4, 3
    model = HistoryModel(n, seed=7)
    g_ids, g_scores = greedy(model.step, model.state(n, 1), n, max_len, SP)
    b1, s1, _ = beam_search(model.step, model.state(n, 1), n, max_len, 1, SP)
    assert torch.equal(g_ids, b1)
    torch.testing.assert_close(g_scores, s1)
    b5, s5, _ = beam_search(model.step, model.state(n, 5), n, max_len, 5, SP)
    for i in range(n):
        assert float(s5[i]) == pytest.approx(model.score(i, _words(b5[i]), max_len), abs=1e-5)
        assert float(s5[i]) >= float(s1[i]) - 1e-6


def test_decoders_never_emit_pad_or_bos_and_pad_after_eos():
    n, max_len = 5, 4
    model = HistoryModel(n, seed=3)
    model.table[:, :, SP.pad] = 5.0  # the model would love to emit <pad> and <bos>
    model.table[:, :, SP.bos] = 5.0
    ids, lp, mask = sample(model.step, model.state(n, 1), n, max_len, SP, generator=torch.Generator().manual_seed(0))
    for out in (ids, greedy(model.step, model.state(n, 1), n, max_len, SP)[0],
                beam_search(model.step, model.state(n, 3), n, max_len, 3, SP)[0]):
        assert not (out == SP.bos).any()
        for row in out.tolist():
            if SP.eos in row:
                assert all(t == SP.pad for t in row[row.index(SP.eos) + 1:])
            else:
                assert SP.pad not in row
    assert torch.equal(mask.sum(1), torch.minimum(sequence_lengths(ids, SP.eos) + 1, torch.tensor(max_len)))


def test_no_decoder_emits_unk_by_default_and_allow_unk_restores_it():
    """Greedy, sampling and beam search with the default specials never produce <unk> (id 1), even from a
    model that puts nearly all its mass on it; with ``unk=None`` (analysis) greedy and beam do emit it."""
    n, max_len = 6, 4
    model = HistoryModel(n, vocab=7, seed=5)
    model.table[:, :, 1] = 8.0  # <unk> is by far the likeliest word at every step
    default = Specials()
    assert default.unk == 1 and set(default.blocked) == {0, 1, 2}
    gen = torch.Generator().manual_seed(0)
    outs = [greedy(model.step, model.state(n, 1), n, max_len, default)[0],
            beam_search(model.step, model.state(n, 4), n, max_len, 4, default)[0]]
    outs += [sample(model.step, model.state(n, 1), n, max_len, default, temperature=t, generator=gen)[0]
             for t in (0.5, 1.0, 3.0) for _ in range(20)]
    for out in outs:
        assert not (out == 1).any() and not (out == 0)[:, 0].any() and not (out == 2).any()
    # the renormalised policy: a blocked word has probability exactly 0, the others sum to 1
    p = allowed_log_probs(model.table[0, :3], default).exp()
    assert torch.all(p[:, [0, 1, 2]] == 0) and torch.allclose(p.sum(1), torch.ones(3))
    allowed = Specials(unk=None)
    assert (greedy(model.step, model.state(n, 1), n, max_len, allowed)[0] == 1).all()
    assert (beam_search(model.step, model.state(n, 4), n, max_len, 4, allowed)[0] == 1).all()


def test_sampling_temperature_sharpens_the_distribution():
    model = HistoryModel(1, seed=11)
    gen = torch.Generator().manual_seed(0)

    def first_words(temp):
        ids, _, _ = sample(model.step, model.state(400, 1)[:1] + (torch.zeros(400, dtype=torch.long),), 400, 1, SP,
                           temperature=temp, generator=gen)
        return ids[:, 0]

    greedy_first = int(greedy(model.step, model.state(1, 1), 1, 1, SP)[0][0, 0])
    cold, hot = first_words(0.2), first_words(5.0)
    assert (cold == greedy_first).float().mean() > (hot == greedy_first).float().mean()


# ---- self-critical gradient -------------------------------------------------------------------
def test_scst_gradient_is_unbiased_for_any_constant_baseline():
    """E_a[∇ loss(a)] = −∇ E[r] exactly (enumerating the actions), whatever the baseline."""
    theta = torch.tensor([0.3, -0.2, 1.0, 0.1], requires_grad=True)
    reward = torch.tensor([1.0, 0.0, 2.0, -1.0])
    p = torch.softmax(theta, 0)
    (true_grad,) = torch.autograd.grad((p * reward).sum(), theta)
    for b in (0.0, 0.7, -3.0):
        est = torch.zeros(4)
        for a in range(4):
            logp = torch.log_softmax(theta, 0)[a].reshape(1, 1)
            loss = scst_loss(logp, torch.ones(1, 1), reward[a].reshape(1), torch.tensor([b]))
            (g,) = torch.autograd.grad(loss, theta)
            est += p[a].detach() * g
        torch.testing.assert_close(est, -true_grad)  # descending the loss ascends the expected reward


def test_mean_of_others_baseline_by_hand():
    # 3 samples (blocks) of 2 images: image 0 got 1, 2, 6; image 1 got 0, 0, 3
    r = torch.tensor([1.0, 0.0, 2.0, 0.0, 6.0, 3.0])
    torch.testing.assert_close(mean_of_others(r, 3), torch.tensor([4.0, 1.5, 3.5, 1.5, 1.5, 0.0]))
    with pytest.raises(ValueError):
        mean_of_others(r, 1)


@pytest.mark.slow
@pytest.mark.parametrize("baseline", ["greedy", "mean"])
def test_scst_moves_a_toy_policy_to_the_best_sequence(baseline):
    """Per-position categorical policy over 3 words, 3 positions; reward = matches with the target
    sequence (4, 5, 1) plus a bonus for the whole sequence. Self-critical training — the paper's
    greedy baseline with one sample per 'image', or 4 samples with the mean of the others as the
    baseline — must put most probability on the target."""
    torch.manual_seed(0)
    target = torch.tensor([4, 5, 1])
    logits = torch.zeros(3, 6, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.1)
    n, max_len = 16, 3
    gen = torch.Generator().manual_seed(1)

    def step(words, state):
        (t,) = state
        lp = torch.log_softmax(logits[t.clamp(max=2)], -1)
        lp = lp.masked_fill(torch.tensor([False, False, False, True, False, False]), float("-inf"))  # no <eos>
        return lp, (t + 1,)

    def reward(ids):
        match = (ids == target).float().sum(1)
        return match + 2.0 * (match == 3).float()

    def p_target():  # the policy: <pad>, <bos> (decoders) and <eos> (this toy) removed, renormalised
        lp = torch.log_softmax(logits.detach().masked_fill(torch.tensor([1, 0, 1, 1, 0, 0]).bool(), -1e9), -1)
        return float(torch.exp(lp[torch.arange(3), target].sum()))

    start = p_target()
    k = 1 if baseline == "greedy" else 4
    for _ in range(150):
        ids, lp, mask = sample(step, (torch.zeros(n * k, dtype=torch.long),), n * k, max_len, SP, generator=gen)
        if baseline == "greedy":
            with torch.no_grad():
                g_ids, _ = greedy(step, (torch.zeros(n, dtype=torch.long),), n, max_len, SP)
            b = reward(g_ids)
        else:
            b = mean_of_others(reward(ids), k)
        loss = scst_loss(lp, mask, reward(ids), b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert start == pytest.approx(1 / 27) and p_target() > 0.9


# ---- retrieval reward and negatives ---------------------------------------------------------------
def test_retrieval_losses_by_hand():
    sims = torch.tensor([[0.8, 0.7, 0.1], [0.2, 0.5, 0.6]])
    own = torch.tensor([0, 1])
    m = 0.2
    # caption 0: hinges 0.2-0.8+0.7 = 0.1 and 0.2-0.8+0.1 < 0 → max 0.1, sum 0.1
    # caption 1: hinges 0.2-0.5+0.2 < 0 and 0.2-0.5+0.6 = 0.3 → max 0.3, sum 0.3
    torch.testing.assert_close(retrieval_loss(sims, own, "vse_max", margin=m), torch.tensor([0.1, 0.3]))
    sims2 = torch.tensor([[0.8, 0.75, 0.7]])
    torch.testing.assert_close(retrieval_loss(sims2, torch.tensor([0]), "vse_sum", margin=m), torch.tensor([0.15 + 0.1]))
    torch.testing.assert_close(retrieval_loss(sims2, torch.tensor([0]), "vse_max", margin=m), torch.tensor([0.15]))
    soft = retrieval_loss(sims2, torch.tensor([0]), "softmax", tau=0.5)
    expected = -math.log(math.exp(1.6) / (math.exp(1.6) + math.exp(1.5) + math.exp(1.4)))
    assert float(soft) == pytest.approx(expected, rel=1e-6)
    valid = torch.tensor([[True, False, True]])  # image 1 hidden from the query
    torch.testing.assert_close(retrieval_loss(sims2, torch.tensor([0]), "vse_max", margin=m, valid=valid),
                               torch.tensor([0.1]))


class _StubJudge:
    """Caption i's embedding is one-hot on its first word; image r's is one-hot on r % 4."""

    def embed_ids(self, ids, lengths):
        return torch.nn.functional.one_hot(ids[:, 0] % 4, 4).float()

    def similarities(self, emb, rows):
        return emb @ torch.nn.functional.one_hot(rows % 4, 4).float().T


def test_retrieval_reward_counts_distractors_as_candidates_only():
    from training.captioning.scst import RewardSpec, SelfRetrievalReward

    reward = SelfRetrievalReward(None, _StubJudge(), eos_id=3, spec=RewardSpec(cider_weight=0.0, alpha=1.0, margin=0.2))
    ids = torch.tensor([[1, 3], [2, 3]])  # caption 0 matches image row 1 exactly, caption 1 matches row 2
    rows, refs = np.array([1, 2]), np.array([-1, -1])
    alone = reward(ids, rows, refs)
    torch.testing.assert_close(alone.r_ret, torch.tensor([0.0, 0.0]))  # 1 − 0 ≥ margin: no hinge
    # a distractor that looks exactly like image 1 (row 5 ≡ 1 mod 4): caption 0's hinge is the margin
    more = reward(ids, rows, refs, np.array([5, 7]))
    torch.testing.assert_close(more.r_ret, torch.tensor([-0.2, 0.0]))
    assert more.total.shape == (2,)  # still one reward per caption: distractors get none


def test_negative_sampler_modes():
    ranked = np.array([[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]] * 2 + [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]] * 2)
    cap_img = np.array([0, 0, 1, 1])
    rng = np.random.default_rng(0)
    hard = NegativeSampler(ranked, cap_img, 10, mode="hardest")
    assert hard.sample(np.array([0, 1]), rng).tolist() == [9, 0]
    mod = NegativeSampler(ranked, cap_img, 10, mode="moderate", h_min=3, h_max=5)
    for _ in range(20):
        a, b = mod.sample(np.array([0, 1]), rng)
        assert a in (7, 6, 5) and b in (2, 3, 4)  # ranks 3..5 of each image's ranking
    rand = NegativeSampler(None, cap_img, 10, mode="random")
    assert len(set(rand.sample(np.array([0, 1, 0, 1, 0]), rng).tolist())) == 5
    dup = NegativeSampler(ranked, cap_img, 10, mode="hardest").sample(np.array([0, 0, 0]), rng)
    assert len(set(dup.tolist())) == 3  # repeated picks are replaced: no twin images in a batch


# ---- model ---------------------------------------------------------------------------------------
def test_teacher_forcing_equals_stepping_and_scheduled_sampling_changes_inputs():
    from training.captioning.config import CapModelConfig
    from training.captioning.model import TopDownCaptioner

    torch.manual_seed(0)
    model = TopDownCaptioner(12, 16, CapModelConfig(word_dim=8, hidden=8, att_dim=8, dropout=0.0)).eval()
    regions = torch.rand(2, 4, 16)
    targets = torch.tensor([[4, 5, 6, 3, 0], [7, 3, 0, 0, 0]])
    ctx = model.encode(regions)
    tf = model.teacher_forced(ctx, targets)
    assert tf.shape == (2, 4, 12)  # stops after the longest caption's <eos>
    state, words = model.init_state(2), torch.tensor([2, 2])
    for t in range(4):
        lp, state = model.step(words, ctx, state)
        torch.testing.assert_close(lp, tf[:, t])
        words = targets[:, t]
    swapped = model.teacher_forced(ctx, targets, ss_prob=1.0, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(swapped[:, 1:], tf[:, 1:])
    torch.testing.assert_close(swapped[:, 0], tf[:, 0])  # the first input is always <bos>


# ---- checkpoint safety ---------------------------------------------------------------------------
class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_crafted_caption_checkpoint_is_refused_without_running_code(tmp_path):
    from training.captioning.checkpoint import load_caption_checkpoint
    from training.checkpoint import load_checkpoint

    marker = tmp_path / "pwned"
    bad = tmp_path / "evil.pt"
    torch.save({"kind": "ltd-captioner", "model": {}, "config": {}, "vocab": {}, "feat_dim": 1, "x": _Exploit(marker)}, bad)
    with pytest.raises(ValueError, match="objects other than tensors and plain data"):
        load_caption_checkpoint(bad)  # through the retrieval checkpoints' loader: one safe loader for both
    with pytest.raises(ValueError, match="objects other than tensors and plain data"):
        load_checkpoint(bad)
    assert not marker.exists()
    retrieval_like = tmp_path / "r.pt"
    torch.save({"model": {}, "config": {}, "vocab": {}}, retrieval_like)
    with pytest.raises(ValueError, match="a caption checkpoint was expected; a retrieval checkpoint goes to --retrieval"):
        load_caption_checkpoint(retrieval_like)


def test_reward_word_ids_extend_the_vocabulary_and_unk_never_matches():
    from training.captioning.cider import CiderD
    from training.captioning.data import WordIds, labelled_mask

    caps = ["a dog runs"] * 5 + ["a zebra runs"]
    v = CaptionVocab.build(caps, min_count=5)
    words = WordIds(v, caps)
    assert all(words.index[w] == i for i, w in enumerate(v.words))  # the captioner's ids are a prefix
    assert words.encode("a zebra") == [v.vocab.index["a"], len(v)]  # the rare word has an id of its own
    c = CiderD([[words.encode("a zebra runs")], [words.encode("a dog sits")]], base=words.size + 2)
    hyp_unk = [v.vocab.index["a"], v.unk_id, v.vocab.index["runs"]]  # what the captioner can say for "a zebra runs"
    hyp_ref = words.encode("a zebra runs")
    s_unk, s_ref = c.score([hyp_unk, hyp_ref], [0, 0])
    assert s_ref > s_unk > 0
    m1, m2 = labelled_mask(10, 0.5, seed=3), labelled_mask(10, 0.5, seed=3)
    assert m1.sum() == 5 and (m1 == m2).all() and labelled_mask(10, 1.0, 0).all()
