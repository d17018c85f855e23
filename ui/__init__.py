"""The Gradio UI: ``ui.app.build_ui(service)`` (the Blocks app), ``ui.tabs`` (one module per tab: its
layout, its events and the plain functions behind them, testable without a browser), ``ui.context``
(what every tab shares: the services, their limits, thumbnails) and ``ui.theme`` (``THEME`` and ``CSS`` for
``gr.mount_gradio_app``)."""
