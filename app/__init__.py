"""LTD retrieval — app: the `ltd` CLI and the FastAPI service (the composition root).

CPU threading settings must be in the environment before torch is first imported: OpenMP reads
them once, and busy-waiting threads make a 2-core machine crawl under any other load.
"""
import os as _os

for _k, _v in (("OMP_WAIT_POLICY", "PASSIVE"), ("TOKENIZERS_PARALLELISM", "false"),
               ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
    _os.environ.setdefault(_k, _v)
