"""Data-parallel training (training/distributed.py) against one process on the same samples, in real
gloo process groups on the CPU: the global-batch losses and gradients, the loop's parameters after
optimiser steps, λ on every rank; the launcher end to end, and a killed rank."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import tiny_config
from ranks import run_ranks

from training.data.global_batches import Shard, epoch_batches

CONTRASTIVE = ["infonce", "triplet", "sh", "ifm", "order"]


# ---- the sampler ---------------------------------------------------------------------------------
def test_shards_cover_the_global_batch_in_rank_order():
    for n, world in [(16, 2), (17, 2), (15, 4), (5, 3), (128, 8)]:
        shards = [Shard.of(n, r, world) for r in range(world)]
        rows = np.concatenate([np.arange(n)[s.rows] for s in shards])
        assert rows.tolist() == list(range(n))
        assert max(s.sizes[s.rank] for s in shards) - min(s.sizes[s.rank] for s in shards) <= 1
        assert sum(s.share for s in shards) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        Shard.of(8, 2, 2)


def test_global_batches_do_not_depend_on_the_process_count():
    one = epoch_batches(3, 1, 103, 16)
    two = epoch_batches(3, 1, 103, 16, world=2)
    assert [b.tolist() for b in one] == [b.tolist() for b in two]  # the final 7 captions are kept on 2
    eight = epoch_batches(3, 1, 103, 16, world=8)  # a final batch of 7 cannot give 8 processes a row each
    assert [b.tolist() for b in eight] == [b.tolist() for b in one[:-1]]


def test_launched_processes_run_the_command_without_nproc():
    """`ltd train --nproc 2 …` starts processes that run the same command, less --nproc; the parser's
    default timeout is training.distributed's (kept apart so that `ltd --help` needs no torch)."""
    from app.cli import launch_args as launch
    from app.cli.parser import build_parser
    from training.distributed import DEFAULT_TIMEOUT_S

    parser, _ = build_parser()
    args = parser.parse_args(["train", "--config", "c.yaml", "--set", "a.b=1", "--set", "c=2", "--resume", "--nproc",
                              "2", "--no-progress", "--dist-timeout", "60"])
    again = parser.parse_args(launch.worker_args(args, ["train"], Path("runs/x")))
    assert "--nproc" not in launch.worker_args(args, ["train"], Path("runs/x")) and again.nproc == 1
    assert (again.config, again.set, again.resume, again.no_progress, again.out, again.dist_timeout) == \
        ("c.yaml", ["a.b=1", "c=2"], True, True, "runs/x", 60.0)
    assert launch.DEFAULT_TIMEOUT_S == DEFAULT_TIMEOUT_S


# ---- the objective over the global batch -------------------------------------------------------
def _inputs(n: int):
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(n, 12, generator=g), dim=1)
    txt = torch.nn.functional.normalize(img + 0.8 * torch.randn(n, 12, generator=g), dim=1)
    ids = torch.arange(n) // 3  # three captions per image: same-image pairs straddle the ranks' boundary
    targets = torch.randn(n, 6, generator=g)
    torch.manual_seed(1)
    decoder = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 6))
    return img, txt, ids, targets, decoder


def _next_lambda(combiner) -> float | None:
    """The λ the next step applies (None without a constraint)."""
    return None if combiner.multiplier is None else float(combiner.multiplier)


def _objective_terms(rank: int, world: int) -> dict:
    """One step of the objective on this rank's rows for every contrastive loss and global batch size,
    the parameters' gradients as DDP would leave them (averaged over the ranks)."""
    from training.config import load_config
    from training.losses.objective import TrainingObjective

    res = {}
    for name, n in ((name, n) for name in CONTRASTIVE for n in (16, 15)):
        cfg = load_config("synthetic_baseline", [f"loss.contrastive={name}", "loss.mode=constraint",
                                                 "loss.eta=0.5", "loss.lambda_init=2.0"])
        objective = TrainingObjective(cfg.loss, total_steps=10)
        img, txt, ids, targets, decoder = _inputs(n)
        shard = Shard.of(n, rank, world)
        rows = shard.rows
        i, t = img[rows].clone().requires_grad_(), txt[rows].clone().requires_grad_()
        out = objective(i, t, image_ids=ids[rows], decoder=decoder, targets=targets[rows], shard=shard)
        out["loss"].backward()
        grads = [p.grad for p in decoder.parameters()]
        if world > 1:  # what DistributedDataParallel does with the parameters' gradients
            for g in grads:
                dist.all_reduce(g)
                g /= world
        objective.step_done(out)
        # d(global loss)/d(this rank's rows): a rank's backward carries W × that (DDP divides by W)
        res[name, n] = {**{k: float(out[k].detach()) for k in ("loss", "l_con", "l_rec", "lambda")},
                     "lambda_next": _next_lambda(objective.combiner), "img_grad": i.grad / world,
                     "txt_grad": t.grad / world, "decoder_grads": grads}
    return res


@pytest.mark.slow
@pytest.mark.training
def test_global_batch_loss_and_gradients_equal_one_process(tmp_path):
    """2 × 8 (and 8 + 7) on gathered embeddings = 1 × 16 (15) for every contrastive loss with the LTD
    constraint: the values, λ's next value on every rank, and every gradient."""
    single = _objective_terms(0, 1)
    both = run_ranks(_objective_terms, 2, tmp_path)
    for name, one in single.items():
        ranks = [b[name] for b in both]
        for k in ("loss", "l_con", "l_rec", "lambda", "lambda_next"):
            assert [r[k] for r in ranks] == pytest.approx([one[k]] * 2, rel=1e-6, abs=1e-7), (name, k)
        assert ranks[0]["lambda_next"] == ranks[1]["lambda_next"] != one["lambda"]  # stepped, identically
        for k in ("img_grad", "txt_grad"):
            torch.testing.assert_close(torch.cat([r[k] for r in ranks]), one[k], rtol=1e-5, atol=1e-7, msg=name)
        for r in ranks:
            for a, b in zip(r["decoder_grads"], one["decoder_grads"]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=name)


def test_without_a_process_group_the_objective_is_unchanged():
    """Most users train with one process: no collective runs, the shard-less call is the old one."""
    from training.distributed import gather_rows, mean_over_ranks, scale_gradient

    x = torch.randn(5, 3, requires_grad=True)
    one = Shard.of(5)
    assert gather_rows(x, one) is x and scale_gradient(x, 1) is x and mean_over_ranks(x.sum(), one) is not None
    assert not dist.is_initialized()
    y = scale_gradient(x, 3.0)
    assert torch.equal(y, x)
    y.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3.0))


# ---- the loop: parameters after optimiser steps ----------------------------------------------------
LOOP_CASES = {"infonce_ltd": ("constraint", ["loss.contrastive=infonce", "model.token_dropout=0.2", "model.crops=2"]),
              "triplet": ("none", ["loss.contrastive=triplet"]),
              "sh_itd": ("dual", ["loss.contrastive=sh", "loss.decoder=itd"])}  # ITD: a mean over tokens
# Adam's first steps move a weight by ~lr · g / (|g| + eps): where the (clipped: sum of hinges' norm is
# ~80× the clip) gradient is near eps, float rounding in it becomes a step difference of up to lr. The
# losses and gradient norms above are the exact check there; its weights get the lr-sized tolerance.
PARAM_ATOL = {"infonce_ltd": 1e-5, "triplet": 1e-5, "sh_itd": 1e-3}


def _loop_cases(rank: int, world: int, steps: int, run_dir: str) -> dict:
    return {name: _loop_steps(world, mode, extra + ["train.batch_size=16"], steps, f"{run_dir}/{name}")
            for name, (mode, extra) in LOOP_CASES.items()}


def _loop_steps(world: int, mode: str, extra: list[str], steps: int, run_dir: str) -> dict:
    from training.distributed import data_parallel
    from training.loop import set_up, train_step
    from training.models.dual_encoder import StepEncoders
    from training.prepare import prepare

    cfg = tiny_config(mode, extra)
    data = prepare(cfg)
    r = set_up(cfg, data, Path(run_dir))
    r.encoders = data_parallel(StepEncoders(r.model))
    batches = epoch_batches(cfg.train.seed, 0, len(data.train_texts), cfg.train.batch_size, world)
    rows = []
    for s in range(steps):
        out, gnorm = train_step(r, batches[s], torch.Generator().manual_seed(100 + s), None)
        rows.append({"loss": float(out["loss"].detach()), "grad_norm": gnorm,
                     **({"lambda": float(out["lambda"])} if "lambda" in out else {})})
    lam = _next_lambda(r.objective.combiner)
    return {"rows": rows, "lambda_next": lam, "params": {k: v.clone() for k, v in r.model.state_dict().items()}}


@pytest.mark.slow
@pytest.mark.training
def test_two_processes_train_like_one_on_the_global_batch(tmp_path):
    """The real set-up and step (DDP around the encoders, the global batch gathered): after optimiser
    steps on 2 × 8 the parameters equal those of 1 × 16 within 1e-5 (InfoNCE + the LTD constraint,
    triplet, sum of hinges + ITD), and λ is the same on every rank. Token dropout and the random view are drawn for the
    global batch, so they agree too."""
    singles = _loop_cases(0, 1, 3, str(tmp_path / "one"))
    pairs = run_ranks(_loop_cases, 2, tmp_path, 3, str(tmp_path / "two"))
    for name, one in singles.items():
        _assert_same_training(one, [p[name] for p in pairs], LOOP_CASES[name][0], PARAM_ATOL[name])


def _assert_same_training(one: dict, two: list[dict], mode: str, atol: float) -> None:
    for r in two:
        for a, b in zip(r["rows"], one["rows"]):
            assert a == pytest.approx(b, rel=1e-5)
        for k, v in one["params"].items():
            torch.testing.assert_close(r["params"][k], v, rtol=0, atol=atol, msg=k)
    if mode == "constraint":
        assert two[0]["lambda_next"] == two[1]["lambda_next"]
        assert [row["lambda"] for row in two[0]["rows"]] == [row["lambda"] for row in two[1]["rows"]]


# ---- the launcher end to end -----------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def _train_args(run: Path, *extra: str) -> list[str]:
    from conftest import TINY

    args = ["train", "--config", "synthetic_baseline", "--out", str(run), "--no-progress"]
    for s in TINY + ["loss.mode=constraint", "loss.eta=0.5", "train.batch_size=16", *extra]:
        args += ["--set", s]
    return args


def _launch(args: list[str]):
    """``python -m app.cli <args>`` in its own session (so a failed test can stop all of it)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc, timeout: float = 600) -> tuple[int, str]:
    import os
    import signal

    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out


def _rows(run: Path, kind: str = "step") -> list[dict]:
    import json

    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]


def _assert_rows_close(a: list[dict], b: list[dict], rel: float) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for k in ("loss", "l_con", "l_rec", "lambda"):
            assert ra[k] == pytest.approx(rb[k], rel=rel, abs=1e-6), (ra["step"], k)


@pytest.mark.slow
def test_ltd_train_nproc_2_then_index_and_eval(tmp_path):
    """`ltd train --nproc 2` logs (once, from rank 0) what one process logs on the same global batches,
    and its checkpoint indexes and evaluates like any other."""
    import json

    from app.cli import main

    code, out = _finish(_launch(_train_args(tmp_path / "two") + ["--nproc", "2"]))
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["run_dir"] == str(tmp_path / "two")  # one summary line
    assert out.count("epoch 1/2") == 1  # one voice: rank 1 logs warnings only
    assert main(_train_args(tmp_path / "one")) == 0
    _assert_rows_close(_rows(tmp_path / "two"), _rows(tmp_path / "one"), rel=1e-4)
    # 6 val images: parameters equal within 1e-5 can still swap two near-tied neighbours, and one swap moves
    # R@1 by 16.7; the mean ranks move by at most 1/6 per swap, so they are what must agree
    for key in ("i2t_meanr", "t2i_meanr"):
        assert [v[key] for v in _rows(tmp_path / "two", "val")] == pytest.approx(
            [v[key] for v in _rows(tmp_path / "one", "val")], abs=0.34), key
    from training.prepare import resolve_dataset_path

    ds = resolve_dataset_path("", synthetic_images=60)
    ix = tmp_path / "ix"
    assert main(["index", "--checkpoint", str(tmp_path / "two" / "best.pt"), "--dataset", str(ds), "--split", "test",
                 "--out", str(ix), "--no-progress"]) == 0
    assert main(["eval", "--index", str(ix)]) == 0
    assert json.loads((ix / "report.json").read_text())["rsum"] > 0


def _worker_pids(launcher_pid: int) -> list[int]:
    path = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.slow
def test_a_killed_rank_stops_the_run_and_resume_continues(tmp_path):
    """SIGKILL one of two processes mid-run: the launcher exits non-zero within 60 s. Resumed on 2
    processes the run ends exactly where an uninterrupted one does; resumed on 1 it continues from
    the checkpoint's step and follows the same trajectory (up to float noise)."""
    import os
    import shutil
    import signal
    import time

    import torch

    from app.cli import main
    from training.checkpoint import load_checkpoint

    extra = ("train.epochs=4", "train.checkpoint_every=3")
    full = _launch(_train_args(tmp_path / "full", *extra) + ["--nproc", "2"])
    assert _finish(full)[0] == 0

    run = tmp_path / "killed"
    proc = _launch(_train_args(run, *extra) + ["--nproc", "2"])
    deadline = time.monotonic() + 300
    while not (run / "checkpoint.pt").exists() or len(_worker_pids(proc.pid)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.05)
    os.kill(max(_worker_pids(proc.pid)), signal.SIGKILL)
    killed_at = time.monotonic()
    code, out = _finish(proc, timeout=60)
    assert code != 0 and time.monotonic() - killed_at < 60, out
    at = load_checkpoint(run / "checkpoint.pt")["step"]
    total = max(r["step"] for r in _rows(tmp_path / "full"))
    assert 0 < at < total

    shutil.copytree(run, tmp_path / "on_one")
    from app.pipeline import launch_train_run  # what `ltd experiment` schedules for a cell with nproc: 2

    launch_train_run(tiny_config("constraint", ["train.batch_size=16", *extra]), run, nproc=2, resume=True)
    _assert_rows_close(_rows(run), _rows(tmp_path / "full"), rel=1e-6)
    a = load_checkpoint(run / "checkpoint.pt")["model"]
    b = load_checkpoint(tmp_path / "full" / "checkpoint.pt")["model"]
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-7, msg=k)

    assert main(_train_args(tmp_path / "on_one", *extra) + ["--resume"]) == 0
    rows = _rows(tmp_path / "on_one")
    assert [r["step"] for r in rows] == list(range(1, total + 1))  # continues, no step repeated or lost
    _assert_rows_close([r for r in rows if r["step"] > at], [r for r in _rows(tmp_path / "full") if r["step"] > at],
                       rel=1e-3)


class _Scheduled(Exception):
    pass


def test_grids_schedule_runs_on_several_processes(tmp_path, monkeypatch):
    """A grid's ``nproc`` (overridden by ``ltd experiment --nproc``, a cell's own winning) reaches each
    run's job; 0 processes is refused when the grid is read."""
    import yaml
    from conftest import TINY

    from app import experiment
    from app.grid import load_grid
    from training.config import ConfigError

    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump({"set": TINY, "nproc": 2, "cells": [{"name": "a"}, {"name": "b", "nproc": 1}]}))
    jobs = []

    def scheduled(js, n_jobs, collect=False, **kw):
        jobs.extend(js)
        if js:
            raise _Scheduled
        return []

    monkeypatch.setattr(experiment, "_run_all", scheduled)
    for cli, want in ((None, {"a": 2, "b": 1}), (3, {"a": 3, "b": 1})):
        jobs.clear()
        with pytest.raises(_Scheduled):
            experiment.run_grid(load_grid(p), tmp_path / "exp", nproc=cli)
        assert {j.cell: j.nproc for j in jobs} == want
    p.write_text(yaml.safe_dump({"set": TINY, "cells": [{"name": "a", "nproc": 0}]}))
    with pytest.raises(ConfigError, match="nproc"):
        load_grid(p)
