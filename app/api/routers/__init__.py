"""REST routers, one module per concern: health/models (``health``), search (``search``), dataset
items (``media``) and Prometheus metrics (``metrics``). Shared dependencies live in ``deps``."""
