"""Issue 35's attacks on an exposed server, in process (FastAPI's TestClient: no sockets at all).

Each test is written as the attack it stops; the live attacks (slow clients, descriptor exhaustion,
worker processes, Gradio's queue) are in tests/test_security_live.py and test_slow_clients.py.
"""
from __future__ import annotations

import io
import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import pair_settings
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.api.settings import Settings
from indexer import image_roots
from indexer.index import read_manifest
from search import SearchService

ABS_PATH = re.compile(r"(?<![\w.])/(?:tmp|home|root|work|etc|usr|var|opt)/")


_settings = pair_settings


@pytest.fixture(scope="module")
def service(pair_service) -> SearchService:
    return pair_service


@pytest.fixture(scope="module")
def client(tiny_index_pair, service):
    with TestClient(create_app(_settings(tiny_index_pair), service=service)) as c:
        yield c


def _copy_index(pair: dict, name: str, tmp_path: Path) -> Path:
    out = tmp_path / f"{name}-copy"
    shutil.copytree(pair[name], out)
    return out


# ---- 9: a deeply nested manifest.json is one model down, not a crashed server ----------------------
def test_a_deeply_nested_manifest_is_one_model_down(tiny_index_pair, tmp_path):
    from app.cli.serve import preflight
    from indexer.index import IndexDirError, read_manifest

    broken = _copy_index(tiny_index_pair, "ltd", tmp_path)
    (broken / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(IndexDirError, match="nested too deeply"):
        read_manifest(broken)
    odd = _copy_index(tiny_index_pair, "bl", tmp_path / "odd")
    (odd / "manifest.json").write_text(json.dumps({"checkpoint_relative": 7, "checkpoint": ["x"]}))
    settings = _settings(tiny_index_pair, models={"bl": str(tiny_index_pair["bl"]), "ltd": str(broken),
                                                  "odd": str(odd)}, ui=True)
    assert set(preflight(settings)) == {"ltd", "odd"}  # reported, not raised
    app = create_app(settings)  # the UI mount reads every manifest too
    with TestClient(app) as c:
        h = c.get("/api/health")
        assert h.status_code == 200 and h.json()["status"] == "degraded" and h.json()["loaded"] == ["bl"]
        assert "nested too deeply" in h.json()["down"]["ltd"]
        assert c.post("/api/search/text", json={"query": "a red square", "model": "bl"}).status_code == 200


def _forge(index: Path, key: str, data: bytes) -> None:
    """Replace one data file of an index and recompute its manifest entry, as someone with write access
    to the folder would: the hash check passes, so the loader itself meets the broken bytes."""
    from training.fsio import sha256_file

    mf = json.loads((index / "manifest.json").read_text())
    entry = mf["files"][key]
    (index / entry["file"]).write_bytes(data)
    entry["bytes"], entry["sha256"] = len(data), sha256_file(index / entry["file"])
    (index / "manifest.json").write_text(json.dumps(mf))


BREAKAGES = {  # name → how a copy of the ltd index is broken
    "torn faiss": lambda ix: _forge(ix, "images.faiss", (ix / _entry(ix, "images.faiss")).read_bytes()[:100]),
    "npy that asks for pickle": lambda ix: _forge(ix, "captions.npy", _pickled_npy()),
    "meta not json": lambda ix: _forge(ix, "images.json", b"\xff\xfe{not json"),
    "meta of the wrong shape": lambda ix: _forge(ix, "captions.json", b'{"ids": 7, "texts": null}'),
    "manifest a list": lambda ix: (ix / "manifest.json").write_text("[1, 2]"),
    "data file hash differs": lambda ix: (ix / _entry(ix, "captions.npy")).write_bytes(b"\0" * 64),
    "checkpoint garbage": lambda ix: _forge_checkpoint(ix, b"PK\x03\x04 not a zip" * 10),
}


def _pickled_npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array([{"x": 1}, "y"], dtype=object), allow_pickle=True)
    return buf.getvalue()


def _entry(index: Path, key: str) -> str:
    return json.loads((index / "manifest.json").read_text())["files"][key]["file"]


def _forge_checkpoint(index: Path, data: bytes) -> None:
    from training.fsio import sha256_file

    ckpt = index.parent / "forged.pt"
    ckpt.write_bytes(data)
    mf = json.loads((index / "manifest.json").read_text())
    mf["checkpoint"], mf["checkpoint_relative"], mf["checkpoint_sha256"] = str(ckpt), "../forged.pt", sha256_file(ckpt)
    (index / "manifest.json").write_text(json.dumps(mf))


def test_a_broken_model_of_any_kind_is_down_and_the_other_serves(tiny_index_pair, tmp_path):
    models = {"bl": str(tiny_index_pair["bl"])}
    for k, breaks in enumerate(BREAKAGES.values()):
        broken = _copy_index(tiny_index_pair, "ltd", tmp_path / str(k))
        breaks(broken)
        models[f"broken{k}"] = str(broken)
    svc = SearchService(models)
    svc.registry.load()
    with TestClient(create_app(_settings(tiny_index_pair), service=svc)) as c:
        h = c.get("/api/health")
        assert h.status_code == 200 and h.json()["loaded"] == ["bl"], h.text
        assert sorted(h.json()["down"]) == sorted(set(models) - {"bl"}), h.text
        assert str(tmp_path) not in h.text and not ABS_PATH.search(h.text) and "Traceback" not in h.text, h.text
        assert c.post("/api/search/text", json={"query": "a red square", "model": "bl"}).status_code == 200
        r = c.post("/api/search/text", json={"query": "a red square", "model": "broken0"})
        assert r.status_code == 503 and str(tmp_path) not in r.text
    svc.close()


# ---- 8: errors say what, never where ----------------------------------------------------------------
def test_health_and_errors_name_no_server_folders(tiny_index_pair, tmp_path):
    """/api/health is open to anyone (load balancers): its reasons must not map the server's disk."""
    gone = _copy_index(tiny_index_pair, "ltd", tmp_path)
    mf = json.loads((gone / "manifest.json").read_text())
    mf["checkpoint"], mf["checkpoint_relative"] = "/srv/secret/place/best.pt", "../nowhere/best.pt"
    (gone / "manifest.json").write_text(json.dumps(mf))
    svc = SearchService({"bl": str(tiny_index_pair["bl"]), "ltd": str(gone)})
    svc.registry.load()
    with TestClient(create_app(_settings(tiny_index_pair), service=svc)) as c:
        h = c.get("/api/health")
        down = h.json()["down"]["ltd"]
        assert "checkpoint" in down and "best.pt" in down and "@" in down  # what is wrong, and the fix
        assert str(tmp_path) not in h.text and "/srv/secret" not in h.text and not ABS_PATH.search(h.text), h.text
        r = c.post("/api/search/text", json={"query": "a red square", "model": "ltd"})
        assert r.status_code == 503 and "ltd is down" in r.json()["detail"]
        assert str(tmp_path) not in r.text and "/srv/secret" not in r.text
    svc.close()


# ---- 11 (smaller): the token's edges ----------------------------------------------------------------
TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def guarded(tiny_index_pair, service):
    with TestClient(create_app(_settings(tiny_index_pair, api_token=TOKEN), service=service)) as c:
        yield c


def test_open_paths_are_matched_exactly(guarded):
    assert guarded.get("/api/health").status_code == 200
    for path in ("/api/healthz", "/api/health-secret", "/loginx", "/login/../api/models", "/api/health/../models"):
        assert guarded.get(path).status_code == 401, path


def test_wrong_tokens_are_rate_limited(guarded):
    """A guesser gets 20 tries a minute per address; then the address is locked: one credential is looked
    at every 3 s, every other request is answered 429 unread, and a wrong guess is answered 429 as well.
    The right token still gets in (issue 53: a locked-out user who finds it is never kept out), and is
    then forgiven. Health stays open (load balancers)."""
    for _ in range(20):
        assert guarded.get("/api/models", headers={"Authorization": "Bearer guess"}).status_code == 401
    r = guarded.get("/api/models", headers={"Authorization": "Bearer guess"})  # looked at: wrong
    assert r.status_code == 429 and r.json()["error"] == "too_many_requests" and int(r.headers["retry-after"]) > 0
    assert guarded.get("/api/models", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 429  # not read
    assert guarded.post("/login", data={"token": TOKEN}).status_code == 429
    assert guarded.get("/api/health").status_code == 200
    time.sleep(3.1)
    assert guarded.get("/api/models", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert guarded.get("/api/models", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200  # forgiven


def test_the_failure_window_slides_and_is_per_address():
    from app.api.login import FailureLimiter

    lim = FailureLimiter(max_failures=3, window=60, max_clients=2)
    for t in (0, 1, 2):
        lim.failed("a", now=100 + t)
    assert lim.blocked_for("a", now=103) == pytest.approx(57) and lim.blocked_for("b", now=103) == 0
    assert lim.blocked_for("a", now=160.5) == 0  # the first failure left the window
    lim.failed("b", now=104), lim.failed("c", now=105)
    assert "a" not in lim._fails  # bounded: the oldest address is forgotten


def test_login_cookie_is_signed_salted_and_expires(guarded):
    import hashlib

    from app.api.login import Sessions

    cookies = [guarded.post("/login", data={"token": TOKEN}, follow_redirects=False).cookies.get("ltd_token")
               for _ in range(2)]
    assert cookies[0] != cookies[1] and all(TOKEN not in c for c in cookies)  # a random salt per login
    r = guarded.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert "max-age=43200" in r.headers["set-cookie"].lower()
    guarded.cookies.clear()  # each request below names its own cookie
    assert guarded.get("/api/models", cookies={"ltd_token": cookies[0]}).status_code == 200
    old_style = hashlib.sha256(f"ltd-ui-session:{TOKEN}".encode()).hexdigest()  # an early, unsalted cookie
    nonce, stamp, mac = cookies[0].split(".")  # itsdangerous: value.timestamp.signature
    expired = Sessions(TOKEN, 60).make(now=1_000_000)
    later = Sessions(TOKEN, 60).make(now=2_000_000_000).split(".")[1]  # a timestamp in 2033
    for bad in (old_style, f"{nonce}.{later}.{mac}", f"{nonce[::-1]}.{stamp}.{mac}", expired,
                Sessions("other", 60).make()):
        assert guarded.get("/api/models", cookies={"ltd_token": bad}).status_code == 401, bad


# ---- 2: every body capped by its type -------------------------------------------------------------
@pytest.mark.parametrize("path", ["/api/caption", "/api/caption/check", "/api/search/image", "/api/compare"])
def test_json_on_upload_routes_is_capped_at_the_json_limit(client, path):
    """The attack: a 10 MB JSON body on a route that also takes uploads was read whole and parsed on the
    event loop. JSON gets the JSON limit everywhere (declared or streamed without a length)."""
    big = b'{"image_id": 1, "pad": "' + b"x" * (1024 * 1024) + b'"}'
    r = client.post(path, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large", r.text[:200]

    def stream():
        yield b'{"image_id": 1, "pad": "'
        for _ in range(16):
            yield b"x" * 65536
        yield b'"}'

    r = client.post(path, content=stream(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    r = client.post(path, content=big, headers={"content-type": "text/plain"})  # any other type: JSON limit
    assert r.status_code == 413


def test_body_limits_by_path_and_type():
    from app.api.limits import body_limits

    s = Settings(max_upload_bytes=10 * 2**20, max_json_bytes=64 * 1024, max_ui_json_bytes=256 * 1024)
    limit = body_limits(s)
    mp = b"multipart/form-data; boundary=x"
    assert limit("/api/search/image", mp) > 10 * 2**20 and limit("/ui/gradio_api/upload", mp) > 10 * 2**20
    assert limit("/api/search/image", b"application/json") == 64 * 1024
    assert limit("/api/caption/anything", mp) == 64 * 1024  # exact paths, not prefixes
    assert limit("/api/search/text", mp) == 64 * 1024
    assert limit("/ui/gradio_api/queue/join", mp) == 256 * 1024


# ---- found on the way: concurrent first uploads hung the server --------------------------------------
def test_image_runtimes_are_built_before_requests_arrive(tiny_index_pair):
    """8 concurrent uploads to a fresh server deadlocked it in 2 of 5 tries (OpenVINO's bindings, first
    called from several threads at once, wait with the GIL held): loading now runs each backbone once."""
    from search.registry import load_entry

    entry = load_entry("bl", Path(tiny_index_pair["bl"]))
    assert entry.model.image.backbone._runners  # built by the loader, not by the first request


# ---- 10: a client that goes away mid-upload is not a 500 ------------------------------------------
def _abandoned_upload(app, path: str, field: str) -> list[dict]:
    """Drive the app as uvicorn would for a client that sends half a multipart upload and disconnects;
    the messages the app sends back."""
    import anyio

    boundary = "b0undary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"x.jpg\"\r\n"
            "Content-Type: image/jpeg\r\n\r\n").encode() + b"\xff\xd8\xff" + b"\0" * 200_000
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", f"multipart/form-data; boundary={boundary}".encode()),
                         (b"content-length", b"1000000")],
             "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 8000), "state": {}}
    chunks = [{"type": "http.request", "body": head, "more_body": True}]
    sent: list[dict] = []

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    anyio.run(app, scope, receive, send)  # raises if the error escaped to the server
    return sent


def test_an_abandoned_upload_is_a_499_not_a_500(tiny_index_pair, service, caplog):
    app = create_app(_settings(tiny_index_pair, ui=True), service=service)
    for path, field in (("/api/search/image", "file"), ("/ui/gradio_api/upload", "files")):
        with caplog.at_level("INFO"):
            sent = _abandoned_upload(app, path, field)
        assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [499], (path, sent)
        assert "the client went away" in caplog.text and "Traceback" not in caplog.text
        caplog.clear()
    metrics = TestClient(app).get("/metrics").text
    assert 'status="499"' in metrics and not re.search(r'status="5\d\d"', metrics)


# ---- 7: files served are files the index owns ----------------------------------------------------
def _rewrite_images_meta(index: Path, edit, legacy: bool = False) -> None:
    """Change an index's images.json and recompute the manifest's size and sha256 for it, as an attacker
    with write access to the index folder would; ``legacy``: also drop the recorded image folders, as in
    an index written before they were recorded."""
    from training.fsio import sha256_file

    mf = json.loads((index / "manifest.json").read_text())
    entry = mf["files"]["images.json"]
    meta_path = index / entry["file"]
    meta = json.loads(meta_path.read_text())
    edit(meta)
    meta_path.write_text(json.dumps(meta))
    entry["bytes"], entry["sha256"] = meta_path.stat().st_size, sha256_file(meta_path)
    if legacy:
        mf.pop("image_roots", None)
    (index / "manifest.json").write_text(json.dumps(mf))


@pytest.mark.parametrize("legacy", [False, True])
def test_a_crafted_index_cannot_serve_other_files(tiny_index_pair, tmp_path, legacy):
    """images.json naming /etc/passwd (hashes recomputed): refused. With its image folders in the manifest,
    nothing outside them is served; an old index (no folders in its manifest: they are read from its
    image paths, the planted ones included) serves only what the operator's record allows."""
    crafted = _copy_index(tiny_index_pair, "bl", tmp_path)
    ids_paths = {}

    def plant(meta):
        root = Path(meta["paths"][0]).parent
        secret = tmp_path / "secret.jpg"
        secret.write_bytes(b"\xff\xd8\xff" + b"SECRET" * 10)  # an 'image' outside the images folder
        link = tmp_path / "link-to-passwd.jpg"
        link.symlink_to("/etc/passwd")
        text = tmp_path / "notes.txt"
        text.write_text("root:x:0:0:SECRET")
        attacks = ["/etc/passwd", str(link), str(text)]
        if not legacy:  # outside the recorded folders, however it is named
            attacks += [str(secret), f"{root}/../../{secret.name}"]
        for k, p in enumerate(attacks, start=1):
            meta["paths"][k] = p
            ids_paths[meta["ids"][k]] = p
        ids_paths["good"] = meta["ids"][0]

    good_folder = read_manifest(crafted)["image_roots"]
    _rewrite_images_meta(crafted, plant, legacy=legacy)
    image_roots.record(crafted, good_folder)  # what `ltd index` recorded when it was given the images folder
    svc = SearchService({"bl": str(crafted)})
    svc.registry.load()
    with TestClient(create_app(_settings(tiny_index_pair, models={"bl": str(crafted)}), service=svc)) as c:
        assert c.get(f"/api/images/{ids_paths.pop('good')}").headers["content-type"] == "image/jpeg"
        for image_id, planted in ids_paths.items():
            for url in (f"/api/images/{image_id}", f"/api/images/{image_id}/thumbnail"):
                r = c.get(url)
                assert r.status_code == 404 and "SECRET" not in r.text and "root:" not in r.text, (planted, r.text)
                assert str(tmp_path) not in r.text
    svc.close()


def test_only_image_files_are_served(tmp_path):
    from search import NotFound
    from search.files import servable_image

    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0rest")
    assert servable_image(tmp_path / "a.jpg", "image 1") == tmp_path / "a.jpg"
    (tmp_path / "fake.png").write_text("not a png")
    (tmp_path / "dir.jpg").mkdir()
    for bad in (Path("/etc/passwd"), tmp_path / "fake.png", tmp_path / "dir.jpg", tmp_path / "gone.jpg"):
        with pytest.raises(NotFound):
            servable_image(bad, "image 2")


# ---- 6: the thumbnail folder is private ------------------------------------------------------------
def test_thumbnail_folder_is_private_and_planted_links_are_not_followed(tmp_path, monkeypatch):
    import os
    import stat

    from PIL import Image

    from search.media import Thumbnails, default_thumb_dir

    monkeypatch.delenv("LTD_UI_THUMBS", raising=False)
    assert default_thumb_dir().is_relative_to(os.environ["LTD_CACHE_DIR"])  # not a shared /tmp name
    image = tmp_path / "image.jpg"
    Image.new("RGB", (80, 60), (10, 200, 30)).save(image)
    thumbs = Thumbnails(folder=tmp_path / "thumbs")
    out = thumbs.file(("bl", 1), image, 64)
    assert stat.S_IMODE(os.stat(tmp_path / "thumbs").st_mode) == 0o700 and out.parent == tmp_path / "thumbs"
    # a link planted under the file's name is replaced, never followed (nor its target overwritten)
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    out.unlink()
    out.symlink_to(target)
    again = Thumbnails(folder=tmp_path / "thumbs").file(("bl", 1), image, 64)
    assert again == out and not out.is_symlink() and target.read_text() == "keep me"
    # a folder prepared by someone else (a link, open to others, another owner) is not used
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "open").mkdir(mode=0o777)
    os.chmod(tmp_path / "open", 0o777)
    bad = [tmp_path / "linked", tmp_path / "open"]
    if os.geteuid() == 0:
        (tmp_path / "theirs").mkdir(mode=0o700)
        os.chown(tmp_path / "theirs", 12345, 12345)
        bad.append(tmp_path / "theirs")
    for folder in bad:
        used = Thumbnails(folder=folder).file(("bl", 1), image, 64).parent
        assert used != folder and not used.is_relative_to(folder.resolve()), folder
        assert stat.S_IMODE(os.stat(used).st_mode) == 0o700
    assert not any((tmp_path / "elsewhere").iterdir())
