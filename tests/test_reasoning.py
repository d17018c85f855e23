"""Region-reasoning encoders (issue 21): VSRN-style graph reasoning and TERN-style transformers.
Shapes and gradients on tiny inputs, the caption side's remembered layers, and the config rules."""
from __future__ import annotations

import logging

import pytest
import torch

from training.config import ConfigError, ModelConfig, load_config
from training.models.tern import SharedReasoning, TERNImageHead
from training.models.vsrn import RegionGCN, VSRNImageHead, regions_of

B, R, C, D, E = 3, 5, 12, 16, 8


def _rows(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(B, R * C, generator=g) * 3).half()  # the feature cache's float16 rows


def _all_params_get_gradients(module: torch.nn.Module, out: torch.Tensor) -> list[str]:
    (out * torch.randn_like(out)).sum().backward()
    return [n for n, p in module.named_parameters()
            if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all() or not p.grad.abs().sum())]


def test_regions_of_reads_rows_region_by_region():
    rows = torch.arange(2 * 3 * 4, dtype=torch.float16).reshape(2, 12)
    reg = regions_of(rows, 4)
    assert reg.shape == (2, 3, 4) and reg.dtype == torch.float32
    assert reg[1, 2].tolist() == rows[1, 8:12].float().tolist()
    with pytest.raises(ValueError, match="region rows must be"):
        regions_of(rows, 5)


def test_gcn_affinity_is_the_scaled_dot_product_of_two_embeddings():
    layer = RegionGCN(D)
    v = torch.randn(B, R, D)
    want = torch.einsum("brd,bsd->brs", layer.theta(v), layer.phi(v)) / R
    torch.testing.assert_close(layer.affinity(v), want)
    # BN's scale starts at 0 (VSRN): the layer starts as the identity
    layer.train()
    torch.testing.assert_close(layer(v), v)


def test_vsrn_image_head_shapes_and_gradients():
    torch.manual_seed(0)
    head = VSRNImageHead(C, D, E, layers=2, head_hidden=32)
    for layer in head.gcn:  # past initialisation the graph branch is on; every weight must then learn
        torch.nn.init.ones_(layer.bn.weight)
    out = head(_rows())
    assert out.shape == (B, E)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(B))
    assert _all_params_get_gradients(head, out) == []


def test_vsrn_graph_layers_make_regions_interact():
    """Changing one region changes the reasoned features of the others (fully connected graph)."""
    torch.manual_seed(0)
    head = VSRNImageHead(C, D, E, layers=1).eval()
    torch.nn.init.ones_(head.gcn[0].bn.weight)
    rows = _rows().float()
    moved = rows.clone()
    moved[:, :C] += 5.0  # region 0 only
    a, b = head.reason(rows), head.reason(moved)
    assert (a[:, 1:] - b[:, 1:]).abs().max() > 1e-4


def test_tern_image_head_shapes_gradients_and_positions():
    torch.manual_seed(0)
    shared = SharedReasoning(D, E, layers=1, heads=2, ff=32, dropout=0.0)
    shape = ModelConfig(reasoning_dim=D, reasoning_layers=1, attention_heads=2, reasoning_ff=32, reasoning_dropout=0.0)
    head = TERNImageHead(C, R, shape.model_copy(update={"region_positions": True}), shared)
    out = head(_rows())
    assert out.shape == (B, E)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(B))
    assert _all_params_get_gradients(head, out) == []
    # without position embeddings the regions are a set: permuting them does not change the output
    plain = TERNImageHead(C, R, shape, shared).eval()
    rows = _rows().float()
    perm = rows.reshape(B, R, C)[:, torch.randperm(R)].reshape(B, R * C)
    torch.testing.assert_close(plain(rows), plain(perm), atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def tern_text():
    from training.models.tern_text import TERNTextEncoder
    from training.targets import resolve_sentence_model

    torch.manual_seed(0)
    shared = SharedReasoning(D, E, layers=1, heads=2, ff=32, dropout=0.0)
    return TERNTextEncoder(str(resolve_sentence_model("")), D, shared, train_layers=1)


CAPTIONS = ["a dog runs on the grass .", "two people", "a child rides a red bicycle down a long street"]


def test_tern_text_encoder_shapes_and_gradients(tern_text):
    tern_text.train()
    out = tern_text(tern_text.prepare(CAPTIONS, train=True))
    assert out.shape == (3, E)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(3))
    stale = _all_params_get_gradients(tern_text, out)
    assert stale == [] and tern_text.split == 5  # MiniLM has 6 layers; the top one trains
    trainable = {n.split(".")[0] for n, p in tern_text.named_parameters() if p.requires_grad}
    assert trainable == {"st", "fc", "norm", "shared"}


def test_tern_remembered_layers_give_the_full_model_output(tern_text):
    tern_text.eval()
    with torch.no_grad():
        full = tern_text(tern_text.prepare(CAPTIONS))
        remembered = tern_text(tern_text.prepare(CAPTIONS, train=True))
    assert {"hidden", "attention_mask"} == set(tern_text.prepare(CAPTIONS, train=True))
    assert set(CAPTIONS) <= set(tern_text._memory)
    torch.testing.assert_close(remembered, full, atol=2e-3, rtol=0)  # float16 memory


def test_tern_shares_one_module_between_the_modalities(tmp_path):
    from training.data.vocab import Vocab
    from training.models.dual_encoder import build_model

    cfg = load_config("synthetic_baseline", TERN + ["model.image_size=64"])
    model = build_model(cfg, Vocab.build([["a"]]))
    assert model.image.head.shared is model.text.shared
    n_unique = len({id(p) for p in model.parameters()})
    assert n_unique == len(list(model.parameters()))  # the optimiser sees shared weights once
    state = model.state_dict()
    assert any(k.startswith("image.head.shared.") for k in state) and any(k.startswith("text.shared.") for k in state)


VSRN = ["model.image_encoder=vsrn", "model.image_features=grid", "model.reasoning_dim=32", "model.reasoning_layers=2"]
TERN = ["model.image_encoder=tern", "model.text_encoder=tern", "model.image_features=grid", "model.reasoning_dim=32",
        "model.reasoning_layers=1", "model.shared_layers=1", "model.attention_heads=2", "model.reasoning_ff=64",
        "model.sbert_train_layers=1", "model.region_positions=true"]


@pytest.mark.parametrize("sets, message", [
    (["model.image_encoder=tern", "model.image_features=grid"], "TERN's shared transformer layers need both sides"),
    (["model.text_encoder=tern"], "TERN's shared transformer layers need both sides"),
    (["model.image_encoder=vsrn"], "reasons over regions: use the packaged CNN's grid cells"),
    (["model.image_encoder=vsrn", "model.image_features=grid", "model.crops=2"], "region encoders read one view"),
    (["model.image_features=grid"], "pick a region encoder"),
    (["model.image_encoder=vsrn", "model.backbone=precomputed", "model.precomputed_path=x",
      "model.image_features=fne"], "fne does not apply"),
    ([*TERN, "model.attention_heads=3"], "must be >= 1 and divide model.reasoning_dim=32"),
])
def test_config_rules_for_region_encoders(sets, message):
    with pytest.raises(ConfigError, match=message):
        load_config("synthetic_baseline", sets)


def test_ltd_targets_from_the_tern_encoders_own_model_are_refused(caplog):
    from training.prepare import check_target_model

    m = load_config("synthetic_baseline", TERN).model
    with pytest.raises(ConfigError, match="LTD would reconstruct its own input: set loss.target_model=all-mpnet"):
        check_target_model(m, "")
    sbert = load_config("synthetic_baseline", ["model.text_encoder=sbert"]).model
    with caplog.at_level(logging.WARNING, logger="training.prepare"):
        check_target_model(sbert, "")  # allowed (the frozen-MiniLM presets), but said
    assert "LTD targets come from the caption encoder's own model" in caplog.text
    check_target_model(load_config("synthetic_baseline", VSRN).model, "")  # a bi-GRU: nothing to say
