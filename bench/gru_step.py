"""Forward + backward time of the bi-GRU caption encoder's recurrent core (run on demand, not a test).

    for p in PASSIVE ACTIVE; do OMP_WAIT_POLICY=$p python bench/gru_step.py; done; python bench/gru_step.py

Batch 128, 14 time steps, 50-d inputs (GloVe), random lengths 6-14, packed as the encoder packs them;
prints milliseconds per forward + backward and per forward for hidden 256 and 128. Used to measure
what the OpenMP wait policy costs the GRU (BENCHMARKS.md, "OpenMP wait policy and training speed").
"""
from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


def step_ms(hidden: int, batch: int, steps: int, dim: int, reps: int) -> tuple[float, float]:
    torch.manual_seed(0)
    gru = nn.GRU(dim, hidden, batch_first=True, bidirectional=True)
    x = torch.randn(batch, steps, dim, requires_grad=True)
    lengths = torch.randint(6, steps + 1, (batch,))

    def run() -> torch.Tensor:
        out, _ = gru(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        return pad_packed_sequence(out, batch_first=True, total_length=steps)[0]

    for _ in range(3):
        run().sum().backward()
    t = time.perf_counter()
    for _ in range(reps):
        run().sum().backward()
    both = (time.perf_counter() - t) / reps
    with torch.no_grad():
        t = time.perf_counter()
        for _ in range(reps):
            run()
        fwd = (time.perf_counter() - t) / reps
    return 1000 * both, 1000 * fwd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '<unset>')}, torch threads {torch.get_num_threads()}")
    for hidden in (256, 128):
        both, fwd = step_ms(hidden, a.batch, a.steps, 50, a.reps)
        print(f"bi-GRU {hidden}: forward+backward {both:.1f} ms, forward {fwd:.1f} ms")


if __name__ == "__main__":
    main()
