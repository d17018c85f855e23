"""The bi-GRU caption encoder's pooling (model.text_pool): checked against a one-caption-at-a-time
reference, so padding and batch mates can never leak into a caption's embedding."""
from __future__ import annotations

import pytest
import torch

from training.config import ConfigError, ModelConfig, load_config
from training.data.vocab import Vocab
from training.models.text_encoder import GRUTextEncoder

CAPTIONS = ["a dog runs on the grass", "two men", "a girl in a red coat climbs a very tall wooden ladder", "x"]


def _encoder(pool: str) -> GRUTextEncoder:
    torch.manual_seed(0)
    vocab = Vocab.build([c.split() for c in CAPTIONS])
    return GRUTextEncoder(vocab, ModelConfig(word_dim=8, text_hidden=6, embed_dim=5, text_head="linear", text_pool=pool)).eval()


def _reference_pool(enc: GRUTextEncoder, caption: str) -> torch.Tensor:
    ids = torch.tensor([enc.vocab.encode(caption.split())])
    out, _ = enc.gru(enc.embed(ids))  # one caption, no padding, no packing
    states = out[0]
    return states.max(0).values if enc.pool == "max" else states.mean(0)


@pytest.mark.parametrize("pool", ["mean", "max"])
def test_pooling_matches_one_caption_at_a_time(pool):
    enc = _encoder(pool)
    captured = {}
    enc.head.register_forward_hook(lambda m, inp, out: captured.update(x=inp[0].detach()))
    with torch.no_grad():
        batch = enc(enc.prepare(CAPTIONS))
        pooled = captured["x"]
        for i, c in enumerate(CAPTIONS):
            torch.testing.assert_close(pooled[i], _reference_pool(enc, c), atol=1e-5, rtol=1e-5)
            alone = enc(enc.prepare([c]))[0]  # no batch mates, so no padding at all
            torch.testing.assert_close(batch[i], alone, atol=1e-5, rtol=1e-5)


def test_max_and_mean_pooling_differ_and_max_gets_gradients():
    mean, mx = _encoder("mean"), _encoder("max")
    mx.load_state_dict(mean.state_dict())
    prep = mx.prepare(CAPTIONS)
    assert not torch.allclose(mean(prep), mx(prep))
    mx.train()
    mx(prep).sum().backward()
    assert mx.gru.weight_hh_l0.grad is not None and mx.gru.weight_hh_l0.grad.abs().sum() > 0


def test_text_pool_is_validated():
    assert load_config("synthetic_baseline", ["model.text_pool=max"]).model.text_pool == "max"
    with pytest.raises(ConfigError, match="text_pool"):
        load_config("synthetic_baseline", ["model.text_pool=attention"])
    with pytest.raises(ValueError, match="pool"):
        _encoder("sum")
