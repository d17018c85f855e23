"""train → index → eval, each step skipped when its result is already there and still valid.

Shared by `ltd demo` and `ltd experiment`: re-running reuses finished work, and a run killed in the
middle resumes from its last checkpoint.
"""
from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

from app.launch import launch_local
from indexer.build import EmbedEngine, IndexRequest, build_dataset_index
from indexer.caption_eval import CaptionEvalOptions, evaluate_captioner, write_caption_report
from indexer.evaluate import EvalOptions, evaluate_index, load_report, per_query_path, write_report
from indexer.index import IndexDir, IndexDirError, load_index_dir, read_manifest
from indexer.metrics import REPORT_KEYS, ndcg_key
from indexer.training_validator import make_validator
from training.captioning.checkpoint import load_caption_checkpoint
from training.captioning.loop import train_captioner
from training.checkpoint import load_checkpoint
from training.config import Config, dump_config
from training.config_base import ConfigError, load_saved
from training.device import pick_device, using_device
from training.errors import UserFileExists
from training.fsio import sha256_file
from training.loop import train
from training.prepare import prepare
from training.progress import progress_enabled

log = logging.getLogger(__name__)


def train_run(cfg, out: Path, *, resume: bool = False):
    """Prepare data, build the validator from the indexer's metrics, and train. Shared by `ltd train`,
    `ltd demo` and `ltd experiment`. The data are prepared on ``train.device``, as the run trains."""
    with using_device(pick_device(cfg.train.device)):
        data = prepare(cfg)
    val_feats = data.image_feats[[im.index for im in data.val.images]].mean(1)
    validator = make_validator(data.val, data.val_texts, val_feats, max_images=cfg.train.val_max_images,
                               transform=data.image_transform)
    return train(cfg, out, validate=validator, resume=resume, data=data)


def _state(cfg, run_dir: Path, finished: Callable[[Path], bool]) -> str:
    """``done`` (``finished(checkpoint)`` with this config and a best.pt), ``partial`` (resumable),
    ``absent`` or ``conflict`` (the folder holds a run with another config)."""
    ckpt = run_dir / "checkpoint.pt"
    if not ckpt.is_file():
        return "absent"
    try:  # read as today's code reads it: options added since take their defaults (= the old behaviour)
        saved = load_saved(type(cfg), run_dir)
    except ConfigError:  # missing, or a key that no longer exists: not this run
        return "conflict"
    if saved.to_dict() != cfg.to_dict():
        return "conflict"
    return "done" if finished(ckpt) and (run_dir / "best.pt").is_file() else "partial"


def _ensure(state: str, run_dir: Path, what: str, train: Callable[[bool], object]) -> Path:
    """The run's best.pt: ``train(resume)`` unless the run is done; a conflicting folder is refused."""
    if state == "conflict":
        raise UserFileExists(f"{run_dir} holds a {what} with a different config; delete it or choose another output folder")
    if state == "done":
        log.info("reusing finished %s %s", what, run_dir)
    else:
        log.info("%s %s %s", "resuming" if state == "partial" else "training", what, run_dir)
        train(state == "partial")
    return run_dir / "best.pt"


def run_state(cfg: Config, run_dir: Path) -> str:
    """The state of a dual-encoder run (see :func:`_state`): done when every epoch is finished."""
    def finished(ckpt: Path) -> bool:
        meta = load_checkpoint(ckpt)
        return meta["epoch"] >= cfg.train.epochs and meta.get("step_in_epoch", 0) == 0
    return _state(cfg, run_dir, finished)


def ensure_trained(cfg: Config, run_dir: Path, *, nproc: int = 1) -> Path:
    """The run's best.pt, training or resuming only when needed (in ``nproc`` data-parallel processes)."""
    def train(resume: bool) -> None:
        if nproc > 1:
            launch_train_run(cfg, run_dir, nproc=nproc, resume=resume)
        else:
            train_run(cfg, run_dir, resume=resume)
    return _ensure(run_state(cfg, run_dir), run_dir, "run", train)


def launch_train_run(cfg: Config, out: Path, *, nproc: int, resume: bool = False) -> None:
    """``ltd train --nproc N`` of ``cfg`` (the config reaches the processes as a YAML file); raises when a
    process failed, after the launcher stopped the others."""
    with tempfile.TemporaryDirectory(prefix="ltd-launch-") as tmp:
        dump_config(cfg, Path(tmp) / "config.yaml")
        args = ["train", "--config", str(Path(tmp) / "config.yaml"), "--out", str(out)]
        with using_device(cfg.train.device):  # what the launcher checks (each process sets its own)
            code = launch_local(nproc, args + ["--resume"] * resume + ["--no-progress"] * (not progress_enabled()))
    if code:
        raise RuntimeError(f"training {out} in {nproc} processes failed (exit status {code}); it resumes from its "
                           "last checkpoint when run again")


def ensure_indexed(checkpoint: Path, dataset: str | Path, split: str, index_dir: Path, *, shortcuts: str = "none",
                   factory: str = "Flat") -> IndexDir:
    sha = sha256_file(checkpoint)
    if (index_dir / "manifest.json").is_file():
        try:
            m = read_manifest(index_dir)
            same = (m.get("checkpoint_sha256") == sha and (m.get("dataset") or {}).get("split") == split
                    and m.get("shortcuts", "none") == shortcuts and m.get("factory") == factory)
            if same:
                log.info("reusing index %s", index_dir)
                return load_index_dir(index_dir, checkpoint_sha256=sha)
        except IndexDirError as e:
            log.warning("rebuilding %s: %s", index_dir, e)
    request = IndexRequest(index_dir, overwrite=True, engine=EmbedEngine(factory=factory))
    return build_dataset_index(checkpoint, dataset, split, request, shortcuts=shortcuts)


def ensure_evaluated(ix: IndexDir, *, relevance: str | None = "rougeL") -> dict:
    rep = load_report(ix.path, ix.generation)
    if rep is not None and per_query_path(ix).is_file():
        meta = rep.get("meta", {})
        if meta.get("checkpoint_sha256") == ix.manifest.get("checkpoint_sha256") and meta.get("relevance") == (
                "rougeL" if relevance and relevance.lower().startswith("rouge") else relevance):
            return rep
    rep = evaluate_index(ix, EvalOptions(relevance=relevance, per_query=True))
    write_report(ix, rep)  # moves the per-query arrays to per_query.gNNNN.npz
    return rep


def comparison_table(reports: dict[str, dict], ndcg_k: int = 25) -> str:
    """Markdown: one row per metric, one column per model, plus the difference of the last two."""
    names = list(reports)
    keys = [*REPORT_KEYS, ndcg_key("i2t", ndcg_k), ndcg_key("t2i", ndcg_k)]
    keys = [k for k in keys if all(k in r for r in reports.values())]
    head = "| metric | " + " | ".join(names) + (f" | Δ ({names[-1]} − {names[0]}) |" if len(names) > 1 else " |")
    lines = [head, "|---|" + "---:|" * (len(names) + (1 if len(names) > 1 else 0))]
    for k in keys:
        vals = [reports[n][k] for n in names]
        fmt = "{:.4f}" if "nDCG" in k else "{:.1f}"
        row = f"| {k} | " + " | ".join(fmt.format(v) for v in vals)
        if len(names) > 1:
            row += " | " + ("{:+.4f}" if "nDCG" in k else "{:+.1f}").format(vals[-1] - vals[0])
        lines.append(row + " |")
    return "\n".join(lines)


# ---- captioners (`ltd demo --captioning`) --------------------------------------------------------
def caption_run_state(cfg, run_dir: Path) -> str:
    """The state of a captioner run (see :func:`_state`): done when its last stage's epochs are finished."""
    def finished(ckpt: Path) -> bool:
        meta = load_caption_checkpoint(ckpt)
        last = ("scst", cfg.scst.epochs) if cfg.scst.epochs else ("xe", cfg.xe.epochs)
        return (meta.get("stage"), meta.get("epoch")) == last and meta.get("step_in_epoch", 0) == 0
    return _state(cfg, run_dir, finished)


def ensure_captioner(cfg, run_dir: Path) -> Path:
    """The captioner run's best.pt, training or resuming only when needed."""
    return _ensure(caption_run_state(cfg, run_dir), run_dir, "captioner run",
                   lambda resume: train_captioner(cfg, run_dir, resume=resume))


def ensure_caption_report(checkpoint: Path, judges: dict[str, Path], out_dir: Path, *, split: str = "test") -> dict:
    """`ltd caption eval` of ``checkpoint`` with every judge in ``judges``, reused while the captioner
    and the judges are the same files."""
    want = {"checkpoint": sha256_file(checkpoint)[:16], "judges": {n: sha256_file(p)[:16] for n, p in judges.items()}}
    rp = out_dir / "report.json"
    if rp.is_file():
        try:
            rep = json.loads(rp.read_text())
            have = {"checkpoint": rep["meta"]["checkpoint_sha256"],
                    "judges": {n: j["sha256"] for n, j in rep.get("judges", {}).items()}}
            if have == want and rep["meta"]["dataset"]["split"] == split:
                return rep
        except (ValueError, KeyError, TypeError) as e:
            log.warning("re-evaluating %s: %s", out_dir, e)
    rep, captions = evaluate_captioner(checkpoint, split=split,
                                       options=CaptionEvalOptions(judges={n: str(p) for n, p in judges.items()}))
    write_caption_report(out_dir, rep, captions)
    return rep
