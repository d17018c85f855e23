"""Widget groups that the Search and Compare tabs share (same look, same element ids by prefix)."""
from __future__ import annotations

import gradio as gr


def caption_row(prefix: str, go_label: str, placeholder: str, max_chars: int) -> tuple:
    """A caption box with its button and a random-caption button, and the dataset examples under them:
    (text, go, random, examples). Element ids: ``{prefix}-text``, ``-go``, ``-random``."""
    with gr.Row(equal_height=False, elem_classes="ltd-qrow"):
        text = gr.Textbox(label="Caption", placeholder=placeholder, scale=6, elem_id=f"{prefix}-text",
                          max_length=max_chars)
        go = gr.Button(go_label, variant="primary", scale=0, min_width=110, elem_id=f"{prefix}-go")
        rand = gr.Button("⚄ Random caption", scale=0, min_width=170, elem_id=f"{prefix}-random")
    examples = gr.Dataset(components=[text], samples=[], label="Dataset captions: click one (ground truth known)",
                          type="index", samples_per_page=8, layout="gallery", elem_classes="ltd-examples")
    return text, go, rand, examples


def image_id_row(prefix: str, go_label: str) -> tuple:
    """A dataset image id box and its button: (image id, go). Element id: ``{prefix}-image-id``."""
    with gr.Row(equal_height=False, elem_classes="ltd-qrow"):
        img_id = gr.Textbox(label="Dataset image id", placeholder="e.g. 52", scale=2, elem_id=f"{prefix}-image-id")
        go = gr.Button(go_label, variant="primary", scale=0, min_width=100)
    return img_id, go


def upload_box(height: int) -> gr.Image:
    """An image upload (and paste); the event gets the path of the file Gradio stored."""
    return gr.Image(label="…or upload an image", type="filepath", image_mode=None, sources=["upload", "clipboard"],
                    height=height)
