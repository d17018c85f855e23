"""A real `ltd serve` in a subprocess: for benchmarks and for tests that must go through the live
server (browser, attacks on the mounted Gradio routes, memory of the running process)."""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STARTUP_S = 90  # a shared 2-core machine: importing torch + gradio and loading two models takes a while


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(url: str, headers: dict | None = None) -> int | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


def start(args: list[str], log: Path, *, env: dict | None = None, ready_path: str = "/api/health",
          ready_status: int = 200, timeout: float = STARTUP_S, nofile: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start `ltd serve ARGS --port P` (its own process group) and wait until ``ready_path`` answers
    ``ready_status``; fails fast when the server exits or reports that no model could be loaded.
    ``nofile``: the server's descriptor limit (``ulimit -n``)."""
    port = free_port()
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", GRADIO_ANALYTICS_ENABLED="False", **(env or {}))
    fh = log.open("w")

    def limit() -> None:
        if nofile:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", *args, "--port", str(port)], cwd=ROOT,
                            stdout=fh, stderr=subprocess.STDOUT, env=full_env, start_new_session=True,
                            preexec_fn=limit if nofile else None)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            fh.close()
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if status(base + ready_path) == ready_status:
            return proc, base
        time.sleep(0.3)
    stop(proc)
    raise RuntimeError(f"server not ready after {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """SIGINT to the server's process group (uvicorn's clean shutdown), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=15)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


@contextlib.contextmanager
def serving(args: list[str], log: Path, **kw) -> Iterator[tuple[subprocess.Popen, str]]:
    proc, base = start(args, log, **kw)
    try:
        yield proc, base
    finally:
        stop(proc)


def rss_mb(pid: int) -> float:
    """Resident memory of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_seconds_of(pid: int) -> float:
    """User + system CPU time of one process (its threads), from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live child processes (uvicorn's workers), from /proc
    (Linux). On a shared machine CPU per request does not depend on what else is running; wall does."""
    total = cpu_seconds_of(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                total += cpu_seconds(int(child))
    return total


def children_cpu_seconds(pid: int) -> float:
    """CPU time of a process's live child processes (a server's write embedders), from /proc (Linux)."""
    return cpu_seconds(pid) - cpu_seconds_of(pid)


def children_priority(pid: int) -> str:
    """The nice values and scheduling policies of the threads of a process's live child processes (a
    server's write embedders), from /proc (Linux): "nice 5, batch"; "none" without children."""
    policies, seen = {0: "normal", 3: "batch", 5: "idle"}, set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                for thread in Path(f"/proc/{child}/task").iterdir():
                    fields = (thread / "stat").read_text().rsplit(")", 1)[1].split()
                    seen.add((int(fields[16]), policies.get(int(fields[38]), fields[38])))  # nice, policy
    return "; ".join(f"nice {nice}, {policy}" for nice, policy in sorted(seen)) or "none"


def waited_children_cpu_seconds() -> float:
    """User + system CPU of this process's waited-for children (and theirs): what its commands used."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def model_args(pair: dict) -> list[str]:
    return ["--model", f"bl={pair['bl']}", "--model", f"ltd={pair['ltd']}"]


def send_each(socks: list[socket.socket], data: bytes) -> None:
    """One send on every socket; one the server has closed is skipped (callers count those later)."""
    for s in socks:
        with contextlib.suppress(OSError):
            s.send(data)


def dribble_headers(socks: list[socket.socket], seconds: float) -> None:
    """The slow-headers attack: one more header line a second on every socket, never the blank line
    that ends the headers."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        send_each(socks, b"X-Slow: 1\r\n")
        time.sleep(1)


def closed_by_server(s: socket.socket) -> bool:
    """The server closed it (or answered and closed): reading does not block."""
    s.setblocking(False)
    try:
        s.recv(64)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True
