"""The texts of an index's captions: what people are shown (``texts``) and what the model encoded
(``model_texts``, written only where a shortcut setting rewrote them). The one place that key is read
and written (tests/test_one_source.py checks it), so a caption query encodes what the index holds.
"""
from __future__ import annotations


def model_texts(captions_meta: dict) -> list[str]:
    """The caption texts as the index's model encoded them: ``model_texts`` where the index was built with a
    shortcut that rewrites captions (written by ``build_dataset_index`` only then), else the shown ``texts``.
    What a caption query must encode to find what the index holds; show ``texts`` to people."""
    return captions_meta.get("model_texts") or captions_meta["texts"]


def with_model_texts(captions_meta: dict, texts: list[str]) -> dict:
    """``captions_meta`` with ``texts`` recorded as what the model encoded (read back by ``model_texts``)."""
    captions_meta["model_texts"] = list(texts)
    return captions_meta
