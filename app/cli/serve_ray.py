"""`ltd serve --engine ray`: sharded indexes' shards as Ray Serve deployments behind the same server.

    ltd serve --model big=indexes/big --engine ray [--address HOST:PORT] [--replicas R] [--shard-timeout S]

The FastAPI app of ``ltd serve`` stays the front (REST API, UI, limits, tokens); a sharded index
(``ltd index --index-shards N``) is loaded with its shards deployed on the Ray cluster, each shard R
replicas (indexer/shards_ray.py). Without ``--address`` a local, loopback-only Ray instance is started
for the process; with it, the cluster at HOST:PORT (``ray start --head``) is joined. Unsharded indexes
are served in the front's process as without Ray. docs/guides/cluster.md.
"""
from __future__ import annotations

import argparse
import logging
import os

from training.errors import UserValueError

log = logging.getLogger(__name__)


def add_args(p: argparse.ArgumentParser) -> None:
    """The flags of the Ray path."""
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: search every index in this process (default); ray: the shards of sharded indexes "
                        "(`ltd index --index-shards N`) as Ray Serve deployments (docs/guides/cluster.md)")
    p.add_argument("--address", default=None,
                   help="--engine ray: the Ray cluster (HOST:PORT of `ray start --head`); default: a local one")
    p.add_argument("--replicas", type=int, default=1, help="--engine ray: replicas of each shard (default 1)")
    p.add_argument("--shard-timeout", type=float, default=2.0, metavar="S",
                   help="--engine ray: seconds a shard may take before the answer is given without it (partial)")


def check_args(args: argparse.Namespace) -> None:
    """The Ray flags, checked before anything is started."""
    if args.engine != "ray":
        if args.address or args.replicas != 1:
            raise UserValueError("--address and --replicas need --engine ray")
        return
    if not 1 <= args.replicas <= 64:
        raise UserValueError(f"--replicas must be in 1..64, got {args.replicas}")
    if not 0.05 <= args.shard_timeout <= 120:
        raise UserValueError(f"--shard-timeout must be in 0.05..120 seconds, got {args.shard_timeout}")
    if args.workers != 1:
        raise UserValueError("--engine ray serves from one front process (--workers 1); add replicas instead")


def ray_service(settings, args: argparse.Namespace):
    """A search service whose sharded indexes are searched on Ray Serve (connected here)."""
    import ray  # lazy: Ray takes seconds to import, and only this path needs it

    from indexer.shards_ray import RayShardEngine

    if args.address:
        loopback = args.address.rsplit(":", 1)[0] in ("127.0.0.1", "localhost")
        ray.init(address=args.address, log_to_driver=False, logging_level=logging.WARNING,
                 **({"_node_ip_address": "127.0.0.1"} if loopback else {}))
    else:  # a local instance, on the loopback interface only
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=os.cpu_count() or 1,
                 log_to_driver=False, logging_level=logging.WARNING)
    service = settings.search_service()
    service.registry.shard_engine = RayShardEngine(args.replicas, timeout=args.shard_timeout)
    return service
