"""A pretrained tower's folder read as plain data, for every ecosystem beside CLIP's (``clip_files.py``).

What is read: JSON configs (hyperparameters only reach ``transformers``: :func:`own_fields`), the
tokenizer's files as bytes (:func:`read_tokenizer_files`: only the names standard tokenizers save,
each bounded), and weights from safetensors (``weight_files``, shared with CLIP) — or, for open_clip
training checkpoints, ``torch.load(weights_only=True)``, which builds tensors and plain containers
only. Nothing in a folder is ever executed: no ``trust_remote_code``, no ``auto_map``, no tokenizer
class outside :data:`TOKENIZER_CLASSES`, no pickle. Checkpoints carry the same plain data, so a tower
rebuilds without its folder.
"""
from __future__ import annotations

import functools
import inspect
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from training.models.clip_files import JSON_LIMIT, ClipError, read_json

log = logging.getLogger(__name__)

TOKENIZER_FILE_NAMES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                        "vocab.json", "merges.txt", "vocab.txt", "spiece.model", "sentencepiece.bpe.model",
                        "tokenizer.model")
TOKENIZER_LIMIT = 64 << 20  # bytes of one tokenizer file (a multilingual tokenizer.json is ~17 MB)
# Tokenizers that transformers itself implements (no code from the folder), by the class name that
# tokenizer_config.json names; a folder naming anything else is refused.
TOKENIZER_CLASSES = frozenset({
    "CLIPTokenizer", "CLIPTokenizerFast", "SiglipTokenizer", "GemmaTokenizer", "GemmaTokenizerFast",
    "PreTrainedTokenizerFast", "TokenizersBackend", "BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer",
    "DistilBertTokenizerFast", "XLMRobertaTokenizer", "XLMRobertaTokenizerFast", "RobertaTokenizer",
    "RobertaTokenizerFast", "MPNetTokenizer", "MPNetTokenizerFast", "T5Tokenizer", "T5TokenizerFast"})


class TowerError(ClipError):
    """A pretrained tower folder that cannot be used (missing or unsafe files, an unsupported layout)."""


def read_config(folder: Path, name: str = "config.json") -> dict:
    path = folder / name
    if not path.is_file():
        raise TowerError(f"{folder}: no {name}")
    cfg = read_json(path)
    if not isinstance(cfg, dict):
        raise TowerError(f"{path}: not a JSON object")
    return cfg


def own_fields(cls: type, d: Any) -> dict:
    """The entries of ``d`` that the config class ``cls`` declares as its own hyperparameters (its
    annotations or ``__init__`` parameters, minus the loading switches ``PretrainedConfig`` takes), so
    that an ``attn_implementation``, ``auto_map`` or weights file named in a crafted config never
    reaches ``transformers``."""
    names = set(getattr(cls, "__annotations__", {}))
    try:
        names |= set(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        pass
    names -= {"self", "kwargs", "args", "auto_map", "attn_implementation", "_attn_implementation",
              "transformers_weights", "torch_dtype", "dtype", "trust_remote_code", "name_or_path", "_name_or_path"}
    return {k: v for k, v in (d if isinstance(d, dict) else {}).items() if k in names}


def read_tokenizer_files(folder: Path) -> dict[str, bytes]:
    """The tokenizer's files of ``folder`` as bytes (only :data:`TOKENIZER_FILE_NAMES`), after checking
    that they name a tokenizer transformers implements itself."""
    files = {}
    for name in TOKENIZER_FILE_NAMES:
        p = folder / name
        if p.is_file():
            if p.stat().st_size > TOKENIZER_LIMIT:
                raise TowerError(f"{p}: {p.stat().st_size:,} bytes is more than a tokenizer file holds")
            files[name] = p.read_bytes()
    if not files or set(files) <= {"tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"}:
        raise TowerError(f"{folder}: no tokenizer files ({', '.join(TOKENIZER_FILE_NAMES[:1] + TOKENIZER_FILE_NAMES[4:])}); "
                         "save the tokenizer into the folder with its save_pretrained")
    check_tokenizer_config(files, str(folder))
    return files


def check_tokenizer_config(files: dict[str, bytes], where: str) -> None:
    raw = files.get("tokenizer_config.json")
    if raw is None:
        return
    if len(raw) > JSON_LIMIT:
        raise TowerError(f"{where}/tokenizer_config.json is larger than a tokenizer config")
    try:
        cfg = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TowerError(f"{where}/tokenizer_config.json: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise TowerError(f"{where}/tokenizer_config.json: not a JSON object")
    if cfg.get("auto_map"):
        raise TowerError(f"{where}: its tokenizer_config.json names code to run (auto_map); such tokenizers are "
                         "never loaded (no trust_remote_code)")
    cls = cfg.get("tokenizer_class")
    if cls is not None and cls not in TOKENIZER_CLASSES:
        raise TowerError(f"{where}: tokenizer class {cls!r} is not one transformers implements itself here "
                         f"({', '.join(sorted(TOKENIZER_CLASSES))})")


@functools.lru_cache(maxsize=8)
def _tokenizer_from_items(items: tuple[tuple[str, bytes], ...]):
    from transformers import AutoTokenizer  # lazy: ~2 s; only pretrained towers need it

    files = dict(items)
    check_tokenizer_config(files, "tokenizer")
    with tempfile.TemporaryDirectory(prefix="ltd-tokenizer-") as d:
        for name, data in files.items():
            if name not in TOKENIZER_FILE_NAMES:
                raise TowerError(f"tokenizer file {name!r} is not one a tokenizer saves")
            (Path(d) / name).write_bytes(data)
        try:
            return AutoTokenizer.from_pretrained(d, local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError, ImportError, KeyError) as e:
            raise TowerError(f"the tokenizer could not be built: {type(e).__name__}: {str(e)[:200]}") from None


def build_tokenizer_from_files(files: dict[str, bytes]):
    """The tokenizer that transformers builds from these files (written to a private temporary folder,
    loaded with ``local_files_only`` and without remote code); cached per content."""
    return _tokenizer_from_items(tuple(sorted(files.items())))
