# syntax=docker/dockerfile:1
# LTD retrieval: the REST API (/api, docs at /docs) and the UI (/ui) in one container.
#
#   docker build -t ltd .
#   docker run --rm -p 127.0.0.1:8000:8000 -e LTD_API_TOKEN="$(openssl rand -hex 24)" ltd   # `ltd demo`
#   docker run --rm -p 127.0.0.1:8000:8000 -e LTD_API_TOKEN=… -v "$PWD/indexes:/app/indexes" -v "$PWD/runs:/app/runs" \
#       ltd serve --host 0.0.0.0 --expose --model bl=indexes/bl --model ltd=indexes/ltd
#
# Inside the container the server must listen on 0.0.0.0 (Docker forwards to the container's own
# address), hence --expose; who can reach it is decided by -p: 127.0.0.1:8000:8000 publishes the port
# to this machine only. Publish it wider (-p 8000:8000) only with LTD_API_TOKEN set: every route but
# /api/health then needs `Authorization: Bearer TOKEN` (browsers log in once at /login).
# (An index directory finds its checkpoint relative to itself: mount runs/ and indexes/ side by side
# as `ltd index` saw them, or name it: --model ltd=indexes/ltd@runs/ltd/best.pt.)
#
# GPU: the host needs the NVIDIA driver and container toolkit; the CUDA runtime comes with the pip
# wheels (torch from the PyTorch CUDA index, faiss-gpu-cu12), so the slim base works too. BASE_IMAGE
# takes a CUDA base image instead; it must provide python3.11 as `python` with pip.
#   docker build -t ltd:gpu --build-arg FAISS=gpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#   docker run --rm --gpus all -p 8000:8000 ... ltd:gpu serve --host 0.0.0.0 --device cuda --model ...
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# cpu: faiss-cpu (the pinned dependency); gpu: replaced by faiss-gpu-cu12 (same `faiss` module).
ARG FAISS=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LTD_CACHE_DIR=/app/.cache/ltd
# (The Hugging Face libraries are kept offline by `ltd` itself as it starts: training/hf_env.py.)

WORKDIR /app
RUN useradd --create-home --uid 1000 ltd && chown ltd /app

# torch first, from the PyTorch index: PyPI's Linux torch wheel is the multi-GB CUDA build. The pin
# matches pyproject.toml; `torch==2.13.0` accepts the index's local version (2.13.0+cpu), so the
# `pip install .` below finds it satisfied and installs nothing else for torch.
RUN pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0

COPY pyproject.toml README.md ./
COPY training ./training
COPY indexer ./indexer
COPY search ./search
COPY app ./app
COPY ui ./ui
COPY configs ./configs
RUN pip install . \
 && if [ "${FAISS}" = "gpu" ]; then pip uninstall -y faiss-cpu && pip install faiss-gpu-cu12==1.14.1.post1; fi \
 && python -c "import faiss, torch; print('torch', torch.__version__, '| faiss', faiss.__version__, '| GPUs', faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0)"

USER ltd
EXPOSE 8000
# 200 from /api/health once the models are loaded (503 while loading). The long start period
# covers `ltd demo`, which trains and indexes before it serves.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15m --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/api/health', timeout=4)"]
ENTRYPOINT ["ltd"]
CMD ["demo", "--host", "0.0.0.0", "--expose", "--port", "8000"]
