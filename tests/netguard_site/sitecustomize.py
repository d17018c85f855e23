"""Loaded by Python at start-up in a server a test starts (tests/netguard.py puts this folder on its
PYTHONPATH): name resolution and connections beyond loopback are refused and logged to $NETGUARD_LOG."""
import importlib.util
import os
from pathlib import Path

_log = os.environ.get("NETGUARD_LOG")
if _log:
    _spec = importlib.util.spec_from_file_location("_netguard", Path(__file__).resolve().parent.parent / "netguard.py")
    _guard = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_guard)

    def _record(what: str) -> None:
        with open(_log, "a") as f:
            f.write(f"{os.getpid()} {what}\n")

    _guard.install(_record)
