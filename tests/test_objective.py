"""The training objective: the one reader of the loss config, its answers, its terms and its state."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from training.config import LossConfig
from training.data.vocab import Vocab
from training.losses.objective import TrainingObjective, objective_needs

ROOT = Path(__file__).resolve().parent.parent
# Where the loss config may be read; elsewhere it may only be handed, whole, to these.
READERS = ("training/losses/", "training/config.py")
HANDED_TO = {"objective_needs", "TrainingObjective", "describe_loss"}


def loss_config_reads(source: str) -> list[int]:
    """Line numbers where ``source`` reads the loss config: ``x.loss`` other than as an argument of
    objective_needs/TrainingObjective, ``getattr(x, "loss")``, or an import of ``LossConfig``."""
    tree = ast.parse(source)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "loss":
            call = parent.get(node)
            func = getattr(call, "func", None)
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            if not (isinstance(call, ast.Call) and node in call.args and name in HANDED_TO):
                lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr" and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value == "loss"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and any(a.name == "LossConfig" for a in node.names):
            lines.append(node.lineno)
    return lines


def test_the_checker_sees_reads_and_allows_handing_over():
    assert loss_config_reads("if cfg.loss.mode == 'none':\n    pass") == [1]
    assert loss_config_reads("lc = cfg.loss\nx = lc.eta") == [1]
    assert loss_config_reads("x = getattr(cfg, 'loss').eta") == [1]
    assert loss_config_reads("from training.config import Config, LossConfig") == [1]
    assert loss_config_reads("f(cfg.loss)") == [1]  # an arbitrary function would read it
    assert loss_config_reads("n = objective_needs(cfg.loss)\no = TrainingObjective(cfg.loss, total_steps=3)") == []
    assert loss_config_reads("out['loss'].backward()") == []


def test_nothing_outside_losses_and_config_reads_the_loss_config():
    """Issue 19: the objective answers what the data pipeline and the model need, so the loss config
    has one reader, in every package."""
    offenders = []
    for path in sorted(p for top in ("training", "indexer", "search", "app", "ui") for p in (ROOT / top).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(READERS):
            offenders += [f"{rel}:{n}" for n in loss_config_reads(path.read_text())]
    assert offenders == []


@pytest.mark.parametrize("overrides, decoder, target_model, similarity", [
    ({}, None, None, "cosine"),
    ({"decoder": "itd"}, None, None, "cosine"),  # mode none: no decoder whatever loss.decoder says
    ({"mode": "dual"}, "ltd", "", "cosine"),
    ({"mode": "constraint", "target_model": "all-mpnet-base-v2"}, "ltd", "all-mpnet-base-v2", "cosine"),
    ({"mode": "replay", "decoder": "itd", "target_model": "x", "lambda_schedule": "run"}, "itd", None, "cosine"),
    ({"contrastive": "order"}, None, None, "order"),
    ({"contrastive": "sh_mh"}, None, None, "cosine"),
])
def test_needs_answer_what_data_and_model_must_provide(overrides, decoder, target_model, similarity):
    needs = objective_needs(LossConfig(**overrides))
    assert (needs.decoder, needs.target_model, needs.similarity) == (decoder, target_model, similarity)
    assert needs.tokens == (decoder == "itd")


class _Echo(torch.nn.Module):
    """A decoder that returns fixed outputs and records what it was given."""

    def __init__(self, out):
        super().__init__()
        self.out, self.seen = out, []

    def forward(self, emb, batch=None):
        self.seen.append(batch)
        return self.out


def test_ltd_terms_are_the_cosine_reconstruction_combined_by_beta():
    torch.manual_seed(0)
    img, txt = F.normalize(torch.randn(4, 8), dim=1), F.normalize(torch.randn(4, 8), dim=1)
    pred, target = torch.randn(4, 5), torch.randn(4, 5)
    obj = TrainingObjective(LossConfig(mode="dual", beta=0.3, tau=0.1), total_steps=1)
    out = obj(img, txt, decoder=_Echo(pred), targets=target)
    logits = img @ txt.t() / 0.1
    l_con = 0.5 * (F.cross_entropy(logits, torch.arange(4)) + F.cross_entropy(logits.t(), torch.arange(4)))
    l_rec = (1 - F.cosine_similarity(pred, target, dim=-1)).mean()
    assert float(out["l_con"]) == pytest.approx(float(l_con), rel=1e-6)
    assert float(out["l_rec"]) == pytest.approx(float(l_rec), rel=1e-6)
    assert float(out["loss"]) == pytest.approx(float(l_con + 0.3 * l_rec), rel=1e-6)
    assert float(out["rec_cos_sim"]) == pytest.approx(1 - float(l_rec), rel=1e-6)
    assert float(out["con_tau"]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="targets"):
        obj(img, txt, decoder=_Echo(pred))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_itd_terms_teacher_force_the_captions_tokens(reduction):
    vocab = Vocab.build([["a", "red", "dog"], ["cat"]])
    caps = ["a red dog", "cat"]  # 3 tokens + <eos>, 1 token + <eos>
    logits = torch.randn(2, 4, len(vocab))
    obj = TrainingObjective(LossConfig(mode="dual", decoder="itd", itd_reduction=reduction), total_steps=1,
                            vocab=vocab, max_caption_len=40)
    dec = _Echo(logits)
    out = obj(torch.eye(2), torch.eye(2), decoder=dec, captions=caps)
    ids = [vocab.encode_text(c) for c in caps]
    assert dec.seen[0]["itd_in"].tolist() == [[vocab.bos_id, *ids[0]], [vocab.bos_id, *ids[1], 0, 0]]
    tgt = torch.tensor([[*ids[0], vocab.eos_id], [*ids[1], vocab.eos_id, 0, 0]])
    nll = -torch.log_softmax(logits, -1).gather(-1, tgt[..., None])[..., 0] * (tgt != 0)
    expected = nll.sum() / (2 if reduction == "sum" else 6)
    assert float(out["l_rec"]) == pytest.approx(float(expected), rel=1e-6)
    assert float(out["rec_perplexity"]) == pytest.approx(float((nll.sum() / 6).exp()), rel=1e-5)
    with pytest.raises(ValueError, match="vocabulary"):
        TrainingObjective(LossConfig(mode="dual", decoder="itd"), total_steps=1)


def test_state_carries_lambda_and_the_curriculum_stage():
    cfg = LossConfig(contrastive="sh_mh", curriculum_patience=1, mode="constraint", eta=0.5)
    obj = TrainingObjective(cfg, total_steps=10)
    out = obj(torch.eye(3), torch.eye(3), decoder=_Echo(torch.ones(3, 2)), targets=torch.ones(3, 2) * -1)
    obj.step_done(out)  # L_rec = 2 > η: λ rises
    assert (obj.end_epoch(improved=True), obj.end_epoch(improved=False)) == (False, True)
    assert obj.contrastive_name == "mh" and type(obj.contrastive).__name__ == "MaxHingeLoss"
    other = TrainingObjective(cfg, total_steps=10)
    other.load_checkpoint_state(obj.checkpoint_state())
    assert other.contrastive_name == "mh" and type(other.contrastive).__name__ == "MaxHingeLoss"
    assert float(other.combiner.multiplier) == float(obj.combiner.multiplier) > cfg.lambda_init
    assert other.lambda_trace.tolist() == [cfg.lambda_init]
