#!/usr/bin/env bash
# A local base image for the Dockerfile where the public one (python:3.11-slim) cannot be pulled:
# Debian bookworm from Debian's own packages (debootstrap; Python 3.11 is bookworm's python3),
# imported into Docker, with pip allowed into the system Python, this machine's CA bundle (for
# TLS-intercepting proxies) and, when this machine's pip can find it, the CPU torch wheel preinstalled
# (the Dockerfile's `pip install torch==2.13.0` then finds it satisfied and needs no PyTorch index).
#
#   docker/local-base.sh [TAG]          # default ltd-base:bookworm; needs root, debootstrap, docker
#   docker build --network host --build-arg BASE_IMAGE=ltd-base:bookworm -t ltd .
#
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian), TORCH_SPEC (default torch==2.13.0;
# empty: no torch in the base).
set -euo pipefail
TAG=${1:-ltd-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH_SPEC=${TORCH_SPEC-torch==2.13.0}
export DOCKER_BUILDKIT=0  # the classic builder: BuildKit would pull its Dockerfile frontend image

if [ "$(id -u)" != 0 ]; then echo "local-base.sh: needs root (debootstrap)" >&2; exit 2; fi
command -v debootstrap >/dev/null || { echo "local-base.sh: apt-get install debootstrap" >&2; exit 2; }

work=$(mktemp -d /tmp/ltd-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "== debootstrap bookworm ($MIRROR) into $work/rootfs"
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
  bookworm "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
cp /etc/ssl/certs/ca-certificates.crt "$work/rootfs/etc/ssl/certs/ca-certificates.crt"
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
echo "== docker import"
tar -C "$work/rootfs" -c . | docker import \
  --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt LANG=C.UTF-8' \
  --change 'CMD ["python3"]' - "$TAG-raw" >/dev/null

mkdir -p "$work/ctx"
if [ -n "$TORCH_SPEC" ] && python3 -m pip download --no-deps --only-binary=:all: --python-version 3.11 \
     --platform manylinux_2_28_x86_64 -d "$work/ctx" "$TORCH_SPEC" >"$work/pip.log" 2>&1; then
  echo "== preinstalling $(basename "$work"/ctx/*.whl)"
  printf 'FROM %s\nCOPY *.whl /tmp/\nRUN pip install --no-cache-dir /tmp/*.whl && rm /tmp/*.whl\n' "$TAG-raw" \
    >"$work/ctx/Dockerfile"
else
  echo "== no local $TORCH_SPEC wheel: the Dockerfile installs torch from its TORCH_INDEX_URL"
  printf 'FROM %s\n' "$TAG-raw" >"$work/ctx/Dockerfile"
fi
docker build --network host -q -t "$TAG" "$work/ctx" >/dev/null
docker rmi "$TAG-raw" >/dev/null 2>&1 || true
echo "== $TAG: $(docker run --rm "$TAG" python -c 'import sys; print(sys.version.split()[0])' 2>&1)"
