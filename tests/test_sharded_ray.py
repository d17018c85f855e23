"""Sharded search on a real local Ray cluster (a head and a second node, both on 127.0.0.1, started by
the test and stopped at its end): the answers of one process, partial answers while a shard has no
replica, whole answers again once Ray Serve has replaced it; never a 5xx."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import pair_settings

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("ray") is None and not (Path(sys.executable).parent / "ray").exists(),
                                                   reason="Ray is not installed (extra [ray])")]

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head and a second node on this machine (addressed as 127.0.0.1); yields the head's address. Each `ray start --block` is our
    child in its own session: stopping it (SIGTERM, then its group) stops exactly the processes it began."""
    # Token authentication with a token of this test's own: a ~/.ray/auth_token left by another Ray user on the
    # machine otherwise makes the GCS ask for a token the driver does not send (seen here).
    # Ray reads a process's token once: when an earlier test of this process already ran Ray with the
    # token file, the cluster must use that token, so the file's token is reused when there is one.
    token_file = Path.home() / ".ray" / "auth_token"
    token = token_file.read_text().strip() if token_file.is_file() else ""
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token or secrets.token_hex(32)}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--node-ip-address", "127.0.0.1", "--block", "--disable-usage-stats"]
    procs: list[subprocess.Popen] = []
    temp = Path(f"/tmp/ltdr{os.getpid()}")  # short: Ray's socket paths must fit 107 bytes
    try:
        for _ in range(3):  # a port found free may be taken before Ray binds it (other jobs share the machine)
            port = _free_port()
            head = subprocess.Popen([RAY, "start", "--head", "--port", str(port), "--num-cpus", "1",
                                     "--include-dashboard", "false", "--temp-dir", str(temp), *common], env=env,
                                    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(head)
            _wait_for(lambda h=head, p=port: h.poll() is not None or _up(p), 90, "the Ray head")
            time.sleep(2)
            if head.poll() is None:  # ours is the one listening
                break
        node = subprocess.Popen([RAY, "start", "--address", f"127.0.0.1:{port}", "--num-cpus", "1", *common], env=env,
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(node)
        import ray

        ray.init(address=f"127.0.0.1:{port}", _node_ip_address="127.0.0.1", log_to_driver=False)
        _wait_for(lambda: len([n for n in ray.nodes() if n["Alive"]]) == 2, 90, "the second node")
        # Both nodes on this machine. Ray 2.60 rewrites 127.0.0.1 to the machine's own address
        # (services.resolve_ip_for_localhost), so its gRPC ports are not loopback-only: docs/guides/cluster.md.
        assert len({n["NodeManagerAddress"] for n in ray.nodes()}) == 1
        yield f"127.0.0.1:{port}"
    finally:
        try:
            from ray import serve

            serve.shutdown()
        except Exception:  # noqa: BLE001 - the cluster may not have started
            pass
        import ray

        ray.shutdown()
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # whatever that session still holds
            except ProcessLookupError:
                pass
        shutil.rmtree(temp, ignore_errors=True)
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _up(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_for(ok, seconds: float, what: str) -> None:
    end = time.time() + seconds
    while time.time() < end:
        if ok():
            return
        time.sleep(0.5)
    raise TimeoutError(f"{what} did not come up in {seconds:.0f} s")


def _ranked(resp) -> list[tuple[int, float]]:
    assert resp.status_code == 200, resp.text
    return [(h["id"], round(h["score"], 4)) for h in resp.json()["results"]]


def test_a_sharded_index_on_ray_answers_as_one_process_and_survives_a_killed_replica(cluster, tiny_index_pair,
                                                                                     tmp_path):
    import ray
    from fastapi.testclient import TestClient

    from app.api.main import create_app
    from indexer.index import load_index_dir
    from indexer.shards_index import shard_index_dir
    from indexer.shards_ray import RayShardEngine

    one = Path(tiny_index_pair["bl"])
    sharded = one.with_name("bl_sharded_ray")
    if not sharded.exists():
        shutil.copytree(one, sharded)
        shard_index_dir(sharded, 2, "id")
    settings = pair_settings({"bl": one, "ltd": sharded})  # "ltd" here: the same index, sharded
    svc = settings.search_service()
    engine = RayShardEngine(1, timeout=1.5, probe_s=2.0)  # a shard a failed call marked down stays so till the probe
    svc.registry.shard_engine = engine
    queries = ["a red square", "a blue circle on the left", "green triangle", "two shapes"]
    with TestClient(create_app(settings, service=svc)) as client:
        assert client.get("/api/health").json()["status"] == "ok"
        for q in queries:
            a = client.post("/api/search/text", json={"query": q, "model": "bl", "k": 10})
            b = client.post("/api/search/text", json={"query": q, "model": "ltd", "k": 10})
            assert _ranked(a) == _ranked(b) and b.json()["partial"] is False
        image_id = load_index_dir(one).images.ids[0]
        ia = client.post("/api/search/image", json={"image_id": image_id, "model": "bl", "k": 5})
        ib = client.post("/api/search/image", json={"image_id": image_id, "model": "ltd", "k": 5})
        assert _ranked(ia) == _ranked(ib)

        shard0 = set(load_index_dir(one).images.ids[0::2])  # by id: shard 0 holds the even rows
        shards = engine.deployed[0]
        name = shards.handles[1].actor_name.remote().result(timeout_s=30)
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)  # shard 1's only replica
        seen_partial = seen_degraded = whole_again = False
        end = time.time() + 120
        while time.time() < end and not whole_again:
            r = client.post("/api/search/text", json={"query": queries[0], "model": "ltd", "k": 10})
            assert r.status_code == 200, r.text  # never a 5xx
            body = r.json()
            health = client.get("/api/health")
            assert health.status_code == 200
            if body["partial"]:
                seen_partial = True
                assert body["missing_shards"] == [1]
                assert body["results"] and {h["id"] for h in body["results"]} <= shard0  # the rest still answers
            if health.json()["status"] == "degraded":
                seen_degraded = True
                assert health.json()["shards_down"] == {"ltd": [1]}
            whole_again = seen_partial and not body["partial"] and health.json()["status"] == "ok"
            time.sleep(0.3)
        assert seen_partial and seen_degraded, "the killed replica's shard was never reported missing"
        assert whole_again, "Ray Serve did not replace the killed replica within 120 s"
        a = client.post("/api/search/text", json={"query": queries[1], "model": "bl", "k": 10})
        b = client.post("/api/search/text", json={"query": queries[1], "model": "ltd", "k": 10})
        assert _ranked(a) == _ranked(b)
    shards.close(delete=True)


def test_a_new_generation_on_ray_drops_no_request(cluster, tiny_index_pair, tmp_path):
    """A rolling change of index generation: items added through the front, then a compaction whose
    new shards Ray Serve deploys while queries keep coming — every answer 200 and whole, the front on
    the new generation after, the old generation's applications deleted once retired."""
    import threading

    from fastapi.testclient import TestClient
    from ray import serve
    from test_living_index import png

    from app.api.main import create_app
    from indexer import image_roots
    from indexer.index import read_manifest
    from indexer.shards_index import shard_index_dir
    from indexer.shards_ray import RayShardEngine

    sharded = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "ltd")
    shard_index_dir(sharded, 2, "id")
    image_roots.record(sharded, read_manifest(sharded)["image_roots"])
    settings = pair_settings({"bl": tiny_index_pair["bl"], "ltd": sharded}, writable=True, compact_after=0)
    svc = settings.search_service()
    engine = RayShardEngine(1, timeout=5.0, probe_s=0.5, retire_s=2.0)
    svc.registry.shard_engine = engine
    answers: list[tuple[int, bool]] = []
    stop = threading.Event()
    with TestClient(create_app(settings, service=svc)) as client:
        gen0 = svc.registry.get("ltd").generation
        old_apps = set(engine.deployed[-1].names)

        def traffic() -> None:
            while not stop.is_set():
                r = client.post("/api/search/text", json={"query": "a red square", "model": "ltd", "k": 10})
                answers.append((r.status_code, r.status_code == 200 and r.json()["partial"]))
        t = threading.Thread(target=traffic)
        t.start()
        try:
            r = client.post("/api/models/ltd/items", files=[("file", ("new.png", png(41), "image/png"))])
            assert r.status_code == 201, r.text
            new_id = r.json()["items"][0]["id"]
            assert client.post("/api/models/ltd/compact").status_code == 202
            _wait_for(lambda: svc.registry.get("ltd").generation > gen0, 120, "the new generation")
            time.sleep(1.0)
        finally:
            stop.set()
            t.join(30)
        assert len(answers) > 10 and all(code == 200 and not partial for code, partial in answers), answers[-5:]
        hit = client.post("/api/search/similar", json={"model": "ltd", "image_id": new_id, "k": 1}).json()
        assert hit["results"][0]["id"] == new_id and hit["partial"] is False  # served by the new shards
        assert client.get("/api/health").json()["status"] == "ok"
        _wait_for(lambda: not old_apps & set(serve.status().applications), 60, "the old generation's retirement")
    for d in engine.deployed:
        d.close(delete=True)


@pytest.mark.parametrize("by", ["list", "id"])
def test_sharded_ivfpq_on_ray_keeps_the_unsharded_recall(cluster, tmp_path, by):
    """IVF-PQ split in 2 and served by Ray Serve replicas: recall@10 within 0.01 of the one-process index,
    and the answers those of the same shards searched in this process (Ray moves them, it does not change them)."""
    import numpy as np
    from test_sharded_index import _recall, clustered, make_index

    from indexer.index import load_index_dir
    from indexer.shards_index import shard_index_dir
    from indexer.shards_ray import RayShardEngine
    from search.sharded import load_sharded

    one, many = tmp_path / "one", tmp_path / "many"
    make_index(one, 3000, 600, factory="IVF32,PQ8x4", d=32)
    make_index(many, 3000, 600, factory="IVF32,PQ8x4", d=32)
    shard_index_dir(many, 2, by)
    a, local = load_index_dir(one), load_sharded(many)
    engine = RayShardEngine(1, timeout=30.0, probe_s=0)
    on_ray = load_sharded(many, engine=engine)
    try:
        q = clustered(200, 32, 11)
        truth = np.argsort(-(q @ np.asarray(a.images.vectors).T), axis=1)[:, :10]
        r_one = _recall(a.images.index.search(q, 10)[1], truth)
        s_ray, rows_ray = on_ray.images.index.search(q, 10)
        assert _recall(rows_ray, truth) >= r_one - 0.01, (r_one, _recall(rows_ray, truth))
        s_local, rows_local = local.images.index.search(q, 10)
        np.testing.assert_array_equal(rows_ray, rows_local)
        np.testing.assert_allclose(s_ray, s_local, rtol=1e-5, atol=1e-6)
    finally:
        for shards in engine.deployed:
            shards.close(delete=True)


def test_replicas_replaced_under_concurrent_load_drop_no_request(cluster, tiny_index_pair, tmp_path):
    """Two shards × 2 replicas under two concurrent clients: one replica killed (Serve routes around it and
    replaces it), then every replica replaced by a rolling update (a redeploy with new arguments, as new
    code would be) — every answer 200 and whole throughout, the same top-k as one process after."""
    import threading

    import ray
    from fastapi.testclient import TestClient

    from app.api.main import create_app
    from indexer.shards_index import open_sharded, shard_index_dir
    from indexer.shards_ray import RayShardEngine

    sharded = shutil.copytree(tiny_index_pair["bl"], tmp_path / "bl2")
    shard_index_dir(sharded, 2, "id")
    settings = pair_settings({"bl": tiny_index_pair["bl"], "ltd": sharded})
    svc = settings.search_service()
    engine = RayShardEngine(2, timeout=10.0, probe_s=0.5)
    svc.registry.shard_engine = engine
    answers: list[tuple[int, bool]] = []
    stop = threading.Event()
    with TestClient(create_app(settings, service=svc)) as client:
        want = _ranked(client.post("/api/search/text", json={"query": "a red square", "model": "bl", "k": 10}))
        assert _ranked(client.post("/api/search/text", json={"query": "a red square", "model": "ltd", "k": 10})) == want

        def traffic() -> None:
            while not stop.is_set():
                r = client.post("/api/search/text", json={"query": "a red square", "model": "ltd", "k": 10})
                answers.append((r.status_code, r.status_code == 200 and not r.json()["partial"]))
        clients = [threading.Thread(target=traffic) for _ in range(2)]
        for t in clients:
            t.start()
        try:
            time.sleep(1.0)
            shards = engine.deployed[0]
            ray.kill(ray.get_actor(shards.handles[1].actor_name.remote().result(timeout_s=30), namespace="serve"),
                     no_restart=True)  # one of shard 1's two replicas
            time.sleep(3.0)
            engine(open_sharded(sharded), verify="counts")  # new init arguments: Serve replaces every replica in turn
            time.sleep(2.0)
        finally:
            stop.set()
            for t in clients:
                t.join(30)
        assert len(answers) > 20, len(answers)
        assert all(code == 200 for code, _ in answers), "never a 5xx"
        lost = sum(not whole for _, whole in answers)
        assert lost == 0, f"{lost} of {len(answers)} answers were partial"
        assert _ranked(client.post("/api/search/text", json={"query": "a red square", "model": "ltd", "k": 10})) == want
    for d in engine.deployed:
        d.close(delete=True)
