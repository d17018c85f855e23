#!/usr/bin/env bash
# `make docker-check`: the container is part of the product. Builds the image from BASE_IMAGE, runs
# `ltd demo` in it as its non-root user, then `ltd serve` on the demo's indexes, and checks each:
# /api/health, a text search, an image upload and the UI page (with the token it was started with).
#
#   make docker-check                                   # BASE_IMAGE=python:3.11-slim, pulled
#   make docker-check BASE_IMAGE=ltd-base:bookworm      # a local base (docker/local-base.sh)
#
# When BASE_IMAGE is the default and cannot be pulled (no registry access), a local Debian base is
# built with docker/local-base.sh (root and debootstrap needed). When no Docker daemon answers and
# this runs as root with dockerd installed, one is started for the check and stopped afterwards.
# Environment: BASE_IMAGE, IMAGE (tag to build, default ltd:check), DEMO_ARGS (default: 600 scenes,
# one epoch per model, one thread: a smoke test of the machinery, not of the results, that also
# finishes on a busy machine), WAIT_MINUTES for the demo to serve (default 60), PORT (default 18000),
# KEEP=1 (leave the container running).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}
IMAGE=${IMAGE:-ltd:check}
DEMO_ARGS=${DEMO_ARGS:---set data.synthetic_images=600 --set train.epochs=1 --set train.num_threads=1 --no-progress}
WAIT_MINUTES=${WAIT_MINUTES:-60}
PORT=${PORT:-18000}
NAME=ltd-check-$$
TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
export DOCKER_BUILDKIT=0  # the classic builder: BuildKit would pull its Dockerfile frontend image
t0=$(date +%s)
say() { printf '== [%4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }
fail() { echo "docker-check: FAILED: $*" >&2; docker logs --tail 60 "$NAME" >&2 2>&1 || true; exit 1; }

# ---- a daemon --------------------------------------------------------------------------------------
started_dockerd=
cleanup() {
  [ -n "${KEEP:-}" ] || docker rm -f "$NAME" >/dev/null 2>&1 || true
  if [ -n "$started_dockerd" ]; then kill "$started_dockerd" 2>/dev/null || true; fi
}
trap cleanup EXIT
if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null; then
    say "starting dockerd (overlay2) for the check"
    dockerd --storage-driver overlay2 >/tmp/ltd-docker-check-dockerd.log 2>&1 &
    started_dockerd=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  fi
  docker info >/dev/null 2>&1 || { echo "docker-check: no Docker daemon (install docker.io, start dockerd)" >&2; exit 2; }
fi

# ---- base and image --------------------------------------------------------------------------------
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && ! docker pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
  if [ "$BASE_IMAGE" = "python:3.11-slim" ]; then
    BASE_IMAGE=ltd-base:bookworm
    say "python:3.11-slim cannot be pulled: building a local base ($BASE_IMAGE, docker/local-base.sh)"
    docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || docker/local-base.sh "$BASE_IMAGE"
  else
    echo "docker-check: base image $BASE_IMAGE is neither here nor pullable" >&2; exit 2
  fi
fi
say "docker build from $BASE_IMAGE"
docker build --network host --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$IMAGE" . >/tmp/ltd-docker-check-build.log 2>&1 \
  || { tail -40 /tmp/ltd-docker-check-build.log >&2; fail "docker build (log: /tmp/ltd-docker-check-build.log)"; }
say "built $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.1f GB", $1/1e9}'))"

# ---- the checks, run from the host (loopback only) --------------------------------------------------
probe() {  # probe URL_BASE: health, text search, image upload, UI page
  python3 - "$1" "$TOKEN" <<'EOF'
import io, json, sys, urllib.request, uuid, zlib, struct
base, token = sys.argv[1], sys.argv[2]
auth = {"Authorization": f"Bearer {token}"}
def call(path, data=None, headers=None):
    req = urllib.request.Request(base + path, data=data, headers={**auth, **(headers or {})})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, r.headers.get("content-type", ""), r.read()
def png(w=64, h=48):  # a real PNG without PIL on the host
    raw = b"".join(b"\0" + bytes([200, 40, 40]) * w for _ in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
st, _, body = call("/api/health"); health = json.loads(body)
assert st == 200 and health["status"] == "ok", health
st, _, body = call("/api/search/text", json.dumps({"query": "a red circle", "k": 5}).encode(),
                   {"Content-Type": "application/json"})
hits = json.loads(body)["results"]; assert st == 200 and len(hits) == 5, body[:300]
b = uuid.uuid4().hex
form = (f"--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"red.png\"\r\n"
        "Content-Type: image/png\r\n\r\n").encode() + png() + f"\r\n--{b}--\r\n".encode()
st, _, body = call("/api/search/image", form, {"Content-Type": f"multipart/form-data; boundary={b}"})
caps = json.loads(body)["results"]; assert st == 200 and caps and caps[0]["text"], body[:300]
st, ctype, body = call("/ui/", headers={"Accept": "text/html"})
assert st == 200 and "text/html" in ctype and b"LTD retrieval" in body, body[:300]
try:
    urllib.request.urlopen(base + "/api/models", timeout=30); raise AssertionError("/api/models without the token")
except urllib.error.HTTPError as e:
    assert e.code == 401, e.code
print(f"   health ok ({', '.join(health['loaded'])}); text search: 5 hits; upload: {len(caps)} captions; "
      "UI page; 401 without the token")
EOF
}
wait_healthy() {  # wait_healthy URL MINUTES: polls every 5 s, shows the container's last log line each minute
  local deadline=$(( $(date +%s) + 60 * $2 )) shown=0
  while [ "$(date +%s)" -lt "$deadline" ]; do
    code=$(python3 -c "import sys,urllib.request
try: print(urllib.request.urlopen(sys.argv[1] + '/api/health', timeout=5).status)
except Exception as e: print(getattr(e, 'code', 0))" "$1")
    [ "$code" = 200 ] && return 0
    docker inspect -f '{{.State.Running}}' "$NAME" 2>/dev/null | grep -q true || fail "the container stopped"
    if [ $(( $(date +%s) - shown )) -ge 60 ]; then
      shown=$(date +%s); say "  … $(docker logs --tail 1 "$NAME" 2>&1 | cut -c1-110)"
    fi
    sleep 5
  done
  fail "no healthy server at $1 after $2 min"
}

say "docker run: ltd demo $DEMO_ARGS (as the image's user; the token from the environment)"
docker run -d --name "$NAME" -p "127.0.0.1:$PORT:8000" -e LTD_API_TOKEN="$TOKEN" "$IMAGE" \
  demo --host 0.0.0.0 --expose --port 8000 $DEMO_ARGS >/dev/null
[ "$(docker exec "$NAME" id -u)" != 0 ] || fail "the container runs as root"
wait_healthy "http://127.0.0.1:$PORT" "$WAIT_MINUTES"
say "ltd demo serves: probing it"
probe "http://127.0.0.1:$PORT" || fail "probe of ltd demo"

say "ltd serve on the demo's indexes (second port inside the container, probed from inside)"
idx=$(docker exec "$NAME" sh -c 'ls -d demo/*/indexes/* demo/indexes/* 2>/dev/null | head -2')
[ -n "$idx" ] || fail "no index folders under demo/"
models=$(for d in $idx; do printf -- '--model %s=%s ' "$(basename "$d")" "$d"; done)
docker exec -d -e LTD_API_TOKEN="$TOKEN" "$NAME" sh -c "ltd serve $models --port 8001 >serve.log 2>&1"
for _ in $(seq 60); do
  docker exec "$NAME" python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8001/api/health', timeout=5)" \
    >/dev/null 2>&1 && break
  sleep 3
done
docker exec -e TOKEN="$TOKEN" "$NAME" python -c "
import json, os, urllib.request
t = os.environ['TOKEN']
r = urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:8001/api/search/text',
    json.dumps({'query': 'a blue square', 'k': 3}).encode(), {'Content-Type': 'application/json',
    'Authorization': 'Bearer ' + t}), timeout=60)
h = json.loads(urllib.request.urlopen('http://127.0.0.1:8001/api/health', timeout=10).read())
assert r.status == 200 and len(json.loads(r.read())['results']) == 3 and h['status'] == 'ok', h
print('   ltd serve: health ok (' + ', '.join(h['loaded']) + '), text search: 3 hits')
" || { docker exec "$NAME" tail -30 serve.log >&2; fail "ltd serve inside the container"; }
say "docker-check passed in $(( $(date +%s) - t0 )) s (image $IMAGE from $BASE_IMAGE)"
