"""docs/deploy/nginx.conf is run, not only read: nginx with that file (ports and certificate paths
swapped for test ones) in front of a live `ltd serve`, all on loopback, with a throwaway certificate.

Checked through the proxy: https only (80 redirects), health open and the rest behind the token, the
login cookie Secure (the server trusts the proxy's X-Forwarded-Proto), bodies over the proxy's limit
refused before they reach the server and JSON still capped by the server, a request rate per client,
and a client that never finishes its headers cut by the proxy's header timeout. Skipped where nginx
or openssl is not installed.
"""
from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench import _server as live

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which("nginx") and shutil.which("openssl")),
                                 reason="needs nginx and openssl")]

NAME = "search.example.org"  # never resolved: every connection goes to 127.0.0.1


def _certificate(folder) -> tuple[str, str]:
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={NAME}",
                    "-addext", f"subjectAltName=DNS:{NAME},IP:127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    return cert, key


def _config(folder, upstream: int, http_port: int, https_port: int, cert: str, key: str) -> str:
    """The shipped file with only its ports and certificate paths changed, inside a minimal nginx.conf."""
    site = (live.ROOT / "docs/deploy/nginx.conf").read_text()
    for old, new in {"server 127.0.0.1:8000;": f"server 127.0.0.1:{upstream};",
                     "listen 80;": f"listen 127.0.0.1:{http_port};",
                     "listen 443 ssl http2;": f"listen 127.0.0.1:{https_port} ssl http2;",
                     f"/etc/letsencrypt/live/{NAME}/fullchain.pem": cert,
                     f"/etc/letsencrypt/live/{NAME}/privkey.pem": key}.items():
        assert old in site, old
        site = site.replace(old, new)
    (folder / "ltd.conf").write_text(site)
    temps = " ".join(f"{kind}_temp_path {folder}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    main = folder / "nginx.conf"
    main.write_text(f"daemon off; worker_processes 1; pid {folder}/nginx.pid; error_log {folder}/error.log;\n"
                    + ("user root;\n" if os.geteuid() == 0 else "")  # workers must reach the test's private folder
                    + f"events {{ worker_connections 512; }}\nhttp {{ access_log off; {temps} include {folder}/ltd.conf; }}\n")
    return str(main)


def _wait_port(port: int, proc: subprocess.Popen, folder) -> None:
    for _ in range(100):
        assert proc.poll() is None, (folder / "error.log").read_text()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("nginx did not listen")


def _tls(port: int, cert: str) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=cert)
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30), server_hostname=NAME)


def test_the_nginx_example_serves_tls_with_limits_and_timeouts(tiny_index_pair, tmp_path):
    token = uuid.uuid4().hex
    cert, key = _certificate(tmp_path)
    http_port, https_port = live.free_port(), live.free_port()
    args = [*live.model_args(tiny_index_pair), "--no-ui", "--allowed-host", NAME, "--forwarded-allow-ips", "127.0.0.1"]
    with live.serving(args, tmp_path / "serve.log", env={"LTD_API_TOKEN": token}) as (_, base):
        conf = _config(tmp_path, int(base.rsplit(":", 1)[1]), http_port, https_port, cert, key)
        nginx = subprocess.Popen(["nginx", "-p", str(tmp_path), "-c", conf], stderr=subprocess.DEVNULL)
        try:
            _wait_port(https_port, nginx, tmp_path)
            slow = _tls(https_port, cert)  # a client that never finishes its headers
            slow.sendall(b"GET /api/health HTTP/1.1\r\nHost: " + NAME.encode() + b"\r\n")
            t_slow = time.monotonic()

            r = httpx.get(f"http://127.0.0.1:{http_port}/api/health", headers={"Host": NAME})
            assert r.status_code == 301 and r.headers["location"].startswith(f"https://{NAME}/")
            auth = {"Host": NAME, "Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=f"https://127.0.0.1:{https_port}", verify=ssl.create_default_context(cafile=cert),
                              headers={"Host": NAME}, timeout=30) as c:
                h = c.get("/api/health")
                assert h.status_code == 200 and "max-age" in h.headers["strict-transport-security"]
                assert c.get("/api/models").status_code == 401
                assert c.get("/api/models", headers=auth).status_code == 200
                login = c.post("/login", data={"token": token, "next": "/api/models"})
                assert login.status_code == 303 and "secure" in login.headers["set-cookie"].lower()
                big = c.post("/api/search/text", json={"query": "x" * 100_000}, headers=auth)
                assert big.status_code == 413 and big.json()["error"]  # the server's JSON limit, by type
                with ThreadPoolExecutor(8) as pool:  # far over 20 requests/s with a burst of 40
                    codes = list(pool.map(lambda _: c.get("/api/nothing", headers=auth).status_code, range(160)))
                assert 404 in codes and 503 in codes, sorted(set(codes))

            upload = _tls(https_port, cert)  # 12 MB announced: refused before a byte of it is sent
            upload.sendall(f"POST /api/search/image HTTP/1.1\r\nHost: {NAME}\r\nAuthorization: Bearer {token}\r\n"
                           "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 12000000\r\n\r\n".encode())
            answer = upload.recv(1000)
            assert answer.startswith(b"HTTP/1.1 413") and b"Server: nginx" in answer, answer  # not the server's 413
            upload.close()

            time.sleep(max(0.0, t_slow + 11 - time.monotonic()))  # past the proxy's 10 s header timeout
            slow.settimeout(5)  # still open by then: recv times out and the test fails
            try:
                answer = slow.recv(200)
            except (ssl.SSLError, ConnectionResetError):
                answer = b""
            slow.close()
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
        finally:
            nginx.terminate()
            nginx.wait(timeout=10)
