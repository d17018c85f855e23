"""bench/ddp_steps.py: its rows train on the same global batches (equal first losses), and its report."""
import json

import pytest
from conftest import TINY

from bench import ddp_steps


@pytest.mark.slow
def test_rows_share_the_global_batches_then_render(tmp_path):
    opts = {"device": "cpu", "config": "synthetic_baseline", "set": [*TINY, "train.batch_size=16", "loss.mode=constraint"],
            "steps": 1, "warmup": 1, "threads": 1}
    rows = [ddp_steps.run_config(w, g, opts) for w, g in ((1, False), (1, True), (2, True))]
    assert [r["label"] for r in rows] == ["1 process", "1 process, DDP", "2 processes"]
    assert rows[1]["first_loss"] == rows[0]["first_loss"]  # a group of one computes exactly the same
    assert rows[2]["first_loss"] == pytest.approx(rows[0]["first_loss"], rel=1e-6)
    res = {"device": "cpu", "machine": "CPU X", "date": "2026-11-26", "load1": 0.5, "config": "synthetic_baseline",
           "threads": 1, "command": "python bench/ddp_steps.py", "rows": rows}
    (tmp_path / "r.json").write_text(json.dumps(res))
    assert ddp_steps.main(["--render", str(tmp_path / "r.json")]) == 0


def test_render_reports_each_row_against_the_plain_process():
    row = {"global_batch": 128, "steps": 20}
    res = {"device": "cuda", "machine": "GPU X", "date": "2026-11-26", "load1": 0.5, "config": "synthetic_ltd",
           "threads": 1, "command": "python bench/ddp_steps.py --device cuda",
           "rows": [{**row, "label": "1 process", "ms_per_step": 10.0, "steps_per_s": 100.0, "cpu_ms_per_step": 9.5,
                     "first_loss": 3.0},
                    {**row, "label": "1 process, DDP", "ms_per_step": 12.5, "steps_per_s": 80.0, "cpu_ms_per_step": 9.0,
                     "first_loss": 3.0},
                    {**row, "label": "8 processes", "ms_per_step": 2.0, "steps_per_s": 500.0, "cpu_ms_per_step": 1.5,
                     "first_loss": 3.00001}]}
    text = ddp_steps.render(res)
    assert text.startswith(ddp_steps.SECTION["cuda"]) and "one GPU per process, NCCL" in text
    assert "| 1 process, DDP | 12.5 | 80.00 | 0.80× | 9.0 | +0.0e+00 |" in text
    assert "| 8 processes | 2.0 | 500.00 | 5.00× | 1.5 | +1.0e-05 |" in text


def test_refuses_cuda_without_a_gpu(monkeypatch):
    monkeypatch.setattr(ddp_steps.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        ddp_steps.main(["--device", "cuda"])
