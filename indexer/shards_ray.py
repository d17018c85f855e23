"""A sharded index's shards on Ray Serve: each shard a deployment of R replicas, reached through handles.

``RayShardEngine(replicas=R)`` is an engine for ``search.sharded.load_sharded`` (``ltd serve --engine
ray``): called with a verified ``ShardedDir`` it deploys one Serve application per shard (``ShardReplica``:
the shard loaded with ``ShardSearcher``, memory-mapped, verified by sha256 in each replica) and returns
``RayShards``, whose ``submit`` sends a search to one of the shard's replicas (Serve's router picks it).

Faults are answers: a call whose replica died with it is sent once more (another replica of the shard
answers it); a call that still fails, or takes longer than ``timeout`` seconds (no replica alive, a node
gone), raises ``ShardDown``, and the caller leaves that shard out and marks the answer partial.
A shard counts as down from such a failure until it answers again; a prober thread pings every shard
each ``probe_s`` seconds so /api/health sees a shard come back (Serve's controller replaces a dead
replica: its health check runs every ``HEALTH_CHECK_S``) without waiting for a query.

Only the shards travel through Ray: the ingress (the FastAPI app of ``ltd serve``) reads the parent
manifest, the metadata and the memory-mapped exact vectors itself, so every node must see the index
directory at the same path (a shared file system, or a copy). No HTTP proxy is started: Serve is used
for its deployments, replicas and routing only, and the REST API stays ``ltd serve``'s own.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time

import numpy as np
import ray
from ray import serve

from indexer.shards_index import ShardedDir
from indexer.shards_search import ShardDown, ShardSearcher

log = logging.getLogger(__name__)

HEALTH_CHECK_S = 1.0  # how often Serve's controller checks a replica (its default is 10 s)


@serve.deployment(health_check_period_s=HEALTH_CHECK_S, health_check_timeout_s=10, graceful_shutdown_timeout_s=2,
                  ray_actor_options={"num_cpus": 0})  # the shard's search is I/O and BLAS: not a whole core's claim
class ShardReplica:
    """One replica of one shard (module doc)."""

    def __init__(self, path: str, shard: int, verify: str = "hash"):
        self.searcher = ShardSearcher.open(path, shard, verify)
        self.shard = shard

    def search(self, side: str, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The shard's top ``k`` of ``side`` (``ShardSearcher.search``)."""
        return self.searcher.search(side, queries, k)

    def ping(self) -> int:
        """The shard's generation."""
        return self.searcher.ping()

    def actor_name(self) -> str:
        """This replica's Ray actor name (operators, and the tests that kill one)."""
        return ray.get_runtime_context().get_actor_name()


class _Call:
    """One shard's answer on its way. A replica that died with the call (killed, its node gone) costs one
    resend inside the same deadline — Serve's router picks a live replica — so a shard with another
    replica still answers whole; a timeout or a second failure is a missing shard."""

    RESENDS = 1

    def __init__(self, shards: RayShards, shard: int, send):
        self.shards, self.shard, self.send = shards, shard, send
        self.response = send()

    def result(self, timeout: float | None = None):
        deadline = time.monotonic() + (timeout or self.shards.timeout)
        for attempt in range(self.RESENDS + 1):
            try:
                out = self.response.result(timeout_s=max(0.05, deadline - time.monotonic()))
                break
            except Exception as e:  # noqa: BLE001 - any failure of a remote shard is a missing shard, not an error
                if attempt < self.RESENDS and _replica_died(e) and time.monotonic() < deadline:
                    self.response = self.send()
                    continue
                self.shards.mark(self.shard, ok=False)
                try:
                    self.response.cancel()
                except Exception:  # noqa: BLE001 - it may be gone already
                    pass
                raise ShardDown(f"shard {self.shard}: {type(e).__name__}") from None
        self.shards.mark(self.shard, ok=True)
        return out


def _replica_died(e: BaseException) -> bool:
    """The call failed because its replica's actor is gone (not a timeout, not an error of the search)."""
    return isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError))


def app_names(sd: ShardedDir) -> list[str]:
    """The Serve application of each shard: named by the index folder and its generation."""
    tag = hashlib.sha256(str(sd.path.resolve()).encode()).hexdigest()[:10]
    gen = int(sd.manifest.get("generation", 0))
    return [f"ltd-{tag}-g{gen}-s{s:03d}" for s in range(len(sd.shard_paths))]


class RayShards:
    """The deployed shards of one sharded index (module doc)."""

    def __init__(self, handles: list, names: list[str], *, timeout: float, probe_s: float):
        self.handles, self.names, self.timeout, self.n = handles, names, timeout, len(handles)
        self._down: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if probe_s > 0:
            threading.Thread(target=self._probe, args=(probe_s,), name="ltd-shard-probe", daemon=True).start()

    def submit(self, shard: int, side: str, queries: np.ndarray, k: int) -> _Call:
        """Send a search to one of shard ``shard``'s replicas; ``result()`` gives (scores, parent rows)."""
        q = np.asarray(queries, np.float32)
        return _Call(self, shard, lambda: self.handles[shard].search.remote(side, q, int(k)))

    def mark(self, shard: int, *, ok: bool) -> None:
        """Record that ``shard`` answered (``ok``) or did not."""
        with self._lock:
            (self._down.discard if ok else self._down.add)(shard)

    def down(self) -> list[int]:
        """The shards that did not answer their last call or probe."""
        with self._lock:
            return sorted(self._down)

    def _probe(self, every: float) -> None:
        while not self._stop.wait(every):
            for s in range(self.n):
                try:
                    self.handles[s].ping.remote().result(timeout_s=max(0.5, every))
                    self.mark(s, ok=True)
                except Exception:  # noqa: BLE001 - a probe's failure is the state it reports
                    self.mark(s, ok=False)

    def close(self, delete: bool = False) -> None:
        """Stop probing; with ``delete``, remove the shards' Serve applications."""
        self._stop.set()
        if delete:
            for name in self.names:
                serve.delete(name)


class RayShardEngine:
    """Deploys a sharded index's shards on the Ray cluster this process is connected to (``ray.init``)."""

    def __init__(self, replicas: int = 1, *, timeout: float = 2.0, probe_s: float = 1.0, retire_s: float = 60.0):
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        self.replicas, self.timeout, self.probe_s = int(replicas), float(timeout), float(probe_s)
        self.retire_s = float(retire_s)  # how long an older generation's shards keep serving after a new one runs
        self.deployed: list[RayShards] = []

    def __call__(self, sd: ShardedDir, verify: str = "hash") -> RayShards:
        """Deploy (or update to this generation) every shard of ``sd``; returns when all replicas run."""
        serve.start(proxy_location="Disabled")  # deployments and handles only: the REST API is ltd serve's
        names, handles = app_names(sd), []
        t0 = time.perf_counter()
        for s, name in enumerate(names):
            app = ShardReplica.options(name=f"shard{s:03d}", num_replicas=self.replicas).bind(str(sd.path), s, verify)
            handles.append(serve.run(app, name=name, route_prefix=None))
        log.info("%s: %d shards × %d replicas running on Ray Serve (%.1f s)", sd.path.name, len(names), self.replicas,
                 time.perf_counter() - t0)
        shards = RayShards(handles, names, timeout=self.timeout, probe_s=self.probe_s)
        prefix = names[0].rsplit("-g", 1)[0] + "-g" if names else None
        older = [d for d in self.deployed if prefix and d.names and d.names[0].startswith(prefix) and d.names != names]
        for d in older:  # the same index's earlier generations: removed once the front has had time to swap
            timer = threading.Timer(self.retire_s, d.close, kwargs={"delete": True})
            timer.daemon = True
            timer.start()
        self.deployed = [d for d in self.deployed if d not in older] + [shards]
        return shards
