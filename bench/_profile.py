"""Where a live server's CPU goes: py-spy samples of every thread of the server (and its worker
processes), grouped into the stages of a request. Used by ``bench/api_load.py --profile``.

py-spy is a tool, not a dependency of the project (``pip install py-spy``); it reads the server's
memory from outside (ptrace), so the server runs unmodified. Idle threads are not sampled, so the
shares are of CPU time spent in Python frames and the native code they call, across all threads.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

# (stage, pattern matched against one frame, "function (path/to/file.py:line)"). Each sample goes to
# the stage of its innermost frame that matches any pattern (the first pattern that matches that
# frame), so a pydantic call made while building the response counts as the response, and the
# middleware frames that enclose every request count only for the time spent in them.
STAGES: list[tuple[str, re.Pattern]] = [(name, re.compile(p)) for name, p in [
    ("text encoder (torch, tokenizer)", r"encode_batch|text_encoder\.py|sentence_transformers|transformers/|torch/"),
    ("FAISS search + hits (search/ranking.py)", r"search/ranking\.py|vector_index\.py|faiss/"),
    ("search service: query cleaning, cache, batcher hand-off", r"search/(service|encoding)\.py"),
    ("response: hit models + JSON (app/api/routers)", r"text_answer|image_answer|json_model|routers/search\.py"),
    ("FastAPI: body, JSON parse, request validation, dependencies", r"fastapi/|json/"),
    ("our middleware (prom, access, limits, errors)", r"app/api/(prom|security|limits|errors)\.py"),
    ("slow-client guard (app/api/connections.py)", r"app/api/connections\.py"),
    ("Starlette routing + responses", r"starlette/"),
    ("thread-pool hand-off (anyio, futures, threading)", r"anyio/|concurrent/futures|threading\.py|queue\.py"),
    ("HTTP protocol (uvicorn, h11, httptools)", r"uvicorn/|h11/|httptools"),
    ("event loop (asyncio / uvloop)", r"asyncio/|uvloop"),
]]
OTHER = "other"
# py-spy's own idle detection misses threads parked in Python-level waits on this machine, so a
# sample whose innermost frame is a wait is idle and left out of the shares.
IDLE = re.compile(r"^(Condition\.wait|Event\.wait|\w*Selector\.select|Thread\.join) \(")
IDLE_STAGE = "idle (waiting on a lock, a condition or the selector)"


def available() -> str | None:
    return shutil.which("py-spy")


def record(pid: int, out: Path, rate: int = 200) -> subprocess.Popen:
    """Start sampling ``pid`` and its child processes into ``out`` (collapsed stacks); stop with
    :func:`finish`."""
    exe = available()
    if exe is None:
        raise RuntimeError("--profile needs py-spy on PATH (pip install py-spy)")
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--subprocesses", "--rate", str(rate), "--format",
                             "raw", "--nonblocking", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen) -> None:
    """py-spy writes its file on SIGINT."""
    import signal

    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stage_of(stack: str) -> str:
    """The stage of a collapsed stack (outermost frame first, frames joined by ';')."""
    if IDLE.search(stack.rsplit(";", 1)[-1]):
        return IDLE_STAGE
    for frame in reversed(stack.split(";")):
        for name, pat in STAGES:
            if pat.search(frame):
                return name
    return OTHER


def breakdown(path: Path) -> Counter:
    """stage → samples, from py-spy's raw (collapsed) output: ``frame;frame;... count`` per line."""
    out: Counter = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            out[stage_of(stack)] += int(n)
    return out


def render(counts: Counter, requests: int, rate: int) -> list[str]:
    """A Markdown table: stage, share of the busy samples, busy thread-milliseconds per request (a thread
    waiting for the GIL counts as busy; torch's native worker threads have no Python frames and are not seen)."""
    counts = Counter({k: v for k, v in counts.items() if k != IDLE_STAGE})
    total = sum(counts.values()) or 1
    lines = ["| stage | share of busy samples | busy thread-ms per request |", "|---|---:|---:|"]
    for name, n in counts.most_common():
        lines.append(f"| {name} | {n / total:.1%} | {n / rate * 1000 / max(1, requests):.3f} |")
    lines.append(f"| all | {total:,} samples at {rate} Hz | {total / rate * 1000 / max(1, requests):.3f} |")
    return lines
