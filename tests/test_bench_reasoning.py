"""bench/reasoning_epochs.py: its BENCHMARKS.md table states the machine load and the ratios to the baseline."""
from bench.reasoning_epochs import SECTION, render


def test_table_reports_load_and_ratio_to_the_head_family():
    runs = [{"config": "flickr8k_baseline", "family": "head", "epoch_s": [40.0, 30.0], "steps_per_epoch": 235,
             "wall_s": 90.0, "load_before": 1.0, "load_after": 2.5},
            {"config": "flickr8k_vsrn_ltd", "family": "vsrn", "epoch_s": [200.0, 150.0], "steps_per_epoch": 235,
             "wall_s": 400.0, "load_before": 2.5, "load_after": 6.0}]
    text = render({"machine": "CPU X", "date": "2026-11-23", "command": "python bench/reasoning_epochs.py",
                   "threads": 2, "niced": False, "runs": runs})
    assert text.startswith(SECTION)
    assert "| `flickr8k_vsrn_ltd` | vsrn | 200 / 150 | 0.64 | 400 | 2.5 → 6.0 |" in text
    assert "flickr8k_vsrn_ltd 5.0×" in text
