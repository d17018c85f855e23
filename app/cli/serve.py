"""`ltd serve`: the REST API (and the UI) over one or more named models.

    ltd serve --model bl=indexes/bl --model ltd=indexes/ltd [--host 127.0.0.1] [--port 8000] [--no-ui]

Each index directory's manifest names its checkpoint; both are loaded once at start-up and checked
against each other. ``serve()`` is reusable (``ltd demo`` passes a ready service).
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import socket
import threading
from pathlib import Path

from app.cli import serve_ray
from training.choices import TextRuntime, names
from training.errors import UserFileNotFound, UserValueError

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[common], help="serve the REST API (/api, docs at /docs) and the UI (/ui)",
                       description="Serve named models: each --model NAME=INDEX_DIR is an index directory built "
                                   "by `ltd index`, whose manifest names the checkpoint that built it.")
    p.add_argument("--model", action="append", default=[], metavar="NAME=INDEX_DIR[@CHECKPOINT]",
                   help="a model to serve (repeatable), e.g. --model bl=indexes/bl --model ltd=indexes/ltd; "
                        "@CHECKPOINT names the checkpoint when it is no longer where the index was built")
    p.add_argument("--captioner", action="append", default=[], metavar="NAME=CHECKPOINT",
                   help="a captioner to serve (repeatable; from `ltd caption train`): POST /api/caption and the "
                        "UI's Caption tab, its captions scored by the retrieval models")
    add_bind_args(p)
    p.add_argument("--images-root", action="append", default=[], metavar="DIR",
                   help="a folder image files may be served from (repeatable); default: the folders `ltd index` "
                        "was given for each index, as it recorded them for this user")
    p.add_argument("--forwarded-allow-ips", default=None, metavar="IPS",
                   help="reverse proxies (comma-separated addresses, '*' for any) whose X-Forwarded-For is believed; "
                        "default none: the peer's address counts (wrong-token limit, stream caps)")
    p.add_argument("--writable", action="store_true",
                   help="take writes: add, edit and remove items of the served indexes (REST and UI); on a "
                        "non-loopback address they need LTD_WRITE_TOKEN (distinct from LTD_API_TOKEN)")
    p.add_argument("--write-nice", type=int, default=None, metavar="N",
                   help="run the embedding of writes at nice +N, 0-19 (default 5), batch-scheduled on Linux: adds take "
                        "the CPU searches leave")
    p.add_argument("--write-in-process", action="store_true", default=None,
                   help="embed the uploads of writes on a thread of the server (default: a child process per "
                        "model, outside the searches' interpreter; LTD_WRITE_IN_PROCESS=1)")
    p.add_argument("--ingest-root", action="append", default=[], metavar="DIR",
                   help="a folder whose subfolders a writable server may add images from (repeatable)")
    p.add_argument("--no-ui", action="store_true", help="do not mount the Gradio UI at /ui")
    p.add_argument("--workers", type=int, default=1,
                   help="server processes, each loading every model (default 1; on 2 cores a second one measured no gain)")
    p.add_argument("--device", default=None, help="torch device for query encoding (default: cpu)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="intra-op torch threads per process (default 0: torch's default, one per core)")
    p.add_argument("--no-text-cache", action="store_true", help="disable the query-embedding cache")
    p.add_argument("--no-batching", action="store_true", help="encode each text query on its own request thread")
    p.add_argument("--quantize-text", action="store_true",
                   help="encode queries with an int8 copy of the text encoder (approximate: see BENCHMARKS.md)")
    p.add_argument("--text-runtime", choices=names(TextRuntime), default=None,
                   help="engine of a frozen sentence-transformers query encoder (default auto: OpenVINO on a CPU "
                        "with native bf16, else ONNX Runtime, else torch; other encoders run in torch)")
    p.add_argument("--text-runtime-threads", type=int, default=None, metavar="N",
                   help="threads of that engine when it is OpenVINO or ONNX Runtime (default: one fewer than the "
                        "cores, at least 1; the request path keeps a core)")
    p.add_argument("--verify-index", choices=("hash", "counts"), default="hash",
                   help="check index data files by sha256 (default) or only by size and counts (huge indexes)")
    p.add_argument("--access-log", action="store_true", help="log every request (off by default: /metrics counts them)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    serve_ray.add_args(p)
    p.set_defaults(func=cmd_serve)


def add_bind_args(p: argparse.ArgumentParser) -> None:
    """--host/--port/--expose/--allowed-host: shared by `ltd serve` and `ltd demo`."""
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only); any other address needs --expose")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--expose", action="store_true",
                   help="allow a non-loopback --host (e.g. 0.0.0.0): the API and UI become reachable from other "
                        "machines; set LTD_API_TOKEN to require a token")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host header to answer besides the bound address (repeatable; e.g. a DNS name)")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_policy(host: str, expose: bool, extra_hosts: list[str], token: str | None) -> list[str] | None:
    """The Host headers to answer (None = any), after refusing an accidental exposure."""
    if is_loopback(host):
        return ["localhost", "127.0.0.1", "::1", *extra_hosts]
    if not expose:
        raise UserValueError(f"--host {host} makes the server reachable from other machines; add --expose to do that on "
                         "purpose (and set LTD_API_TOKEN to require a token), or keep the default 127.0.0.1")
    if not token:
        log.warning("serving on %s WITHOUT a token: anyone who can reach this port can use the API and UI "
                    "(set LTD_API_TOKEN to require one)", host)
    return extra_hosts or None


def write_policy(settings, host: str) -> None:
    """Writes off by default; on a non-loopback address they need a write token of their own."""
    write = settings.write_token.get_secret_value() if settings.write_token else None
    read = settings.api_token.get_secret_value() if settings.api_token else None
    if settings.writable and not is_loopback(host) and not write:
        raise UserValueError(f"--writable on {host} needs LTD_WRITE_TOKEN (a token for writes, distinct from "
                             "LTD_API_TOKEN): anyone who reaches the port could otherwise change the index")
    if write and read and write == read:
        raise UserValueError("LTD_WRITE_TOKEN must differ from LTD_API_TOKEN (readers must not be able to write)")
    if write and not settings.writable:
        log.warning("LTD_WRITE_TOKEN is set but the server is not --writable: writes stay off")


def parse_models(specs: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``["bl=indexes/bl", "ltd=ix/ltd@runs/ltd/best.pt"]`` → (name → index dir, name → checkpoint),
    absolute paths; ValueError / FileNotFoundError on bad input."""
    models: dict[str, str] = {}
    checkpoints: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        name, path = name.strip(), path.strip()
        path, at, ckpt = path.partition("@")
        if not sep or not name or not path or (at and not ckpt):
            raise UserValueError(f"--model {spec!r}: expected NAME=INDEX_DIR or NAME=INDEX_DIR@CHECKPOINT, "
                             "e.g. --model ltd=indexes/ltd")
        if not NAME_RE.match(name):
            raise UserValueError(f"--model {spec!r}: a name is 1-64 letters, digits, '_', '.' or '-' "
                             "(it appears in URLs), starting with a letter or digit")
        if name in models:
            raise UserValueError(f"--model {spec!r}: the name {name!r} is given twice")
        d = Path(path).expanduser()
        if not d.is_dir():
            raise UserFileNotFound(f"--model {spec!r}: index directory {d} does not exist (build it with `ltd index`)")
        if not (d / "manifest.json").is_file():
            raise UserValueError(f"--model {spec!r}: {d} is not an index directory (no manifest.json); "
                             "build one with `ltd index`")
        if ckpt:
            c = Path(ckpt).expanduser()
            if not c.is_file():
                raise UserFileNotFound(f"--model {spec!r}: checkpoint {c} does not exist")
            checkpoints[name] = str(c.resolve())
        models[name] = str(d.resolve())
    return models, checkpoints


def parse_captioners(specs: list[str], flag: str = "--captioner") -> dict[str, str]:
    """``["xe=runs/cap_xe/best.pt"]`` → {name: absolute checkpoint path} (also ``ltd caption eval --judge``)."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = (x.strip() for x in spec.partition("="))
        if not sep or not NAME_RE.match(name) or not path:
            raise UserValueError(f"{flag} {spec!r}: expected NAME=CHECKPOINT (a name of letters, digits, '_', '.', '-')")
        if name in out:
            raise UserValueError(f"{flag} {spec!r}: the name {name!r} is given twice")
        if not Path(path).expanduser().is_file():
            raise UserFileNotFound(f"{flag} {spec!r}: checkpoint {path} does not exist")
        out[name] = str(Path(path).expanduser().resolve())
    return out


def preflight(settings) -> dict[str, str]:
    """Cheap checks of every model before the port is bound: the manifest reads and the checkpoint
    is where it says. Returns name → problem for the models that cannot work (any failure: one
    broken index, however it is broken, must not stop the others from serving)."""
    from indexer.index import IndexDirError, read_manifest, resolve_checkpoint

    problems = {}
    for name, d in settings.models.items():
        try:
            resolve_checkpoint(d, read_manifest(d), settings.checkpoints.get(name))
        except (IndexDirError, OSError) as e:
            problems[name] = str(e)
        except Exception as e:  # noqa: BLE001 - a manifest of the wrong shape (e.g. a number as a path)
            problems[name] = f"{type(e).__name__}: {e}"
    return problems


def urls(host: str, port: int, ui: bool) -> list[tuple[str, str]]:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else (f"[{host}]" if ":" in host else host)
    base = f"http://{shown}:{port}"
    out = [("API docs", f"{base}/docs"), ("health", f"{base}/api/health"), ("metrics", f"{base}/metrics")]
    return out + ([("UI", f"{base}/ui")] if ui else [])


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before anything is printed: a busy port is one clear error, not a banner and a crash."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UserValueError(f"cannot listen on {host}:{port}: {e.strerror or e} (another server running? pick another "
                         "--port)") from None
    sock.set_inheritable(True)
    return sock


def limit_heap_retention() -> None:
    """Large allocations (decoded uploads) come from mmap and go back to the OS when freed, instead of
    staying in glibc's heap at the peak a burst reached (M_MMAP_THRESHOLD fixed at 4 MiB)."""
    import ctypes  # lazy: ~7 ms, a quarter of `ltd --help`'s import time, for `ltd serve` only

    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 4 * 1024 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def serve(settings, *, host: str = "127.0.0.1", port: int = 8000, service=None, captions=None, workers: int = 1,
          access_log: bool = False, log_level: str = "info") -> int:
    """Run uvicorn until interrupted; 2 when no model could be loaded. ``service`` and ``captions``: an
    already built SearchService and the CaptionService beside it (one process only)."""
    import uvicorn

    from app.api.connections import GuardedHTTPProtocol
    from app.api.main import apply_thread_settings, create_app, freeze_when_loaded

    if workers < 1:
        raise UserValueError(f"--workers must be at least 1, got {workers}")
    if workers > 1 and service is not None:
        raise UserValueError("several workers cannot share a service object; each worker loads its own models")
    sock = bind_socket(host, port)
    limit_heap_retention()
    # X-Forwarded-* only from the proxies named (uvicorn would otherwise believe them from 127.0.0.1).
    proxies = settings.forwarded_allow_ips.strip()
    kw = dict(access_log=access_log, log_level=log_level, timeout_graceful_shutdown=5, http=GuardedHTTPProtocol,
              proxy_headers=bool(proxies), forwarded_allow_ips=proxies or "")
    if workers > 1:
        # Worker processes rebuild the app from LTD_* variables (app.api.main.create_app_from_env), the
        # token's real value included; the connection limits travel inside the pickled config.
        settings.workers = workers  # each process allows its share of the wrong-token limit
        os.environ.update(settings.to_env())
        _print_urls(host, port, settings.ui)
        config = guarded(uvicorn.Config("app.api.main:create_app_from_env", factory=True, workers=workers, **kw),
                         settings)
        from uvicorn.supervisors import Multiprocess

        Multiprocess(config, sockets=[sock]).run()
        return 0
    apply_thread_settings(settings)
    app = create_app(settings, service=service, captions=captions)
    server = uvicorn.Server(guarded(uvicorn.Config(app, **kw), settings))
    models = app.state.service.registry
    _stop_when_nothing_loads(models, server)
    freeze_when_loaded(app.state.service)
    _print_urls(host, port, app.state.ui_mounted)
    server.run(sockets=[sock])
    if models.load_error:
        log.error("%s", models.load_error)
        return 2
    return 0


def guarded(config, settings):
    """``config`` with the connection limits of ``settings`` (read by GuardedHTTPProtocol)."""
    from app.api.connections import ConnectionLimits

    config.ltd_limits = ConnectionLimits(header_timeout=settings.header_timeout, body_timeout=settings.body_timeout,
                                         min_body_rate=settings.min_body_rate, send_timeout=settings.send_timeout,
                                         max_connections=settings.max_connections)
    config.backlog = ConnectionLimits.backlog()
    return config


def _stop_when_nothing_loads(models, server) -> None:
    """When loading ends with no model at all (``models``: the service's registry), stop the server (the
    command then exits 2)."""
    def watch() -> None:
        models.ready.wait()
        if models.load_error:
            server.should_exit = True

    threading.Thread(target=watch, name="ltd-load-watch", daemon=True).start()


def _print_urls(host: str, port: int, ui: bool) -> None:
    for label, url in urls(host, port, ui):
        print(f"{label:>9}: {url}", flush=True)


def cmd_serve(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise UserValueError(f"--port must be in 1..65535, got {args.port}")
    serve_ray.check_args(args)
    overrides: dict = {"ui": not args.no_ui, "verify_index": args.verify_index}
    if args.model:  # checked before the server's modules (torch, gradio) are imported
        overrides["models"], overrides["checkpoints"] = parse_models(args.model)
    if args.captioner:
        overrides["captioners"] = parse_captioners(args.captioner)
    from app.api.settings import load_settings

    if args.device:
        overrides["device"] = args.device
    if args.torch_threads is not None:
        if args.torch_threads < 0:
            raise UserValueError("--torch-threads must be >= 0")
        overrides["torch_threads"] = args.torch_threads
    if args.no_text_cache:
        overrides["text_cache"] = 0
    if args.no_batching:
        overrides["text_batching"] = False
    if args.quantize_text:
        overrides["text_quantize"] = True
    if args.text_runtime:
        overrides["text_runtime"] = args.text_runtime
    if args.text_runtime_threads is not None:
        overrides["text_runtime_threads"] = args.text_runtime_threads
    if args.images_root:
        overrides["images_roots"] = [str(Path(d).expanduser().resolve()) for d in args.images_root]
    if args.forwarded_allow_ips is not None:
        overrides["forwarded_allow_ips"] = args.forwarded_allow_ips
    if args.writable:
        overrides["writable"] = True
    if args.write_nice is not None:
        overrides["write_nice"] = args.write_nice
    if args.write_in_process:
        overrides["write_in_process"] = True
    if args.ingest_root:
        for d in args.ingest_root:
            if not Path(d).expanduser().is_dir():
                raise UserFileNotFound(f"--ingest-root {d}: no such folder")
        overrides["ingest_roots"] = [str(Path(d).expanduser().resolve()) for d in args.ingest_root]
    settings = load_settings(**overrides)  # LTD_* environment variables fill in the rest
    if not settings.models:
        raise UserValueError("no models: give --model NAME=INDEX_DIR (repeatable), or set LTD_MODELS")
    if not args.model:  # from LTD_MODELS: check them like flags
        settings.models, found = parse_models([f"{n}={p}" for n, p in settings.models.items()])
        settings.checkpoints = {**found, **settings.checkpoints}
    token = settings.api_token.get_secret_value() if settings.api_token else None
    settings.allowed_hosts = bind_policy(args.host, args.expose, args.allowed_host, token)
    write_policy(settings, args.host)
    problems = preflight(settings)
    for name, why in problems.items():
        log.error("model %s cannot be served: %s", name, why)
    if len(problems) == len(settings.models):
        raise UserValueError("no model can be served (see above)")
    log.info("serving %s", ", ".join(f"{n}={p}" for n, p in settings.models.items()))
    service = serve_ray.ray_service(settings, args) if args.engine == "ray" else None
    return serve(settings, host=args.host, port=args.port, workers=args.workers, access_log=args.access_log,
                 log_level=args.log_level, service=service)
