"""What the backends share (generation/base.py): the engine dtype ``auto`` stands for.

No GPU here: the device's bfloat16 support is monkeypatched, so these check the choice, not a GPU run."""

from __future__ import annotations

import pytest
import torch

from toprcli.generation.base import resolve_dtype
from toprcli.training.model import Precision


@pytest.mark.parametrize("bf16, engine, trainer", [(True, "bfloat16", "bfloat16"), (False, "float16", "float32")])
def test_auto_is_float16_for_the_engine_and_float32_for_the_trainer_on_a_gpu_without_bfloat16(monkeypatch, bf16, engine, trainer):
    """auto was bfloat16 on any GPU: vLLM refuses it before Ampere (T4, V100), where its own auto picks float16."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16 and not including_emulation)
    assert resolve_dtype("auto", on_gpu=True) == engine and resolve_dtype("auto", on_gpu=False) == "float32"
    assert resolve_dtype("bfloat16", on_gpu=True) == "bfloat16"  # asked for: vLLM's own message if the device lacks it
    assert Precision.resolve("auto", torch.device("cuda", 0)).name == trainer
    assert Precision.resolve("auto", torch.device("cpu")).name == "float32"
