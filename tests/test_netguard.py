"""The network guard of the tests (tests/netguard.py) refuses and records every outside host, lets
loopback through, works in a subprocess server, and every test file that names an outside host uses it.
"""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import netguard
import pytest

ROOT = Path(__file__).resolve().parent
OUTSIDE_URL = re.compile(r"https?://(\[[0-9a-fA-F:]+\]|[A-Za-z0-9][A-Za-z0-9.\-_]*)", re.IGNORECASE)
GUARDS = ("no_outside_network", "netguard.serving")
# Files whose outside URLs are never handed to anything that could fetch them:
TEXT_ONLY = {
    "test_ptb_tokenize.py": "URLs are tokenizer input",
    "test_docs_site.py": "link text in Markdown that the docs build rewrites",
    "test_browser.py": "the browser's every request goes through a playwright route that aborts all but the "
                       "server's and lists them (the test asserts which)",
    "test_netguard.py": "this file",
}


def test_outside_hosts_are_refused_and_recorded(no_outside_network):
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("example.com", 80)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("93.184.215.14", 80), timeout=1)
    with pytest.raises(httpx.HTTPError):
        httpx.get("http://example.com/", timeout=1)
    s = socket.socket()
    with pytest.raises(ConnectionRefusedError):
        s.connect(("10.255.255.1", 80))
    s.close()
    assert len(no_outside_network) == 4 and "example.com" in no_outside_network[0]
    no_outside_network.clear()  # seen: the fixture's own check would fail the test otherwise


def test_loopback_passes(no_outside_network):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    threading.Thread(target=lambda: server.accept()[0].close(), daemon=True).start()
    with socket.create_connection(("localhost", port), timeout=5):
        pass
    server.close()
    assert socket.getaddrinfo("127.0.0.1", 80) and no_outside_network == []


@pytest.mark.parametrize("host, ok", [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True), ("[::1]", True),
                                      ("localhost", True), (None, True), ("example.com", False),
                                      ("10.0.0.1", False), ("0.0.0.1", False), ("::ffff:8.8.8.8", False)])
def test_what_counts_as_loopback(host, ok):
    assert netguard.is_loopback(host) is ok


def test_a_subprocess_is_guarded_and_logs_its_attempts(tmp_path):
    log = tmp_path / "attempts.log"
    code = ("import socket\ntry:\n    socket.getaddrinfo('example.com', 443)\nexcept socket.gaierror:\n"
            "    print('refused')\n")
    env = {"PATH": "/usr/bin:/bin", **netguard.subprocess_env(log)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "refused", out.stderr
    assert len(netguard.attempts(log)) == 1 and "example.com" in netguard.attempts(log)[0]


def _outside_hosts(text: str) -> set[str]:
    return {m.group(1) for m in OUTSIDE_URL.finditer(text) if not netguard.is_loopback(m.group(1))
            and m.group(1).lower() != "testserver"}


def test_every_test_that_names_an_outside_host_blocks_the_network():
    bad = []
    for path in sorted(ROOT.glob("*.py")):
        text = path.read_text()
        hosts = _outside_hosts(text)
        if hosts and path.name not in TEXT_ONLY and not any(g in text for g in GUARDS):
            bad.append(f"{path.name}: {sorted(hosts)}")
    assert not bad, ("these files name outside hosts without the network guard (the no_outside_network "
                     "fixture, or netguard.serving for a server):\n" + "\n".join(bad))


def test_the_grep_sees_outside_urls():
    assert _outside_hosts('x = "http://example.com/a.png"; y = "https://93.184.215.14/x"') == {"example.com",
                                                                                            "93.184.215.14"}
    assert _outside_hosts('"http://127.0.0.1:8000/api" "http://localhost/x" "http://testserver/"') == set()
