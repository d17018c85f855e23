"""LTD retrieval — app: the composition root. ``app/api`` is the REST service (FastAPI), ``app/cli``
the `ltd` command line, and ``pipeline`` / ``experiment`` compose training, indexing and evaluation."""
