"""Tiny randomly initialised towers saved in their ecosystems' own layouts (offline, about a second each):
a SigLIP folder (SiglipModel + a SentencePiece tokenizer trained here), a sentence-transformers CLIP
folder around tests/tiny_clip.py's CLIP, and a multilingual-style sentence-transformers text tower
(BERT + mean pooling + Dense into the CLIP's 16 dimensions)."""
from __future__ import annotations

import io
from pathlib import Path

from tiny_clip import WORDS

SENTENCES = [" ".join(WORDS[i:i + 5]) for i in range(0, len(WORDS), 3)] + [
    "un chien rouge à gauche", "ein blauer Kreis oben", "un cercle vert et un carré", "der Hund ist klein"]


def make_tiny_siglip(folder: Path, *, image_size: int = 32, seed: int = 0) -> Path:
    """config.json (model_type siglip), model.safetensors, spiece.model + tokenizer config, preprocessor_config.json."""
    import sentencepiece as spm
    import torch
    from transformers import SiglipConfig, SiglipModel, SiglipTokenizer
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    folder.mkdir(parents=True, exist_ok=True)
    model_file = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES * 20), model_writer=model_file, vocab_size=60,
                                   model_type="unigram", character_coverage=1.0, pad_id=0, eos_id=1, unk_id=2,
                                   bos_id=-1, minloglevel=2)
    (folder / "spiece.model").write_bytes(model_file.getvalue())
    tok = SiglipTokenizer(vocab_file=str(folder / "spiece.model"), model_max_length=16)
    tok.save_pretrained(folder)
    text = dict(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=16, projection_size=32, bos_token_id=None,
                eos_token_id=1, pad_token_id=0)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=image_size, patch_size=8)
    torch.manual_seed(seed)
    SiglipModel(SiglipConfig(text_config=text, vision_config=vision)).eval().save_pretrained(folder)
    SiglipImageProcessorPil(size={"height": image_size, "width": image_size}, resample=2).save_pretrained(folder)
    return folder


def make_tiny_st_clip(clip_dir: Path, folder: Path) -> Path:
    """A sentence-transformers CLIP folder (modules.json → a CLIP module) saved by SentenceTransformer."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer

    SentenceTransformer(modules=[Transformer(str(clip_dir))]).save(str(folder))
    return folder


def make_tiny_st_text(folder: Path, *, out_dim: int = 16, seed: int = 0) -> Path:
    """A sentence-transformers text model: BERT (WordPiece vocabulary of the test words) → mean pooling →
    Dense(32 → out_dim, identity), saved by SentenceTransformer.save."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import BertConfig, BertModel, BertTokenizerFast

    base = folder.parent / (folder.name + "-bert")
    base.mkdir(parents=True, exist_ok=True)
    words = sorted({w.lower() for s in SENTENCES for w in s.split()})
    chars = sorted({c for s in SENTENCES for c in s.lower() if c != " "})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *chars, *(f"##{c}" for c in chars)]
    (base / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    BertTokenizerFast(vocab_file=str(base / "vocab.txt"), do_lower_case=True).save_pretrained(base)
    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=len(dict.fromkeys(vocab)), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64)).save_pretrained(base)
    t = Transformer(str(base), max_seq_length=32)
    model = SentenceTransformer(modules=[t, Pooling(32, "mean"),
                                         Dense(32, out_dim, activation_function=torch.nn.Identity())])
    model.save(str(folder))
    return folder
