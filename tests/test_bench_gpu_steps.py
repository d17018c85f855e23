"""bench/gpu_steps.py: its columns start from one model on the same batches, and its report.

No GPU here: ``--dry-run``'s switch (the module's ``GPU`` set to "cpu") runs the same code with the
CPU in the GPU's place, where every column must then give the very same losses."""
import json

import pytest
from conftest import TINY

from bench import gpu_steps


@pytest.mark.slow
def test_columns_share_the_initial_model_and_batches_then_render(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_steps, "GPU", "cpu")
    base = [*TINY, "data.path=", "model.word_embeddings=random"]
    r = {"recipe": "end-to-end flickr8k_ltd",
         **gpu_steps.bench_recipe("end-to-end flickr8k_ltd", [], 2, 2, base)}
    losses = [r[c]["losses"] for c, _, _ in gpu_steps.COLUMNS]
    # on one device without AMP every column is the same computation: a column that trained the shared
    # backbone before the next one started (or drew other batches) would show here
    assert all(lo == losses[0] for lo in losses[1:]) and len(losses[0]) == 2
    for c, _, _ in gpu_steps.COLUMNS:
        r[c]["ms_per_step"] = {"cpu_fp32": 400.0, "cuda_fp32": 20.0, "cuda_fp16": 10.0, "cuda_bf16": 16.0}[c]
    r["cuda_fp16"]["losses"] = [losses[0][0] + 1e-3, losses[0][1] + 3e-3]
    res = {"machine": "GPU X", "date": "2026-11-26", "command": "python bench/gpu_steps.py", "errors": [],
           "train": [r], "notes": ["- a reading"]}
    (tmp_path / "r.json").write_text(json.dumps(res))
    text = gpu_steps.render(json.loads((tmp_path / "r.json").read_text()))
    assert text.startswith(gpu_steps.SECTION)
    capsys.readouterr()
    assert gpu_steps.main(["--render", str(tmp_path / "r.json")]) == 0  # prints it; writes nothing without --write
    assert capsys.readouterr().out == text + "\n"
    assert (f"| `end-to-end flickr8k_ltd` | {r['batch_size']} | 400 | 20.0 | 10.0 | 16.0 | 40.0× | "
            "+0.0e+00 / +1.0e-03 / +0.0e+00 | +0.0e+00 / +2.0e-03 / +0.0e+00 |") in text
    assert text.rstrip().endswith("- a reading")


def test_refuses_to_run_without_a_gpu(monkeypatch):
    monkeypatch.setattr(gpu_steps.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu_steps.main(["--json", "x.json"])
