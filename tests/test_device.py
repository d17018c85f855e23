"""The compute device: one setting of the process (training/device.py), not a parameter handed down."""
from __future__ import annotations

import argparse
import threading

import pytest
import torch

from app.cli.parser import _process_settings
from training import device as d
from training.errors import Unavailable


def test_the_default_is_the_cpu_and_a_block_restores_the_setting_after_it():
    assert d.default_device() == "cpu"
    with d.using_device("meta"):
        assert d.default_device() == "meta"
        with d.using_device("cpu"):
            assert d.default_device() == "cpu"
        assert d.default_device() == "meta"
    assert d.default_device() == "cpu"
    with pytest.raises(RuntimeError), d.using_device("meta"):  # an exception ends the block too
        raise RuntimeError
    assert d.default_device() == "cpu"


def test_worker_threads_see_the_setting_and_auto_reads_as_what_is_there():
    seen = []
    with d.using_device("auto"):
        t = threading.Thread(target=lambda: seen.append(d.default_device()))
        t.start()
        t.join()
    assert seen == ["cuda" if torch.cuda.is_available() else "cpu"]
    with pytest.raises(RuntimeError):
        d.set_device("not-a-device")  # refused where it is set, not at the first tensor
    assert d.default_device() == "cpu"


def test_pick_device_reads_the_train_device():
    assert d.pick_device("cpu") == torch.device("cpu")
    assert d.pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(Unavailable, match="no CUDA device"):
            d.pick_device("cuda")


def test_to_device_moves_a_tensor_and_the_tensors_of_a_batch():
    batch = {"ids": torch.arange(3), "lengths": [3], "mask": torch.ones(3)}
    moved = d.to_device(batch, "meta")
    assert moved["ids"].device.type == "meta" and moved["mask"].device.type == "meta" and moved["lengths"] == [3]
    assert d.to_device(torch.zeros(2), "cpu").device.type == "cpu"


def test_the_device_flag_is_the_commands_setting():
    with _process_settings(argparse.Namespace(device="meta")):
        assert d.default_device() == "meta"
    assert d.default_device() == "cpu"
    with _process_settings(argparse.Namespace(device=None)):  # `ltd serve` without --device: its settings decide
        assert d.default_device() == "cpu"
