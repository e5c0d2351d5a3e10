"""What a config's own checks cannot see, refused before any work by `topr iterate` and `topr config check` (as each stage command refuses it when it starts)."""

from __future__ import annotations

from typing import Any

from toprcli.config import EvalConfig, IterateConfig, ScoreConfig, TrainConfig
from toprcli.stages.train import check_loss
from toprcli.tracking import check_installed
from toprcli.verifiers.registry import resolve_verifier


def check_before_work(cfg: Any) -> None:
    """What a stage config's own checks cannot see, refused before any work: a training's loss and its options, a
    verifier spec (``auto`` reads the dataset: later), the trackers' packages. One stage's config, or each of a
    pipeline's (its warm start's training too)."""
    if hasattr(cfg, "tracking"):  # first, as the stage commands check it
        check_installed(cfg.tracking.report_to)
    if isinstance(cfg, IterateConfig):
        for section in (cfg.train, *([cfg.warm_start_train()] if cfg.warm_start.enabled else []), cfg.score, cfg.eval):
            check_before_work(section)
    if isinstance(cfg, TrainConfig):
        check_loss(cfg)
    if isinstance(cfg, (ScoreConfig, EvalConfig)) and cfg.verifier != "auto":
        resolve_verifier(cfg.verifier, strict=cfg.strict, by_source=cfg.verifier_by_source)
