"""TERN's caption side: a pre-trained transformer (TERN: BERT; here the packaged all-MiniLM-L6-v2
stands in for it, a model trained on sentence pairs that include Flickr30k and COCO captions) whose
token outputs, [CLS] first, go through a linear projection into the layers shared with the image side.

``train_layers``: -1 fine-tunes every layer (TERN fine-tunes BERT), 0 keeps the model frozen, k > 0
fine-tunes the top k layers. With 0 < k < all, the bottom layers' output of each training caption
is computed once (no gradient, no dropout) and remembered (float16, in memory), so after the first
epoch a step runs only the top k layers: on a CPU the frozen layers' forward pass is most of the
caption side's cost. Evaluation and serving always run the whole model; in eval mode both paths
give the same output (tested).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from training.models.tern import SharedReasoning
from training.models.text_encoder import train_top_layers, transformer_layers
from training.targets import load_sentence_model

MAX_REMEMBERED = 500_000  # captions; a long-running process must not grow without bound


class TERNTextEncoder(nn.Module):
    def __init__(self, model_path: str, dim: int, shared: SharedReasoning, *, train_layers: int = -1,
                 max_len: int = 40):
        super().__init__()

        self.st = load_sentence_model(model_path)
        self.st.max_seq_length = min(self.st.max_seq_length, 2 * max_len + 2)  # word pieces (+ CLS/SEP)
        train_top_layers(self.st, train_layers)
        self.frozen = train_layers == 0
        n = len(transformer_layers(self.st))
        self.split = n - train_layers if 0 < train_layers < n else 0  # layers below it are remembered
        self.fc = nn.Linear(self.st[0].get_embedding_dimension(), dim)
        self.norm = nn.LayerNorm(dim)
        self.shared = shared
        self.out_dim = shared.proj.out_features
        self._memory: dict[str, torch.Tensor] = {}

    def frozen_prefixes(self) -> list[str]:
        """State-dict names rebuilt from the model folder instead of being saved: the whole model
        when frozen, else every parameter that does not train (with the top 2 of MiniLM's 6 layers
        trained, a checkpoint holds 3.5 M of its 22.7 M parameters)."""
        if self.frozen:
            return ["st."]
        return [f"st.{n}" for n, p in self.st.named_parameters() if not p.requires_grad]

    @property
    def bert(self) -> nn.Module:
        return self.st[0].auto_model

    def _mask(self, attention_mask: torch.Tensor, hidden: torch.Tensor):
        """The layers' attention mask, built the way the model builds it for its own forward pass."""
        mask, _ = self.bert._create_attention_masks(attention_mask=attention_mask, encoder_attention_mask=None,
                                                    embedding_output=hidden, encoder_hidden_states=None,
                                                    past_key_values=None)
        return mask

    @torch.no_grad()
    def _remember(self, texts: list[str]) -> None:
        missing = list(dict.fromkeys(t for t in texts if t not in self._memory))
        if not missing:
            return
        if len(self._memory) + len(missing) > MAX_REMEMBERED:
            self._memory.clear()
        was, dev = self.bert.training, next(self.bert.parameters()).device
        self.bert.eval()  # the remembered layers are frozen: no dropout in them
        tok = {k: v.to(dev) for k, v in self._tokenize(missing).items()}
        h = self.bert.embeddings(input_ids=tok["input_ids"], token_type_ids=tok.get("token_type_ids"))
        mask = self._mask(tok["attention_mask"], h)
        for layer in transformer_layers(self.st)[: self.split]:
            h = layer(h, mask)
        self.bert.train(was)
        for t, row, m in zip(missing, h.half().cpu(), tok["attention_mask"].cpu()):
            self._memory[t] = row[: int(m.sum())].clone()

    def _tokenize(self, texts: list[str]) -> dict:
        tok = getattr(self.st, "preprocess", None) or self.st.tokenize
        return {k: v for k, v in tok(texts).items() if torch.is_tensor(v)}

    def prepare(self, texts: Sequence[str], train: bool = False, generator: torch.Generator | None = None) -> dict:
        """Token ids (evaluation, or no remembered layers); while training with remembered layers, the
        bottom layers' padded output ``hidden`` (B, T, H) and its ``attention_mask``."""
        texts = list(texts)
        if not (train and self.split):
            return self._tokenize(texts)
        self._remember(texts)
        rows = [self._memory[t] for t in texts]
        hidden = nn.utils.rnn.pad_sequence(rows, batch_first=True)
        lengths = torch.tensor([len(r) for r in rows])
        return {"hidden": hidden, "attention_mask": (torch.arange(hidden.shape[1])[None] < lengths[:, None]).long()}

    def tokens(self, batch: dict) -> torch.Tensor:
        """(B, T, H) token outputs of the pre-trained model."""
        if "hidden" in batch:
            h = batch["hidden"].float()
            mask = self._mask(batch["attention_mask"], h)
            for layer in transformer_layers(self.st)[self.split:]:
                h = layer(h, mask)
            return h
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            return self.st[0](dict(batch))["token_embeddings"]

    def forward(self, batch: dict) -> torch.Tensor:
        padding = batch["attention_mask"] == 0
        return self.shared(self.norm(self.fc(self.tokens(batch))), padding=padding)
