"""Attacks on a live `ltd serve`, through its real routes (the mounted Gradio UI included).

Each test is the attack or the failure it stops:
- a client names a server file (or /dev/zero) as the "image" of a UI event: the file must not be
  copied or served, and the server must keep answering;
- Gradio's URL-fetching and proxy routes, oversized UI bodies, foreign Host headers (DNS rebinding);
- the token: every route but health needs it, browsers log in once;
- a burst of worst-case uploads must leave the resident memory bounded;
- a busy port, and a server none of whose models can load: one line and exit code 2.

The URLs these attacks hand the server name outside hosts: the server runs under the tests' network
guard (tests/netguard.py: it refuses and logs any resolution or connection beyond loopback, and the
server fixture fails if the log is not empty), and so does this process (``no_outside_network``).
Timing bounds are generous: the machine may be loaded; what they catch is a server that hangs.
"""
from __future__ import annotations

import concurrent.futures as cf
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import netguard
import pytest
from PIL import Image

from bench import _server as live

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_outside_network")]
ANSWER_S = 5.0  # health while a hostile call is in flight: answered, not hung (1 s idle; loaded CI takes longer)


@pytest.fixture(scope="module")
def server(tiny_index_pair, tmp_path_factory):
    with netguard.serving(live.model_args(tiny_index_pair), tmp_path_factory.mktemp("sec")) as (proc, base, _):
        yield proc, base


def _image_events(base: str) -> list[tuple[str, int, list[int]]]:
    """(api name, position of the image input, input component ids) of every UI event that takes an image."""
    cfg = httpx.get(base + "/ui/config", timeout=10).json()
    images = {c["id"] for c in cfg["components"] if c.get("type") == "image"}
    out = []
    for d in cfg["dependencies"]:
        for pos, cid in enumerate(d.get("inputs", [])):
            if cid in images and d.get("api_name"):
                out.append((d["api_name"], pos, d["inputs"]))
                break
    return out


def _call(base: str, api: str, data: list, timeout: float = 30) -> str:
    """Call a UI event through Gradio's HTTP API; the text of its event stream."""
    with httpx.Client(base_url=base, timeout=timeout) as c:
        r = c.post(f"/ui/gradio_api/call/{api}", json={"data": data})
        if r.status_code != 200:
            return f"HTTP {r.status_code} {r.text}"
        return c.get(f"/ui/gradio_api/call/{api}/{r.json()['event_id']}").text


def _payload(inputs: list[int], pos: int, path: str) -> list:
    data: list = [None] * len(inputs)
    data[pos] = {"path": path, "meta": {"_type": "gradio.FileData"}, "orig_name": "x.jpg"}
    return data


def test_ui_events_never_read_server_files(server, tmp_path):
    _, base = server
    secret = tmp_path / f"secret-{uuid.uuid4().hex}.txt"
    marker = f"LTD-SECRET-{uuid.uuid4().hex}"
    secret.write_text(marker)
    t_start = time.time()
    events = _image_events(base)
    assert len(events) >= 4  # search upload, search button, compare upload, compare button, …
    from gradio.utils import get_upload_folder

    for api, pos, inputs in events:
        for path in (str(secret), "/etc/passwd"):
            text = _call(base, api, _payload(inputs, pos, path))
            assert marker not in text and "root:x:" not in text, api
            # whatever path the answer names, the file server does not hand out the secret
            for word in text.replace('"', " ").replace("'", " ").split():
                if word.startswith("/") and "secret" in word or word.endswith("passwd"):
                    r = httpx.get(f"{base}/ui/gradio_api/file={word.strip('.,;:()')}", timeout=10)
                    assert r.status_code != 200 or (marker not in r.text and "root:x:" not in r.text)
    copies = [p for p in Path(get_upload_folder()).rglob("*")
              if p.is_file() and p.name in (secret.name, "passwd") and p.stat().st_mtime >= t_start - 1]
    assert not copies, copies  # nothing was copied into Gradio's cache
    assert httpx.get(f"{base}/ui/gradio_api/file={secret}", timeout=10).status_code == 403


def test_dev_zero_as_an_image_does_not_hang_the_server(server):
    _, base = server
    for api, pos, inputs in _image_events(base)[:3]:
        t0 = time.time()
        pool = cf.ThreadPoolExecutor(1)
        fut = pool.submit(_call, base, api, _payload(inputs, pos, "/dev/zero"), 20)
        t1 = time.time()
        assert httpx.get(base + "/api/health", timeout=2 * ANSWER_S).status_code == 200
        assert time.time() - t1 < ANSWER_S  # health answers while the call is in flight
        fut.result(timeout=60)
        assert time.time() - t0 < 60
        pool.shutdown()
    t1 = time.time()
    assert httpx.get(base + "/api/health", timeout=2 * ANSWER_S).status_code == 200 and time.time() - t1 < ANSWER_S


def test_gradio_url_routes_and_big_ui_bodies_are_refused(server):
    _, base = server
    assert httpx.get(f"{base}/ui/gradio_api/file=http://127.0.0.1:1/x", timeout=10).status_code == 403
    assert httpx.get(f"{base}/ui/gradio_api/proxy=http://example.com/", timeout=10).status_code == 403
    api = _image_events(base)[0][0]
    r = httpx.post(f"{base}/ui/gradio_api/call/{api}", content=b'{"data": ["' + b"x" * 2_000_000 + b'"]}',
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"


def test_foreign_host_headers_are_refused(server):
    """DNS rebinding: a page on evil.example whose name resolves to 127.0.0.1 must not get answers."""
    _, base = server
    r = httpx.get(base + "/api/models", headers={"Host": "evil.example:8000"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"] == "host_not_allowed"
    for host in ("localhost:1234", "127.0.0.1", "[::1]:80"):
        assert httpx.get(base + "/api/health", headers={"Host": host}, timeout=10).status_code == 200


def _big_png(megapixels: float) -> bytes:
    """A highly compressible PNG (tens of KB) that decodes to ``megapixels`` million RGB pixels."""
    side = int((megapixels * 1e6) ** 0.5)
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (30, 120, 200)).save(buf, "PNG", optimize=True)
    return buf.getvalue()


def _big_jpeg(megapixels: float) -> bytes:
    side = int((megapixels * 1e6) ** 0.5)
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (200, 120, 30)).save(buf, "JPEG", quality=50)
    return buf.getvalue()


def test_upload_burst_leaves_memory_bounded(server):
    """The attack that took the server from 0.9 to 2.7 GB for good: 8 concurrent 64-KB PNGs that decode
    to 49 megapixels. Now refused (over the decoded-pixel budget) without growing the server; and 8
    concurrent uploads at the budget (15.5 MP PNGs, 60 MP JPEGs that decode at reduced scale), three
    rounds, stay within the decode slots' bound and the memory goes back afterwards.

    Measured on this project's 2-core VM: with the protections the burst peaks ~180 MB above the
    baseline and ends ~15 MB above; without them (8 decodes at once, no heap trimming) ~430 / ~160 MB."""
    proc, base = server
    bomb, png, jpeg = _big_png(49), _big_png(15.5), _big_jpeg(60)
    assert len(bomb) < 300_000 and len(png) < 200_000 and len(jpeg) < 3_000_000

    def upload(data: bytes) -> int:
        r = httpx.post(base + "/api/search/image", files={"file": ("x.img", data)}, data={"k": "3"}, timeout=120)
        return r.status_code

    httpx.post(base + "/api/search/image", files={"file": ("x.img", _big_jpeg(0.1))}, timeout=60)  # warm up
    before = live.rss_mb(proc.pid)
    peak = before
    with cf.ThreadPoolExecutor(8) as pool:
        for payloads, want in (([bomb] * 8, 400), ([png, jpeg] * 4, 200), ([jpeg, png] * 4, 200), ([png] * 8, 200)):
            futs = [pool.submit(upload, d) for d in payloads]
            while not all(f.done() for f in futs):
                peak = max(peak, live.rss_mb(proc.pid))
                time.sleep(0.05)
            assert [f.result() for f in futs] == [want] * 8
    time.sleep(1.0)
    after = live.rss_mb(proc.pid)
    assert peak - before < 300, (before, peak, after)
    assert after - before < 60, (before, peak, after)


def test_token_guards_everything_but_health(tiny_index_pair, tmp_path):
    token = uuid.uuid4().hex
    with netguard.serving(live.model_args(tiny_index_pair), tmp_path, env={"LTD_API_TOKEN": token}) as (_, base, _):
        with httpx.Client(base_url=base, timeout=10, follow_redirects=False) as c:
            assert c.get("/api/health").status_code == 200
            for path in ("/api/models", "/metrics", "/openapi.json", "/ui/config"):
                r = c.get(path)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
            assert c.get("/api/models", headers={"Authorization": f"Bearer {token}x"}).status_code == 401
            assert c.get("/api/models", headers={"Authorization": f"Bearer {token}"}).status_code == 200
            page = c.get("/ui/", headers={"Accept": "text/html"})
            assert page.status_code == 303 and page.headers["location"].startswith("/login")
            assert c.post("/login", data={"token": "wrong", "next": "/ui/"}).status_code == 401
            r = c.post("/login", data={"token": token, "next": "https://evil.example/"})
            assert r.status_code == 303 and r.headers["location"] == "/ui"  # no open redirect
            cookie = r.cookies.get("ltd_token")
            assert cookie and token not in cookie and "httponly" in r.headers["set-cookie"].lower()
            assert c.get("/ui/", cookies={"ltd_token": cookie}).status_code == 200
            assert c.get("/api/models", cookies={"ltd_token": cookie}).status_code == 200


def _ltd(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``ltd ARGS`` under the network guard (it must not reach out either); the attempts must be none."""
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "outside-attempts.log"
        res = subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=live.ROOT, capture_output=True, text=True,
                             timeout=timeout, env={**os.environ, **netguard.subprocess_env(log)})
        assert not netguard.attempts(log), netguard.attempts(log)
    return res


def test_busy_port_is_one_line_and_exit_2(tiny_index_pair, server):
    _, base = server
    port = base.rsplit(":", 1)[1]
    res = _ltd("serve", *live.model_args(tiny_index_pair), "--port", port)
    assert res.returncode == 2
    assert "cannot listen on 127.0.0.1:" in res.stderr and "--port" in res.stderr
    assert "http://" not in res.stdout  # no URL banner before the failure


def test_serve_exits_2_when_no_model_can_load(tiny_index_pair, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_index_pair["bl"], broken)
    mf = json.loads((broken / "manifest.json").read_text())
    mf["checkpoint_sha256"] = "0" * 64  # an index that another checkpoint built: refused before unpickling
    (broken / "manifest.json").write_text(json.dumps(mf))
    res = _ltd("serve", "--model", f"bl={broken}", "--port", str(live.free_port()))
    assert res.returncode == 2, res.stderr[-2000:]
    assert "is not the checkpoint that built" in res.stderr


def test_ui_takes_its_own_uploads_and_refuses_urls_live(server):
    """Issue 35, findings 1, 4 and 8 through the real queue: an upload through the UI is searched; a URL
    or a server path as a file value is refused before Gradio sees it; error events name no folders."""
    _, base = server
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 40, 40)).save(buf, "PNG")
    r = httpx.post(f"{base}/ui/gradio_api/upload", files={"files": ("red.png", buf.getvalue())}, timeout=30)
    assert r.status_code == 200, r.text
    uploaded = r.json()[0]
    assert httpx.post(f"{base}/ui/gradio_api/upload", files={"files": ("x.png", b"\x89PNG\r\n\x1a\n" + b"z" * 99)},
                      timeout=30).status_code == 415
    api, pos, inputs = _image_events(base)[0]
    text = _call(base, api, _payload(inputs, pos, uploaded), timeout=60)
    assert "process_completed" in text or "complete" in text, text[-500:]
    for bad in ("http://example.com/x.png", "https://example.com/y.jpg", "/etc/passwd"):
        with httpx.Client(base_url=base, timeout=30) as c:
            r = c.post(f"/ui/gradio_api/call/{api}", json={"data": _payload(inputs, pos, bad)})
            assert r.status_code == 400 and r.json()["error"] == "forbidden_file", (bad, r.text)
    gone = str(Path(uploaded).with_name("gone.png"))  # inside the upload folder, but no such file
    r = httpx.post(f"{base}/ui/gradio_api/call/{api}", json={"data": _payload(inputs, pos, gone)}, timeout=30)
    assert r.status_code == 400 and "upload it again" in r.json()["detail"] and "/" not in r.json()["detail"]
    # an event with inputs of the wrong types: whatever it answers names none of the server's folders
    # (the upload folder is no secret: the upload answer names it, as Gradio's protocol needs)
    data = [{"bad": [1, 2]} if k != pos else None for k in range(len(inputs))]
    text = _call(base, api, data, timeout=60)
    assert "event:" in text or text.startswith("HTTP 4"), text[-300:]
    for folder in (str(live.ROOT), os.environ["LTD_CACHE_DIR"], os.getcwd()):
        assert folder not in text, (folder, text[-500:])


def test_a_refused_body_gets_its_413_not_a_reset(server):
    """A JSON body over its limit, still arriving after the server has decided (what a reverse proxy
    sends): the client reads the 413. Refused unread, the rest of the body hit a closed socket, the
    server's kernel answered with a TCP reset, and nginx in front answered 502
    (tests/test_nginx_example.py saw it)."""
    import socket
    from urllib.parse import urlsplit

    _, base = server
    host, port = urlsplit(base).hostname, urlsplit(base).port
    body = json.dumps({"query": "x" * 100_000}).encode()  # 100 KB: over the 64 KB JSON limit
    head = (f"POST /api/search/text HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    for _ in range(10):
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(head + body[:16_384])
            time.sleep(0.3)  # the server has read the headers and decided by now
            for at in range(16_384, len(body), 8192):  # as nginx writes the rest: a reset here was its 502
                s.sendall(body[at:at + 8192])
                time.sleep(0.01)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"exceeds the limit" in answer
