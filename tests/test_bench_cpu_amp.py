"""bench/cpu_amp_steps.py: fp32 and bf16 steps on the same batches, and the table it writes."""
import math

import pytest
from conftest import TINY

from bench.cpu_amp_steps import SECTION, bench_preset, render


@pytest.mark.slow
@pytest.mark.training
def test_bench_times_both_precisions_on_the_same_steps_and_renders():
    r = bench_preset("synthetic_ltd", 1, tuple(TINY))
    assert len(r["fp32"]) == len(r["bf16"]) == 2 and all(t > 0 and math.isfinite(t) for t in r["fp32"] + r["bf16"])
    # same batches, same initial model: the losses agree to bf16 rounding but are not the same numbers
    assert abs(r["loss"]["bf16"] - r["loss"]["fp32"]) < 0.05 * abs(r["loss"]["fp32"])
    assert r["loss"]["bf16"] != r["loss"]["fp32"]
    r.update(fp32=[0.2, 0.25], bf16=[0.1, 0.12], loss={"fp32": 1.0, "bf16": 1.001})
    text = render({"machine": "CPU X", "native_bf16": True, "date": "2026-11-24", "command": "python bench/cpu_amp_steps.py",
                   "threads": 2, "load": 0.5, "steps": 1, "runs": [r]})
    assert text.startswith(SECTION) and "| `synthetic_ltd` | head | 200 | 100 | 2.00× | +0.0010 |" in text
