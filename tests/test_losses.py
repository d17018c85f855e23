"""Tests for training/losses: values against hand numbers and explicit loops, gradients, masking,
and the Lagrange multiplier's trajectory. CPU only, a second or two in all."""
from __future__ import annotations

import copy
import io
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from training.losses import (
    CONTRASTIVE_LOSSES,
    IFMLoss,
    InfoNCELoss,
    ITDReconstructionLoss,
    LambdaSettings,
    LossCombiner,
    LTDReconstructionLoss,
    MaxHingeLoss,
    OrderLoss,
    SumHingeLoss,
    build_contrastive_loss,
    cosine_reconstruction_loss,
    cosine_similarity,
    hinge_loss_from_scores,
    ifm_loss,
    ifm_similarities,
    infonce_loss,
    max_hinge_loss,
    order_similarity,
    same_image_mask,
    similarity_fn,
    similarity_for,
    sum_hinge_loss,
    symmetric_cross_entropy,
    token_nll_loss,
)


# ----------------------------------------------------------------------------- references
def _dot(a, b) -> float:
    return sum(x * y for x, y in zip(a, b))


def _excluded(i: int, k: int, ids) -> bool:
    return i != k and ids is not None and ids[i] == ids[k]


def _ref_infonce_from_sims(sims, tau: float, ids=None) -> float:
    """Symmetric InfoNCE with an explicit loop over a list-of-lists similarity matrix."""
    b = len(sims)
    i2t = t2i = 0.0
    for i in range(b):
        denom = sum(math.exp(sims[i][j] / tau) for j in range(b) if not _excluded(i, j, ids))
        i2t += -(sims[i][i] / tau - math.log(denom))
    for j in range(b):
        denom = sum(math.exp(sims[i][j] / tau) for i in range(b) if not _excluded(j, i, ids))
        t2i += -(sims[j][j] / tau - math.log(denom))
    return 0.5 * (i2t / b + t2i / b)


def _ref_sims(img, txt):
    return [[_dot(a, b) for b in txt.tolist()] for a in img.tolist()]


def _ref_hinge(sims, margin: float, max_violation: bool, ids=None) -> float:
    """Sum over the batch of both directions' hinge costs, by loops."""
    b = len(sims)
    total = 0.0
    for i in range(b):  # image i as query, captions j as negatives
        costs = [max(0.0, margin + sims[i][j] - sims[i][i]) for j in range(b)
                 if j != i and not _excluded(i, j, ids)]
        total += (max(costs) if max_violation else sum(costs)) if costs else 0.0
    for j in range(b):  # caption j as query, images i as negatives
        costs = [max(0.0, margin + sims[i][j] - sims[j][j]) for i in range(b)
                 if i != j and not _excluded(j, i, ids)]
        total += (max(costs) if max_violation else sum(costs)) if costs else 0.0
    return total


def _unit(b: int, d: int, seed: int, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    img = F.normalize(torch.randn(b, d, generator=g, dtype=dtype), dim=1)
    txt = F.normalize(torch.randn(b, d, generator=g, dtype=dtype), dim=1)
    return img, txt


# Hand-made score matrix S[i, j] = s(img_i, txt_j); obtained from embeddings as img = I, txt = Sᵀ.
S = [[0.9, 0.5, 0.1],
     [0.72, 0.8, 0.75],
     [0.2, 0.65, 0.7]]
# Margin 0.2, hinge costs worked out by hand:
#   image queries (rows):    row0 none; row1 .72→.12, .75→.15; row2 .65→.15
#   caption queries (cols):  col0 .72→.02; col1 .65→.05; col2 .75→.25
MH_SUM = 0.15 + 0.15 + 0.02 + 0.05 + 0.25   # 0.62
SH_SUM = 0.12 + 0.15 + 0.15 + 0.02 + 0.05 + 0.25  # 0.74


def _s_embeddings() -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.tensor(S, dtype=torch.float64)
    return torch.eye(3, dtype=torch.float64), scores.t().contiguous()


# ----------------------------------------------------------------------------- InfoNCE
def test_infonce_hand_value():
    # logits = I with τ = 1: every row is CE over [1, 0] → log(1 + e^-1) = 0.3132616875 in both directions.
    eye = torch.eye(2, dtype=torch.float64)
    assert infonce_loss(eye, eye, tau=1.0).item() == pytest.approx(0.3132616875, abs=1e-9)


def test_infonce_matches_loop_and_module():
    img, txt = _unit(5, 7, seed=0)
    ref = _ref_infonce_from_sims(_ref_sims(img, txt), tau=0.05)
    assert infonce_loss(img, txt, 0.05).item() == pytest.approx(ref, rel=1e-10)
    out = InfoNCELoss(tau=0.05)(img, txt)
    assert out["loss"].item() == pytest.approx(ref, rel=1e-10)
    assert out["loss"].item() == pytest.approx(0.5 * (out["l_i2t"] + out["l_t2i"]).item(), rel=1e-12)
    assert out["tau"].item() == pytest.approx(0.05)
    assert not out["l_i2t"].requires_grad and not out["tau"].requires_grad


def test_infonce_gradient_is_softmax_weighted_candidates_minus_positive():
    # One-directional CE for query q = img_0 over candidates v = txt:
    #   d CE / d q = (1/τ) (Σ_j Z_j v_j − v⁺),   Z = softmax_j(q·v_j / τ).
    # l_i2t is the mean over B rows and q only enters row 0, hence the extra 1/B.
    b, d, tau = 3, 4, 0.1
    img, txt = _unit(b, d, seed=1)
    img.requires_grad_(True)
    txt.requires_grad_(True)
    l_i2t, l_t2i = symmetric_cross_entropy(img @ txt.t() / tau)
    (g_img,) = torch.autograd.grad(l_i2t, img, retain_graph=True)

    q, v = img[0].tolist(), txt.tolist()
    logits = [_dot(q, vj) / tau for vj in v]
    z = [math.exp(x) for x in logits]
    z = [x / sum(z) for x in z]
    expected = [(sum(z[j] * v[j][k] for j in range(b)) - v[0][k]) / tau / b for k in range(d)]
    torch.testing.assert_close(g_img[0], torch.tensor(expected, dtype=torch.float64), atol=1e-5, rtol=0)

    # Same in the other direction: caption 0 as query over the images.
    (g_txt,) = torch.autograd.grad(l_t2i, txt)
    q, v = txt[0].tolist(), img.tolist()
    z = [math.exp(_dot(q, vi) / tau) for vi in v]
    z = [x / sum(z) for x in z]
    expected = [(sum(z[i] * v[i][k] for i in range(b)) - v[0][k]) / tau / b for k in range(d)]
    torch.testing.assert_close(g_txt[0], torch.tensor(expected, dtype=torch.float64), atol=1e-5, rtol=0)


def test_infonce_keeps_float64_and_upcasts_half():
    img, txt = _unit(4, 8, seed=2)
    assert infonce_loss(img, txt, 0.05).dtype == torch.float64
    half = infonce_loss(img.bfloat16(), txt.bfloat16(), 0.05)
    assert half.dtype == torch.float32 and torch.isfinite(half)
    assert half.item() == pytest.approx(infonce_loss(img, txt, 0.05).item(), rel=0.05)


def test_learnable_tau_is_log_inverse_and_clamped():
    loss = InfoNCELoss(tau=0.05, learnable_tau=True)
    params = dict(loss.named_parameters())
    assert list(params) == ["temperature.log_inv_tau"]
    assert params["temperature.log_inv_tau"].item() == pytest.approx(math.log(20))
    img, txt = _unit(4, 8, seed=3, dtype=torch.float32)
    out = loss(img, txt)
    out["loss"].backward()
    assert out["tau"].item() == pytest.approx(0.05, rel=1e-6)
    assert params["temperature.log_inv_tau"].grad is not None
    with torch.no_grad():
        params["temperature.log_inv_tau"].fill_(10.0)  # 1/τ = e^10, beyond CLIP's cap of 100
    assert loss(img, txt)["tau"].item() == pytest.approx(0.01, rel=1e-6)
    loss.temperature.project_()
    assert params["temperature.log_inv_tau"].item() == pytest.approx(math.log(100))
    assert not list(InfoNCELoss(tau=0.05).parameters())  # fixed τ: nothing to optimise


# ----------------------------------------------------------------------------- hinge losses
def test_hinge_hand_values_and_hardest_negative():
    scores = torch.tensor(S, dtype=torch.float64)
    mh = hinge_loss_from_scores(scores, 0.2, max_violation=True)
    sh = hinge_loss_from_scores(scores, 0.2, max_violation=False)
    assert mh["loss"].item() == pytest.approx(MH_SUM, abs=1e-12)
    assert sh["loss"].item() == pytest.approx(SH_SUM, abs=1e-12)
    assert mh["l_i2t"].item() == pytest.approx(0.30, abs=1e-12)
    assert mh["l_t2i"].item() == pytest.approx(0.32, abs=1e-12)
    # hardest negative caption of each image (row argmax off the diagonal) and vice versa
    assert mh["hardest_neg_i2t"].tolist() == [1, 2, 1]
    assert mh["hardest_neg_t2i"].tolist() == [1, 2, 1]
    assert mh["pos_sim"].item() == pytest.approx(0.8)
    # the same numbers through the embedding functions and the modules
    img, txt = _s_embeddings()
    assert max_hinge_loss(img, txt).item() == pytest.approx(MH_SUM, abs=1e-12)
    assert sum_hinge_loss(img, txt).item() == pytest.approx(SH_SUM, abs=1e-12)
    assert MaxHingeLoss()(img, txt)["loss"].item() == pytest.approx(MH_SUM, abs=1e-12)
    assert SumHingeLoss()(img, txt)["loss"].item() == pytest.approx(SH_SUM, abs=1e-12)
    assert MaxHingeLoss(reduction="mean")(img, txt)["loss"].item() == pytest.approx(MH_SUM / 3, abs=1e-12)
    assert SumHingeLoss(reduction="mean")(img, txt)["loss"].item() == pytest.approx(SH_SUM / 3, abs=1e-12)


def test_max_hinge_gradient_reaches_only_the_hardest_negatives():
    scores = torch.tensor(S, dtype=torch.float64, requires_grad=True)
    hinge_loss_from_scores(scores, 0.2, max_violation=True)["loss"].backward()
    # active image queries: row1 → col2, row2 → col1; active caption queries: col0 → row1,
    # col1 → row2, col2 → row1. Each adds +1 at (query, hardest) and −1 at the positive.
    expected = torch.tensor([[-1.0, 0.0, 0.0],
                             [1.0, -2.0, 2.0],
                             [0.0, 2.0, -2.0]], dtype=torch.float64)
    torch.testing.assert_close(scores.grad, expected)


@pytest.mark.parametrize("seed", range(5))
def test_hinge_matches_loop_and_sh_dominates_mh(seed):
    img, txt = _unit(7, 5, seed=seed)
    ids = torch.tensor([0, 0, 1, 2, 2, 2, 3]) if seed % 2 else None
    sims = _ref_sims(img, txt)
    ids_list = ids.tolist() if ids is not None else None
    for reduction, scale in (("sum", 1.0), ("mean", 1 / 7)):
        mh = max_hinge_loss(img, txt, 0.2, ids, reduction).item()
        sh = sum_hinge_loss(img, txt, 0.2, ids, reduction).item()
        assert mh == pytest.approx(scale * _ref_hinge(sims, 0.2, True, ids_list), abs=1e-10)
        assert sh == pytest.approx(scale * _ref_hinge(sims, 0.2, False, ids_list), abs=1e-10)
        assert sh >= mh - 1e-12
    # with a single negative per query, SH and MH coincide
    img2, txt2 = _unit(2, 5, seed=seed)
    assert sum_hinge_loss(img2, txt2).item() == pytest.approx(max_hinge_loss(img2, txt2).item())


def test_hinge_single_row_has_no_negative():
    out = hinge_loss_from_scores(torch.tensor([[0.3]]), 0.2, max_violation=True)
    assert out["loss"].item() == 0.0
    assert out["hardest_neg_i2t"].tolist() == [-1] and out["hardest_neg_t2i"].tolist() == [-1]


# ----------------------------------------------------------------------------- masking
def test_same_image_mask():
    mask = same_image_mask(torch.tensor([0, 0, 1, 2, 2]), 5)
    expected = {(0, 1), (1, 0), (3, 4), (4, 3)}
    assert {(i, j) for i in range(5) for j in range(5) if mask[i, j]} == expected
    assert same_image_mask(None, 5) is None
    with pytest.raises(ValueError, match="image_ids"):
        same_image_mask(torch.tensor([0, 1]), 3)


def test_infonce_masks_other_captions_of_the_same_image():
    # Two captions of image e0 in one batch, both perfectly aligned with it.
    e = torch.eye(3, dtype=torch.float64)
    img = torch.stack([e[0], e[0], e[1], e[2]])
    txt = torch.stack([e[0], e[0], e[1], e[2]])
    ids = torch.tensor([7, 7, 8, 9])
    unmasked = infonce_loss(img, txt, 0.05).item()
    masked = infonce_loss(img, txt, 0.05, image_ids=ids).item()
    # unmasked: rows 0 and 1 split their mass between two equal logits → CE ≈ log 2 each
    assert unmasked == pytest.approx(0.5 * math.log(2), rel=1e-6)
    assert masked < 1e-6
    # general case against the loop
    img, txt = _unit(6, 4, seed=4)
    ids = torch.tensor([0, 1, 1, 2, 3, 3])
    ref = _ref_infonce_from_sims(_ref_sims(img, txt), 0.05, ids.tolist())
    assert infonce_loss(img, txt, 0.05, ids).item() == pytest.approx(ref, rel=1e-10)
    assert InfoNCELoss()(img, txt, ids)["loss"].item() == pytest.approx(ref, rel=1e-10)
    # all-distinct ids change nothing
    assert infonce_loss(img, txt, 0.05, torch.arange(6)).item() == pytest.approx(
        infonce_loss(img, txt, 0.05).item(), rel=1e-12)


def test_masked_pair_gets_no_gradient_from_the_negative_term():
    img, txt = _unit(4, 6, seed=5)
    logits = (img @ txt.t() / 0.05).detach().requires_grad_(True)
    mask = same_image_mask(torch.tensor([0, 0, 1, 2]), 4)
    l_i2t, l_t2i = symmetric_cross_entropy(logits, mask)
    (l_i2t + l_t2i).backward()
    assert logits.grad[0, 1].item() == 0.0 and logits.grad[1, 0].item() == 0.0
    assert logits.grad[0, 2].item() != 0.0


def test_hinge_masks_same_image_pairs_by_hand():
    scores = torch.tensor(S, dtype=torch.float64)
    ids = torch.tensor([0, 1, 1])  # rows 1 and 2 show the same image
    mh = hinge_loss_from_scores(scores, 0.2, max_violation=True, image_ids=ids)
    sh = hinge_loss_from_scores(scores, 0.2, max_violation=False, image_ids=ids)
    # only negatives left that violate: row1 → col0 (.12), col0 → row1 (.02)
    assert mh["loss"].item() == pytest.approx(0.14, abs=1e-12)
    assert sh["loss"].item() == pytest.approx(0.14, abs=1e-12)
    assert mh["hardest_neg_i2t"].tolist() == [1, 0, 0]
    assert mh["hardest_neg_t2i"].tolist() == [1, 0, 0]
    # every row showing the same image: no negatives at all
    none_left = hinge_loss_from_scores(scores, 0.2, max_violation=True, image_ids=torch.zeros(3, dtype=torch.long))
    assert none_left["loss"].item() == 0.0 and none_left["hardest_neg_i2t"].tolist() == [-1, -1, -1]


# ----------------------------------------------------------------------------- IFM
def test_ifm_shifts_logits_by_epsilon_over_tau():
    img, txt = _unit(4, 6, seed=6)
    scores = img @ txt.t()
    eps, tau = 0.1, 0.05
    shift = ifm_similarities(scores, eps) / tau - scores / tau
    eye = torch.eye(4, dtype=torch.bool)
    torch.testing.assert_close(shift[eye], torch.full((4,), -eps / tau, dtype=torch.float64))
    torch.testing.assert_close(shift[~eye], torch.full((12,), eps / tau, dtype=torch.float64))


def test_ifm_loss_values():
    img, txt = _unit(5, 6, seed=7)
    eps, tau = 0.1, 0.05
    sims = _ref_sims(img, txt)
    shifted = [[s - eps if i == j else s + eps for j, s in enumerate(row)] for i, row in enumerate(sims)]
    ref_plain = _ref_infonce_from_sims(sims, tau)
    ref_ifm = _ref_infonce_from_sims(shifted, tau)
    out = IFMLoss(tau=tau, epsilon=eps)(img, txt)
    assert out["l_infonce"].item() == pytest.approx(ref_plain, rel=1e-10)
    assert out["l_ifm"].item() == pytest.approx(ref_ifm, rel=1e-10)
    assert out["loss"].item() == pytest.approx(0.5 * (ref_ifm + ref_plain), rel=1e-10)
    assert ifm_loss(img, txt, tau, eps).item() == pytest.approx(0.5 * (ref_ifm + ref_plain), rel=1e-10)
    assert ref_ifm > ref_plain  # the perturbation makes the task harder
    # ε = 0 is plain InfoNCE
    assert ifm_loss(img, txt, tau, 0.0).item() == pytest.approx(infonce_loss(img, txt, tau).item(), rel=1e-12)
    # masking is the InfoNCE masking
    ids = torch.tensor([0, 0, 1, 2, 2])
    ref_masked = 0.5 * (_ref_infonce_from_sims(shifted, tau, ids.tolist())
                        + _ref_infonce_from_sims(sims, tau, ids.tolist()))
    assert ifm_loss(img, txt, tau, eps, ids).item() == pytest.approx(ref_masked, rel=1e-10)


# ----------------------------------------------------------------------------- order embeddings
def test_order_similarity_hand_value_and_loop():
    img = torch.tensor([[1.0, 0.0]])
    txt = torch.tensor([[0.6, 0.8], [-0.6, -0.8], [1.0, 0.0]])  # abs makes the 2nd equal the 1st
    torch.testing.assert_close(order_similarity(img, txt), torch.tensor([[-0.64, -0.64, 0.0]]))

    g = torch.Generator().manual_seed(8)
    img, txt = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g, dtype=torch.float64)
    ref = [[-sum(max(0.0, abs(t[k]) - abs(i[k])) ** 2 for k in range(3)) for t in txt.tolist()]
           for i in img.tolist()]
    torch.testing.assert_close(order_similarity(img, txt), torch.tensor(ref, dtype=torch.float64))
    torch.testing.assert_close(order_similarity(img, txt, chunk_size=2), torch.tensor(ref, dtype=torch.float64))
    assert order_similarity(img, txt).shape == (5, 4)


@pytest.mark.parametrize("max_violation", [False, True])
def test_order_loss_is_hinge_on_order_similarity(max_violation):
    img, txt = _unit(6, 4, seed=9)
    ids = torch.tensor([0, 1, 1, 2, 3, 4])
    sims = [[-sum(max(0.0, abs(t[k]) - abs(i[k])) ** 2 for k in range(4)) for t in txt.tolist()]
            for i in img.tolist()]
    loss = OrderLoss(margin=0.05, max_violation=max_violation)
    assert loss.similarity == "order"
    out = loss(img, txt, ids)
    assert out["loss"].item() == pytest.approx(_ref_hinge(sims, 0.05, max_violation, ids.tolist()), abs=1e-10)


# ----------------------------------------------------------------------------- reconstruction
def test_cosine_reconstruction_loss():
    target = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    pred = torch.tensor([[5.0, 0.0], [1.0, 0.0], [-3.0, -4.0]])  # cos = 1, 0, −1
    assert cosine_reconstruction_loss(pred, target).item() == pytest.approx((0 + 1 + 2) / 3)
    out = LTDReconstructionLoss()(pred, target)
    assert out["loss"].item() == pytest.approx(1.0) and out["cos_sim"].item() == pytest.approx(0.0)
    with pytest.raises(ValueError):
        cosine_reconstruction_loss(pred, target[:2])


def test_token_nll_ignores_padding():
    g = torch.Generator().manual_seed(10)
    logits = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    targets = torch.tensor([[3, 1, 0, 0], [2, 4, 4, 0]])
    nll, n = 0.0, 0
    for b in range(2):
        for t in range(4):
            if targets[b, t] != 0:
                row = logits[b, t].tolist()
                nll += -(row[targets[b, t]] - math.log(sum(math.exp(x) for x in row)))
                n += 1
    assert token_nll_loss(logits, targets, pad_id=0).item() == pytest.approx(nll / n, rel=1e-10)
    out = ITDReconstructionLoss(pad_id=0)(logits, targets)
    assert out["loss"].item() == pytest.approx(nll / n, rel=1e-10)
    assert out["n_tokens"].item() == 5 and out["perplexity"].item() == pytest.approx(math.exp(nll / n))
    all_pad = token_nll_loss(logits, torch.zeros(2, 4, dtype=torch.long))
    assert all_pad.item() == 0.0
    with pytest.raises(ValueError):
        token_nll_loss(logits, targets[:, :3])


# ----------------------------------------------------------------------------- combiner
def test_none_and_dual_modes():
    l_con = torch.tensor(2.0, requires_grad=True)
    l_rec = torch.tensor(0.3, requires_grad=True)
    out = LossCombiner("none")(l_con, l_rec)
    assert out["loss"] is l_con and out["l_rec"].item() == pytest.approx(0.3)
    assert "lambda" not in out and "l_rec" not in LossCombiner("none")(l_con)

    out = LossCombiner("dual", beta=0.5)(l_con, l_rec)
    assert out["loss"].item() == pytest.approx(2.0 + 0.5 * 0.3)
    out["loss"].backward()
    assert l_rec.grad.item() == pytest.approx(0.5) and l_con.grad.item() == pytest.approx(1.0)
    assert not out["l_con"].requires_grad and not out["l_rec"].requires_grad
    with pytest.raises(ValueError, match="l_rec"):
        LossCombiner("dual")(l_con, None)
    # no λ to update outside constraint mode
    for mode in ("none", "dual"):
        comb = LossCombiner(mode)
        comb.update(torch.tensor(5.0))
        assert comb.multiplier is None and not list(comb.parameters())


def test_constraint_forward_treats_lambda_as_constant():
    comb = LossCombiner("constraint", eta=0.2, lam=LambdaSettings(lambda_init=3.0))
    l_con = torch.tensor(1.0, requires_grad=True)
    l_rec = torch.tensor(0.5, requires_grad=True)
    out = comb(l_con, l_rec)
    assert out["loss"].item() == pytest.approx(1.0 + 3.0 * (0.5 / 0.2 - 1))
    assert out["gap"].item() == pytest.approx(1.5) and out["lambda"].item() == pytest.approx(3.0)
    out["loss"].backward()
    assert l_rec.grad.item() == pytest.approx(3.0 / 0.2)
    assert comb.multiplier.grad is None  # the model's backward never touches λ
    assert not out["gap"].requires_grad and not out["lambda"].requires_grad


def _run(comb: LossCombiner, values) -> list[float]:
    traj = []
    for v in values:
        comb.update(torch.tensor(v))
        traj.append(comb.multiplier.detach().item())  # the *stored* value, not a clamped view
    return traj


def test_lambda_rises_while_violated_and_falls_to_zero_once_satisfied():
    comb = LossCombiner("constraint", eta=0.2)
    up = _run(comb, [0.3] * 300)  # gap = +0.5
    assert all(b > a for a, b in zip([1.0] + up, up))
    # the EMA buffer of a constant gap is the gap itself: λ = 1 + 300 · 5e-3 · 0.5
    assert up[-1] == pytest.approx(1.75, rel=1e-4)

    down = _run(comb, [0.0] * 500)  # gap = −1: λ falls (after the buffer turns), then sits at 0
    assert all(b <= a for a, b in zip(down[20:], down[21:]))
    assert down[-1] == 0.0
    first_zero = down.index(0.0)
    assert all(v == 0.0 for v in down[first_zero:])
    assert all(0.0 <= v <= 100.0 for v in up + down)
    # and it rises again as soon as the bound is violated again
    again = _run(comb, [0.4] * 10)
    assert again[-1] > 0.0


def test_lambda_is_projected_in_place_without_wind_up():
    comb = LossCombiner("constraint", eta=0.2, lam=LambdaSettings(lambda_max=100.0))
    param, ptr = comb.multiplier, comb.multiplier.data_ptr()
    huge = _run(comb, [1e6] * 300)  # gap ≈ 5e6: one unprojected step would reach ≈ 25 000
    assert huge[0] == 100.0 and all(v == 100.0 for v in huge)
    assert comb.multiplier is param and comb.multiplier.data_ptr() == ptr
    assert comb.lambda_optimizer.param_groups[0]["params"][0] is param
    assert comb(torch.tensor(1.0), torch.tensor(0.4))["lambda"].item() == 100.0

    # An extreme negative gap projects to 0, never below. (A fresh combiner: the EMA buffer of
    # the one above still holds ≈ +5e6 and would take a few steps to turn.)
    neg = _run(LossCombiner("constraint", eta=0.2), [-1e6] * 5)
    assert all(v == 0.0 for v in neg)

    # Wind-up check: 1000 steps at gap 99 would carry a straight-through-clamped raw value to
    # ≈ 1 + 1000·5e-3·99 ≈ 496, keeping λ pinned at 100 for ~80 000 steps after the gap turns.
    # Projected, λ starts falling as soon as the EMA buffer changes sign (~44 steps).
    comb = LossCombiner("constraint", eta=0.2)
    _run(comb, [0.2 * 100] * 1000)
    assert float(comb.multiplier) == 100.0
    after = _run(comb, [0.0] * 100)
    assert after[-1] < 100.0
    assert all(0.0 <= v <= 100.0 for v in after)


def test_non_finite_l_rec_is_skipped():
    comb = LossCombiner("constraint")
    _run(comb, [0.3] * 3)
    before = float(comb.multiplier)
    comb.update(torch.tensor(float("nan")))
    comb.update(float("inf"))
    assert float(comb.multiplier) == before and math.isfinite(before)


def test_state_dict_round_trip_continues_identically():
    values = [0.2 + 0.15 * math.sin(k / 7.0) for k in range(100)]
    a = LossCombiner("constraint", eta=0.2)
    _run(a, values[:50])
    snapshot = copy.deepcopy(a.state_dict())
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    expected = _run(a, values[50:])

    b = LossCombiner("constraint", eta=0.2)
    b.load_state_dict(snapshot)
    assert _run(b, values[50:]) == expected

    buffer.seek(0)
    c = LossCombiner("constraint", eta=0.2)
    c.load_state_dict(torch.load(buffer, weights_only=True))
    assert _run(c, values[50:]) == expected

    # λ alone is not enough: without the momentum buffer the trajectory differs
    d = LossCombiner("constraint", eta=0.2)
    with torch.no_grad():
        d.multiplier.copy_(snapshot["multiplier"])
    assert _run(d, values[50:]) != expected

    # nested in a parent module (e.g. a checkpointed training state), strict loading works
    parent = nn.Module()
    parent.combiner = LossCombiner("constraint", eta=0.2)
    _run(parent.combiner, values[:50])
    state = copy.deepcopy(parent.state_dict())
    assert "combiner._extra_state" in state
    clone = nn.Module()
    clone.combiner = LossCombiner("constraint", eta=0.2)
    clone.load_state_dict(state, strict=True)
    assert _run(clone.combiner, values[50:]) == _run(parent.combiner, values[50:])

    with pytest.raises(ValueError, match="mode"):
        LossCombiner("dual").load_state_dict(LossCombiner("none").state_dict())


def test_lambda_update_ignores_the_grad_scaler():
    # The model's loss is scaled by 2**16; λ never gets a gradient from that backward, and its
    # update is computed from the unscaled L_rec: first step from λ0 is lr · gap exactly.
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    comb = LossCombiner("constraint", eta=0.2, lam=LambdaSettings(lambda_init=1.0))
    x = torch.randn(8, 4)
    out_model = model(x)
    l_rec = cosine_reconstruction_loss(out_model, x)
    l_con = out_model.pow(2).mean()
    out = comb(l_con, l_rec)
    scaler.scale(out["loss"]).backward()
    assert comb.multiplier.grad is None
    scaler.step(opt)
    scaler.update()
    comb.update(l_rec)
    gap = l_rec.item() / 0.2 - 1
    assert float(comb.multiplier) == pytest.approx(min(100.0, max(0.0, 1.0 + 5e-3 * gap)), rel=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "lagrange"}, r"mode must be one of \('none', 'dual', 'constraint', 'replay'\)"),
        ({"mode": "constraint", "eta": 0.0}, "eta"),
        ({"mode": "constraint", "eta": -1.0}, "eta"),
        ({"mode": "dual", "beta": -0.1}, "beta"),
        ({"mode": "constraint", "lam": LambdaSettings(lambda_max=0.0)}, "lambda_max"),
        ({"mode": "constraint", "lam": LambdaSettings(lambda_init=200.0)}, "lambda_init"),
        ({"mode": "constraint", "lam": LambdaSettings(lambda_lr=0.0)}, "lambda_lr"),
        ({"mode": "constraint", "lam": LambdaSettings(lambda_momentum=1.0)}, "lambda_momentum"),
        ({"mode": "constraint", "lam": LambdaSettings(lambda_dampening=1.5)}, "lambda_dampening"),
    ],
)
def test_combiner_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LossCombiner(**kwargs)


# ----------------------------------------------------------------------------- factory
@pytest.mark.parametrize("name", CONTRASTIVE_LOSSES)
def test_factory_builds_every_loss(name):
    loss = build_contrastive_loss(name, tau=0.05, margin=0.2, epsilon=0.1)
    assert loss.similarity == similarity_for(name)
    img, txt = _unit(6, 8, seed=11, dtype=torch.float32)
    img.requires_grad_(True)
    out = loss(img, txt, torch.tensor([0, 0, 1, 2, 3, 3]))
    assert out["loss"].dim() == 0 and torch.isfinite(out["loss"])
    out["loss"].backward()
    assert img.grad is not None and torch.isfinite(img.grad).all()


def test_factory_names_and_similarities():
    assert isinstance(build_contrastive_loss("triplet"), MaxHingeLoss)
    assert isinstance(build_contrastive_loss("mh"), MaxHingeLoss)
    assert isinstance(build_contrastive_loss("sh"), SumHingeLoss)
    assert isinstance(build_contrastive_loss("ifm", epsilon=0.3), IFMLoss)
    assert build_contrastive_loss("ifm", epsilon=0.3).epsilon == 0.3
    assert build_contrastive_loss("triplet", margin=0.1).margin == 0.1
    assert isinstance(build_contrastive_loss("InfoNCE"), InfoNCELoss)
    assert similarity_for("order") == "order" and similarity_for("infonce") == "cosine"
    assert similarity_fn("order") is order_similarity and similarity_fn("cosine") is cosine_similarity
    with pytest.raises(ValueError, match="infonce, triplet, mh, sh, ifm, order"):
        build_contrastive_loss("clip")
    with pytest.raises(ValueError, match="cosine, order"):
        similarity_fn("l2")


@pytest.mark.parametrize(
    "factory",
    [
        lambda: InfoNCELoss(tau=0.0),
        lambda: IFMLoss(epsilon=-0.1),
        lambda: MaxHingeLoss(margin=-0.2),
        lambda: SumHingeLoss(reduction="median"),
        lambda: OrderLoss(margin=-1.0),
    ],
)
def test_losses_reject_bad_arguments(factory):
    with pytest.raises(ValueError):
        factory()


def test_shape_mismatch_raises():
    img, txt = _unit(4, 8, seed=12)
    with pytest.raises(ValueError, match="img and txt"):
        infonce_loss(img, txt[:3], 0.05)
    with pytest.raises(ValueError, match="img and txt"):
        MaxHingeLoss()(img, txt[:, :4])
