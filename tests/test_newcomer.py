"""A newcomer's first hour, as the user meets it: the "Search your own photos" guide's commands run
end to end, and the CLI's answers to mistakes (exit code and first line, and how fast they come)."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from bench import _server as live

ROOT = Path(__file__).resolve().parents[1]
PHOTOS_GUIDE = ROOT / "docs" / "guides" / "photos.md"


def guide_block(path: Path) -> list[str]:
    """The lines of the first ```bash block of a usage guide (before its first ``##`` section)."""
    section = path.read_text().split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def ltd(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "LTD_PROGRESS": "off"})


def curl(line: str, base: str, variables: dict[str, str]) -> httpx.Response:
    """Run a guide's ``curl -s URL [-H 'K: V'] [-d DATA] [-F name=value|name=@file]`` line with httpx (the
    tests need no curl): ``$NAME`` expanded from ``variables``, ``localhost:8000`` replaced by ``base``."""
    args = shlex.split(re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], line))[1:]
    url, headers, data, fields, files = None, {}, None, {}, {}
    it = iter(args)
    for a in it:
        if a == "-s":
            continue
        if a == "-H":
            k, v = next(it).split(":", 1)
            headers[k.strip()] = v.strip()
        elif a == "-d":
            data = next(it).encode()
        elif a == "-F":
            k, v = next(it).split("=", 1)
            if v.startswith("@"):
                files[k] = (Path(v[1:]).name, Path(v[1:]).read_bytes())
            else:
                fields[k] = v
        else:
            assert url is None and not a.startswith("-"), f"curl option the test does not know: {a}"
            url = a.replace("localhost:8000", base.split("://", 1)[1])
    url = url if "://" in url else "http://" + url
    if files:
        return httpx.post(url, headers=headers, data=fields, files=files, timeout=60)
    return httpx.post(url, headers=headers, content=data, timeout=60)


def _photos(folder: Path, n: int, seed: int) -> None:
    (folder / "sub").mkdir(parents=True)
    for i in range(n):
        Image.new("RGB", (80, 60), ((seed * 40 + 30 * i) % 255, 120, 200 - 10 * i)).save(
            folder / ("sub" if i % 2 else ".") / f"p{seed}_{i}.jpg")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg %d" % seed)


@pytest.mark.slow
def test_guide_search_your_own_photos_runs_end_to_end(tiny_index_pair, tmp_path):
    lines = guide_block(PHOTOS_GUIDE)
    trip, more = tmp_path / "trip", tmp_path / "more"
    _photos(trip, 4, 1)
    _photos(more, 2, 2)
    Image.new("RGB", (60, 60), (250, 200, 30)).save(trip / "beach.jpg")
    (tmp_path / "caps.txt").write_text("a yellow square\na blue circle\n")
    subst = {"demo/flickr8k/runs/ltd/best.pt": str(tiny_index_pair["runs"]["ltd"] / "best.pt"),
             "demo/flickr8k/indexes/ltd": str(tiny_index_pair["ltd"]),
             "~/Pictures/trip_captions.txt": str(tmp_path / "caps.txt"), "~/Pictures/trip": str(trip),
             "~/Pictures/more": str(more), "indexes/trip": str(tmp_path / "indexes" / "trip")}

    def sub(line: str) -> str:
        for a, b in subst.items():
            line = line.replace(a, b)
        return line

    setup = [sub(ln) for ln in lines if re.match(r"^[A-Z]+=", ln)]
    commands = [sub(ln) for ln in lines if ln.startswith("ltd index")]
    serve = next(sub(ln) for ln in lines if ln.startswith("ltd serve"))
    curls = [sub(ln) for ln in lines if ln.startswith("curl")]
    assert len(commands) == 2 and len(curls) == 2 and len(setup) == 3
    env = {**os.environ, "LTD_PROGRESS": "off", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for cmd in commands + [commands[1]]:  # the append twice: the second adds nothing
        res = subprocess.run(["bash", "-c", "\n".join(setup + [cmd])], cwd=tmp_path, capture_output=True, text=True,
                             env=env, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["images"] == 4 + 1 + 2 and summary["captions"] == 2  # broken files skipped, nothing twice
    mf = json.loads((tmp_path / "indexes" / "trip" / "manifest.json").read_text())
    assert sorted(Path(s["file"]).name for s in mf["skipped"]) == ["broken.jpg", "broken.jpg"]
    args = serve.split()[2:]
    variables = dict(ln.split("#")[0].strip().split("=", 1) for ln in setup)
    with live.serving(args, tmp_path / "serve.log") as (_, base):
        for cmd, n in zip(curls, (3, 2)):  # text → 3 of 7 photos; an upload → both captions (k = 3 > 2)
            r = curl(cmd, base, variables)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["model"] == "trip" and len(body["results"]) == n, body


@pytest.mark.slow
@pytest.mark.parametrize("args, first_line", [
    (["index", "--checkpoint", "nope.pt", "--images-dir", ".", "--out", "x"], "ltd index: error: --checkpoint: file not found: nope.pt"),
    (["train", "--config", "flickr8k_ltdd"], "ltd train: error: config file not found: flickr8k_ltdd (did you mean 'flickr8k_ltd'?)"),
    (["train", "--set", "loss.etaa=0.1"], "ltd train: error: unknown config key 'loss.etaa' (did you mean 'eta'?)"),
    (["serve", "--model", "bl"], "ltd serve: error: --model 'bl': expected NAME=INDEX_DIR"),
])
def test_cli_mistakes_are_one_line_and_exit_2(args, first_line):
    res = ltd(*args)
    assert res.returncode == 2
    assert res.stderr.splitlines()[0].startswith(first_line), res.stderr


def test_set_without_equals_gets_the_commands_usage_and_a_hint():
    res = ltd("train", "--set", "loss.eta", "0.15")
    assert res.returncode == 2
    assert res.stderr.startswith("usage: ltd train")  # the command's usage, not the top level's
    assert "did you mean --set loss.eta=0.15 ?" in res.stderr


@pytest.mark.slow
def test_verbose_anywhere_on_the_command_line():
    for args in (["-v", "index"], ["index", "-v"]):
        res = ltd(*args, "--checkpoint", "nope.pt", "--images-dir", ".", "--out", "x")
        assert res.returncode == 2 and "Traceback" in res.stderr


@pytest.mark.slow
def test_list_presets_says_what_each_is_and_costs():
    res = ltd("train", "--list-presets")
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and len(lines) >= 11
    ltd_line = next(ln for ln in lines if ln.startswith("flickr8k_ltd "))
    assert "constraint" in ltd_line and "min" in ltd_line


@pytest.mark.slow
def test_presets_whose_captions_or_targets_saw_flickr30k_or_coco_captions_carry_the_mark(monkeypatch, tmp_path):
    """Issue 39: a number from a caption encoder or LTD targets that saw Flickr30k/COCO captions
    (MiniLM, mpnet) is marked ᴹ — on every preset, the scenes' too (RESULTS marks the demo's numbers)
    — and the listing explains the mark."""
    from app.cli.train import CONTAMINATED, describe_presets
    from training.config import load_config
    from training.losses.objective import objective_needs

    monkeypatch.setenv("LTD_DATA_DIR", str(tmp_path))
    for name, summary, _ in describe_presets("train"):
        cfg = load_config(name)
        target = objective_needs(cfg.loss).target_model
        saw = cfg.model.text_encoder in ("sbert", "tern") or (target is not None and target != "glove-mean")
        assert (CONTAMINATED in summary) == saw, f"{name}: {summary}"
    res = ltd("train", "--list-presets")
    assert res.stdout.splitlines()[-1].startswith(f"{CONTAMINATED} the caption encoder or the LTD targets")


def test_a_mistyped_captions_file_fails_fast_on_a_500_image_folder(tiny_index_pair, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(500):
        Image.new("RGB", (32, 24), (i % 255, 40, 90)).save(folder / f"{i}.jpg")
    t0 = time.perf_counter()
    res = ltd("index", "--checkpoint", str(tiny_index_pair["runs"]["bl"] / "best.pt"), "--images-dir", str(folder),
              "--captions-file", str(tmp_path / "captoins.txt"), "--out", str(tmp_path / "ix"))
    elapsed = time.perf_counter() - t0
    assert res.returncode == 2 and "--captions-file: file not found" in res.stderr
    assert not (tmp_path / "ix").exists()  # refused before anything was embedded or written
    assert elapsed < 60, f"{elapsed:.1f} s to report a missing file"  # generous (a loaded machine): the check above
    # is what catches work done before the refusal
    out = tmp_path / "exists"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    res = ltd("index", "--checkpoint", str(tiny_index_pair["runs"]["bl"] / "best.pt"), "--images-dir", str(folder),
              "--out", str(out))
    assert res.returncode == 2 and "not an index" in res.stderr  # before any photo is embedded


@pytest.mark.slow
def test_serve_with_a_moved_checkpoint_names_the_fix_and_takes_it(tiny_index_pair, tmp_path):
    """The checkpoint moved after indexing: that model is reported down with the fix, the other model
    serves; pointing the index at the checkpoint's new place with @ brings it back."""
    import shutil

    run = tmp_path / "moved_run"
    shutil.copytree(tiny_index_pair["runs"]["ltd"], run)
    ix = tmp_path / "ltd_ix"
    shutil.copytree(tiny_index_pair["ltd"], ix)
    mf = json.loads((ix / "manifest.json").read_text())
    mf["checkpoint"], mf["checkpoint_relative"] = "/gone/runs/ltd/best.pt", "../gone/best.pt"  # as if moved away
    (ix / "manifest.json").write_text(json.dumps(mf))
    args = ["--model", f"bl={tiny_index_pair['bl']}", "--model", f"ltd={ix}", "--no-ui"]
    with live.serving(args, tmp_path / "a.log") as (_, base):
        health = httpx.get(base + "/api/health", timeout=10).json()
        assert health["status"] == "degraded" and health["loaded"] == ["bl"]
        down = health["down"]["ltd"]  # open to anyone: the fix without the server's paths (issue 35)
        assert "--model NAME=" in down and "@" in down and "/gone" not in down and str(tmp_path) not in down
    log = (tmp_path / "a.log").read_text()  # the operator's log has the whole fix
    assert "@/path/to/checkpoint.pt" in log and "/gone/runs/ltd/best.pt" in log
    args[3] = f"ltd={ix}@{run / 'best.pt'}"
    with live.serving(args, tmp_path / "b.log") as (_, base):
        health = httpx.get(base + "/api/health", timeout=10).json()
        assert health["status"] == "ok" and health["loaded"] == ["bl", "ltd"]
