"""The pass before step 1 (training/precompute.py): reused by --resume when a run was killed before its first
checkpoint, never reused for other settings, and stopped by a stop request at the next micro-batch."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from builders import write_curated
from conftest import Killed
from safetensors.torch import load_file

import toprcli.training.precompute as pre
import toprcli.training.trainer as trainer
from toprcli import interrupt
from toprcli.config import TrainConfig
from toprcli.stages.train import run as train_policy


@pytest.fixture(scope="module")
def data_path(tmp_path_factory, tiny_model_dir) -> Path:
    return write_curated(tmp_path_factory.mktemp("data") / "train.parquet", n=32, policy=str(tiny_model_dir))


def _cfg(tiny_model_dir, data, out, **kw) -> TrainConfig:  # a KL reference from the starting policy: a pass runs
    return TrainConfig(**{**dict(model=str(tiny_model_dir), data=str(data), out=str(out), optimizer="adamw", lr=1e-3, batch_size=8,
                                 max_steps=4, kl_coef=0.1, recompute_behavior=True), **kw})


def _passes(monkeypatch) -> list[int]:
    """Counts the passes over the data (score_dataset calls)."""
    calls: list[int] = []
    real = pre.score_dataset
    monkeypatch.setattr(pre, "score_dataset", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _die_at_step(monkeypatch, step: int) -> None:
    real, seen = trainer._optimizer_step, []

    def step_then_die(*args, **kwargs):
        seen.append(1)
        if len(seen) == step:
            raise Killed(f"killed in step {step}, no checkpoint")
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "_optimizer_step", step_then_die)


def test_a_resume_without_a_checkpoint_reuses_the_pass_and_matches_the_whole_run(tiny_model_dir, data_path, tmp_path, monkeypatch):
    """It was deleted with the rest of <out>.partial and run again: minutes on a large set, before every resume."""
    full = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "a"))
    _die_at_step(monkeypatch, 3)
    with pytest.raises(Killed):
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b"))
    monkeypatch.undo()
    assert (tmp_path / "b.partial" / pre.PRECOMPUTED_NAME).is_file()
    passes = _passes(monkeypatch)
    resumed = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", resume=True))
    assert passes == [] and resumed["resumed_from_step"] is None
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("a", "b"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0.0  # fp32 on CPU: the same numbers
    assert resumed["final_loss"] == full["final_loss"] and resumed["behavior_gap_mean"] == full["behavior_gap_mean"]


def test_a_pass_made_for_other_settings_is_run_again_or_removed(tiny_model_dir, data_path, tmp_path, monkeypatch):
    _die_at_step(monkeypatch, 2)
    with pytest.raises(Killed):
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "c"))
    monkeypatch.undo()
    passes = _passes(monkeypatch)
    _die_at_step(monkeypatch, 2)
    with pytest.raises(Killed):  # another KL coefficient: the saved pass is not this run's
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "c", resume=True, kl_coef=0.2))
    assert passes == [1]
    monkeypatch.undo()
    # No pass needed now: the old one is removed, so a later checkpoint resume cannot read it as this run's μ.
    train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "c", resume=True, kl_coef=0.0, recompute_behavior=False, max_steps=1))
    assert not (tmp_path / "c" / pre.PRECOMPUTED_NAME).exists()


@pytest.mark.parametrize("needs_pass, where", [(True, "in the pass over the data"), (False, "stopped before step 1 of 4")])
def test_a_stop_request_before_step_1_stops_before_any_step(tiny_model_dir, data_path, tmp_path, monkeypatch, needs_pass, where):
    """A SIGTERM while the model loaded or the pass ran waited for the pass and the whole first step (minutes, past a
    scheduler's grace period)."""
    monkeypatch.setattr(interrupt, "requested", lambda: signal.SIGTERM)
    steps = []
    monkeypatch.setattr(trainer, "_optimizer_step", lambda *a, **k: steps.append(1))
    kw = {} if needs_pass else dict(kl_coef=0.0, recompute_behavior=False)
    with pytest.raises(interrupt.Interrupted, match=where) as stopped:
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "d", **kw))
    assert stopped.value.exit_code == 143 and steps == [] and not (tmp_path / "d").exists()
    assert not (tmp_path / "d.partial" / pre.PRECOMPUTED_NAME).exists()
