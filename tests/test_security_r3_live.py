"""Issue 53's attacks (round three) on a live `ltd serve` and a live `ltd train --nproc 2`: slow login
bodies, held UI streams, forged X-Forwarded-For headers, a data-URL image bomb, and the training
agent's listening sockets. All traffic goes to 127.0.0.1.
"""
from __future__ import annotations

import base64
import io
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from PIL import Image

from bench import _server as live

pytestmark = pytest.mark.slow

TOKEN = uuid.uuid4().hex
MAX_CONNECTIONS = 60
ENV = {"LTD_API_TOKEN": TOKEN, "LTD_MAX_CONNECTIONS": str(MAX_CONNECTIONS), "LTD_MAX_STREAMS": "20",
       "LTD_MAX_STREAMS_PER_CLIENT": "8", "LTD_STREAM_IDLE_SECONDS": "4"}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tiny_index_pair, tmp_path_factory):
    log = tmp_path_factory.mktemp("r3") / "serve.log"
    with live.serving(live.model_args(tiny_index_pair), log, env=ENV) as (proc, base):
        yield proc, base, log


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def _health_ok(base: str) -> bool:
    try:
        return httpx.get(base + "/api/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


# ---- 2: slow /login bodies, no token --------------------------------------------------------------------
def test_slow_login_bodies_cannot_hold_the_connections(server):
    """Row 2: more connections than the cap, each a POST /login announcing 8,000 bytes and sending one a
    second. They used to hold every slot for the whole body deadline (health: 503 for ~30 s)."""
    _, base, _ = server
    head = (b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: 8000\r\n\r\n")
    socks = []
    for _ in range(MAX_CONNECTIONS + 20):
        s = socket.create_connection(("127.0.0.1", _port(base)), timeout=5)
        s.sendall(head + b"t")
        socks.append(s)
    try:
        time.sleep(3)  # the attackers fall behind the minimum body rate
        answers = []
        for _ in range(10):
            live.send_each(socks, b"o")
            answers.append(_health_ok(base))
            time.sleep(1)
        assert all(answers), answers
        assert sum(live.closed_by_server(s) for s in socks) >= 20  # the slow ones were shed
    finally:
        for s in socks:
            s.close()


# ---- 4: held heartbeat streams ------------------------------------------------------------------------
def _open_stream(base: str, path: str) -> tuple[socket.socket, bytes]:
    s = socket.create_connection(("127.0.0.1", _port(base)), timeout=10)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    return s, s.recv(200)


def test_held_heartbeats_are_capped_and_closed_when_idle(server):
    """Row 4: many held heartbeats used to starve every other client. Now 8 per client address (20 in
    all) are let in, the rest are answered 503 at once, ordinary requests are served meanwhile, and a
    heartbeat whose session does nothing else is closed after the idle deadline (4 s here)."""
    _, base, _ = server
    opened = [_open_stream(base, f"/ui/gradio_api/heartbeat/h{uuid.uuid4().hex[:12]}") for _ in range(30)]
    try:
        firsts = [first.split(b"\r\n", 1)[0] for _, first in opened]
        assert sum(f.startswith(b"HTTP/1.1 200") for f in firsts) == 8, firsts
        assert sum(f.startswith(b"HTTP/1.1 503") for f in firsts) == 22, firsts
        assert _health_ok(base) and httpx.get(base + "/api/models", headers=AUTH, timeout=10).status_code == 200
        held = [s for s, first in opened if first.startswith(b"HTTP/1.1 200")]
        deadline = time.monotonic() + 15
        for s in held:  # each ends (the final chunk, then the server closes) after ~4 s of idleness
            s.settimeout(max(0.1, deadline - time.monotonic()))
            data = b""
            while not data.endswith(b"0\r\n\r\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        assert time.monotonic() < deadline
        again, first = _open_stream(base, "/ui/gradio_api/heartbeat/fresh")
        assert first.startswith(b"HTTP/1.1 200")  # the slots are free again
        again.close()
    finally:
        for s, _ in opened:
            s.close()


# ---- 11: X-Forwarded-For from any peer ------------------------------------------------------------------
def test_forged_forwarded_addresses_do_not_reset_the_wrong_token_limit(server):
    """Row 11: 60 wrong tokens, each with a new X-Forwarded-For, used to get 401 every time (each looked
    like a new client). Without --forwarded-allow-ips the header is ignored: the limit holds. And the
    right token still gets in while the address is locked (one look every 3 s)."""
    _, base, _ = server
    codes = [httpx.get(base + "/api/models", timeout=10, headers={"Authorization": "Bearer wrong",
                                                                  "X-Forwarded-For": f"10.0.{k // 250}.{k % 250}"}
                       ).status_code for k in range(60)]
    assert codes[:20] == [401] * 20 and set(codes[20:]) == {429}, codes
    time.sleep(3.2)
    assert httpx.get(base + "/api/models", headers=AUTH, timeout=10).status_code == 200
    assert httpx.get(base + "/api/models", headers=AUTH, timeout=10).status_code == 200  # forgiven


# ---- 1: the data-URL image bomb, live ---------------------------------------------------------------
def test_a_data_url_image_bomb_costs_the_server_nothing(server):
    proc, base, _ = server
    buf = io.BytesIO()
    Image.new("1", (16383, 16383), 0).save(buf, "PNG", optimize=True)
    bomb = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    cfg = httpx.get(base + "/ui/config", headers=AUTH, timeout=10).json()
    images = {c["id"] for c in cfg["components"] if c.get("type") == "image"}
    events = [(d["api_name"], len(d["inputs"]), k) for d in cfg["dependencies"] if d.get("api_name")
              for k, cid in enumerate(d["inputs"]) if cid in images]
    before = live.rss_mb(proc.pid)
    for api, n, pos in events[:4]:
        data: list = [None] * n
        data[pos] = {"path": None, "url": bomb, "meta": {"_type": "gradio.FileData"}}
        r = httpx.post(f"{base}/ui/gradio_api/call/{api}", json={"data": data}, headers=AUTH, timeout=30)
        assert r.status_code == 400 and r.json()["error"] == "forbidden_file", (api, r.text[:200])
    assert live.rss_mb(proc.pid) - before < 100 and _health_ok(base)


# ---- 5: the training agent's sockets ------------------------------------------------------------------
def _listening(pids: set[int]) -> set[str]:
    """'ADDRESS:PORT' of every TCP socket in LISTEN state that one of ``pids`` holds (from /proc)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    out = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                addr, port = f[1].split(":")
                raw = bytes.fromhex(addr)
                if width == 8:
                    ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
                else:
                    ip = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                out.add(f"{ip}:{int(port, 16)}")
    return out


def _tree(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return found


def test_data_parallel_training_listens_on_loopback_only(tmp_path):
    """Row 5: torch's rendezvous store listened on every interface with no authentication."""
    from conftest import TINY

    sets = [a for s in [*TINY, "train.epochs=6"] for a in ("--set", s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(live.ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "train", "--config", "synthetic_baseline", *sets,
                             "--out", str(tmp_path / "run"), "--nproc", "2", "--no-progress"], cwd=live.ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen: set[str] = set()
    try:
        while proc.poll() is None:
            seen |= _listening(_tree(proc.pid))
            time.sleep(0.2)
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 0, out[-2000:]
    assert len(seen) >= 2, seen  # the agent's stores at least
    assert all(s.startswith(("127.0.0.1:", "::1:")) for s in seen), seen
