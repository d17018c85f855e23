"""The REST API: `create_app` (main.py) builds the FastAPI app; routers/, schemas, settings, errors, limits,
security and the Prometheus metrics (prom.py) are its parts."""
