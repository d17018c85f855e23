"""REST routers, one module per concern: health and the model registry (``health``), search
(``search``), dataset items (``media``), captions (``caption``), word attributions (``explain``),
Prometheus metrics (``metrics``) and the offline API docs (``docs``). Shared dependencies live in
``deps``, the JSON-or-upload request bodies in ``bodies``."""
