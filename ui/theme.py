"""Look of the UI: a Gradio theme plus the CSS of the result cards.

Gradio 6 takes theme and CSS at launch/mount time, not in ``gr.Blocks(...)``, so the app that mounts
the UI passes them: ``gr.mount_gradio_app(app, build_ui(service), path="/ui", theme=THEME, css=CSS)``.

Colours: indigo for the chrome, so that green and red keep one meaning only: ground truth (✓,
Okabe–Ito bluish green) and non-matching (✗, Okabe–Ito vermillion). Both stay distinguishable for
the common colour-vision deficiencies, and every coloured item also carries a ✓/✗ glyph.
"""
from __future__ import annotations

from pathlib import Path

import gradio as gr

CSS_PATH = Path(__file__).with_name("style.css")
CSS: str = CSS_PATH.read_text(encoding="utf-8")

THEME = gr.themes.Default(
    primary_hue=gr.themes.colors.indigo,
    secondary_hue=gr.themes.colors.slate,
    neutral_hue=gr.themes.colors.slate,
    radius_size=gr.themes.sizes.radius_md,
    text_size=gr.themes.sizes.text_md,
).set(
    body_background_fill="*neutral_50",
    body_background_fill_dark="*neutral_950",
    block_shadow="0 1px 2px rgba(15, 23, 42, 0.06)",
    block_border_width="1px",
    block_title_text_weight="600",
    button_primary_background_fill="*primary_600",
    button_primary_background_fill_hover="*primary_700",
    button_primary_text_color="white",
)

__all__ = ["THEME", "CSS", "CSS_PATH"]
