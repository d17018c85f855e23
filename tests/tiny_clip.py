"""A tiny randomly initialised CLIP saved in the Hugging Face layout, made offline in about a second.

The tokenizer is a real byte-level BPE of CLIP's shape: the 256 byte symbols, each also as a
word-final ``</w>`` symbol, a few merges learnt from the words the tests use, and CLIP's two special
tokens (``<|endoftext|>`` last, as in CLIP, so the text tower pools at the highest id).
"""
from __future__ import annotations

from pathlib import Path

WORDS = ("a", "the", "red", "blue", "green", "circle", "square", "triangle", "dog", "cat", "on", "in", "of", "and",
         "small", "big", "left", "right", "top", "bottom", "with", "striped", "dotted", "is")


def tiny_vocab() -> tuple[dict[str, int], list[str]]:
    from tokenizers.pre_tokenizers import ByteLevel

    symbols = sorted(ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(symbols)}
    vocab.update({s + "</w>": len(symbols) + i for i, s in enumerate(symbols)})
    merges: list[str] = []
    for w in WORDS:  # merge each word left to right into one word-final token
        parts = list(w[:-1]) + [w[-1] + "</w>"]
        while len(parts) > 1:
            merged = parts[0] + parts[1]
            if f"{parts[0]} {parts[1]}" not in merges:
                merges.append(f"{parts[0]} {parts[1]}")
                vocab.setdefault(merged, len(vocab))
            parts = [merged] + parts[2:]
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return vocab, merges


def make_tiny_clip(folder: Path, *, image_size: int = 32, projection_dim: int = 16, seed: int = 0,
                   pickle_only: bool = False) -> Path:
    """Write config.json, model.safetensors (``pickle_only``: pytorch_model.bin instead), the tokenizer
    and preprocessor_config.json into ``folder``."""
    import torch
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = tiny_vocab()
    tok = CLIPTokenizer(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges])
    eos = vocab["<|endoftext|>"]
    text = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=77, bos_token_id=vocab["<|startoftext|>"], eos_token_id=eos, pad_token_id=eos)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=image_size, patch_size=8)
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection_dim)).eval()
    model.save_pretrained(folder)
    if pickle_only:
        (folder / "model.safetensors").unlink()
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    tok.save_pretrained(folder)
    CLIPImageProcessorPil(size={"shortest_edge": image_size},
                          crop_size={"height": image_size, "width": image_size}).save_pretrained(folder)
    return folder
