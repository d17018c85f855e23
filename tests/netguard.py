"""Tests send traffic to loopback only. Where code under test could reach out (a URL it was handed, a
proxy route, a name to resolve), the guard replaces name resolution and outgoing connections for every
host but loopback with a recorder that refuses them; the test then asserts that nothing was attempted.

- in the test process: the ``no_outside_network`` fixture (tests/conftest.py) yields the list of
  attempts and fails the test if it is not empty at the end;
- in a server started for a test (``ltd serve`` in a subprocess): ``serving`` starts it with
  ``netguard_site/sitecustomize.py`` on its path, which installs the same guard in the server and
  appends each attempt to a log; the context fails if the log is not empty when the server stops.

tests/test_netguard.py checks that the guard catches what it must, and that every test file that
names an outside host uses it.
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "netguard_site"
LOG_ENV = "NETGUARD_LOG"
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def is_loopback(host: object) -> bool:
    """A host a test may reach: a loopback address or name (None/"" are the wildcard, for binding)."""
    if host in (None, "", b""):
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    host = str(host).strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def install(record: Callable[[str], None]) -> Callable[[], None]:
    """Replace ``socket.getaddrinfo``, ``socket.create_connection`` and ``socket.socket.connect`` /
    ``connect_ex`` with versions that pass loopback through and, for any other host, call ``record`` with
    a description and raise the error an offline machine gives. Returns the function that undoes it."""
    real = {"getaddrinfo": socket.getaddrinfo, "create_connection": socket.create_connection,
            "connect": socket.socket.connect, "connect_ex": socket.socket.connect_ex}

    def getaddrinfo(host, *args, **kwargs):
        if not is_loopback(host):
            record(f"getaddrinfo({host!r})")
            raise socket.gaierror(socket.EAI_NONAME, "name resolution is blocked in the tests")
        return real["getaddrinfo"](host, *args, **kwargs)

    def create_connection(address, *args, **kwargs):
        if not is_loopback(address[0]):
            record(f"create_connection({address!r})")
            raise ConnectionRefusedError("outside connections are blocked in the tests")
        return real["create_connection"](address, *args, **kwargs)

    def guarded(name: str):
        def connect(self, address):
            if self.family in (socket.AF_INET, socket.AF_INET6) and not is_loopback(address[0]):
                record(f"socket.{name}({address!r})")
                raise ConnectionRefusedError("outside connections are blocked in the tests")
            return real[name](self, address)
        return connect

    socket.getaddrinfo, socket.create_connection = getaddrinfo, create_connection
    socket.socket.connect, socket.socket.connect_ex = guarded("connect"), guarded("connect_ex")

    def undo() -> None:
        socket.getaddrinfo, socket.create_connection = real["getaddrinfo"], real["create_connection"]
        socket.socket.connect, socket.socket.connect_ex = real["connect"], real["connect_ex"]
    return undo


def subprocess_env(log: Path) -> dict[str, str]:
    """Environment additions that install the guard in a Python subprocess, logging attempts to ``log``."""
    path = os.pathsep.join(p for p in (str(SITE_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, LOG_ENV: str(log)}


def attempts(log: Path) -> list[str]:
    """What a guarded subprocess tried to reach (one line each)."""
    return log.read_text().splitlines() if log.is_file() else []


@contextlib.contextmanager
def serving(args: list[str], folder: Path, **kw) -> Iterator[tuple[object, str, Path]]:
    """``bench._server.serving`` with the guard in the server: yields (process, base URL, attempt log) and
    fails if the server tried to reach an outside host by the time it stops."""
    from bench import _server as live

    log = folder / "outside-attempts.log"
    env = {**kw.pop("env", {}), **subprocess_env(log)}
    with live.serving(args, folder / "serve.log", env=env, **kw) as (proc, base):
        yield proc, base, log
    assert not attempts(log), f"the server tried to reach outside hosts: {attempts(log)}"
