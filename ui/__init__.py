"""The Gradio UI: ``ui.blocks.build_ui(service)`` (the Blocks app), ``ui.handlers`` (what its events
do, testable without a browser) and ``ui.theme`` (``THEME`` and ``CSS`` for ``gr.mount_gradio_app``)."""
