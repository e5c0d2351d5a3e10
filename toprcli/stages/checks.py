"""What a config's own checks cannot see, refused before any work by `topr iterate` and `topr config check` (as each stage command refuses it when it starts)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from toprcli.config import ConfigError, EvalConfig, IterateConfig, ScoreConfig, TrainConfig
from toprcli.data.local_files import LOCAL_FORMATS, local_suffix
from toprcli.errors import UserError
from toprcli.generation.model_info import check_model, context_length
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
        if not cfg.eval.candidates:  # a verifier's eval: IterateConfig.check holds its rendering to generate's
            check_eval_dataset(cfg)
    if isinstance(cfg, TrainConfig):
        check_loss(cfg)
    if isinstance(cfg, (ScoreConfig, EvalConfig)) and cfg.verifier != "auto":
        resolve_verifier(cfg.verifier, strict=cfg.strict, by_source=cfg.verifier_by_source)


def check_eval_dataset(cfg: IterateConfig) -> None:
    """The rounds are measured on the task they train on: an eval.dataset left unset while generate.dataset names another
    task evaluated every round on the default arithmetic, and one rendered otherwise (no chat template, no system prompt)
    on prompts the policy never trains on, in silence."""
    gen, ev = cfg.generate.dataset, cfg.eval.dataset
    one_file = local_suffix(gen.source) in LOCAL_FORMATS and Path(gen.source).expanduser().is_file()  # no splits
    if ev == EvalConfig().dataset and gen.source != ev.source:
        held_out = "a file of held-out problems" if one_file else f"{gen.source} with split test"
        raise ConfigError(f"generate.dataset.source is {gen.source} but eval.dataset is not set: every round would be evaluated on "
                          f"{ev.source} — set eval.dataset (its source: {held_out}; rendered as generate.dataset is)")
    differ = [k for k in ("chat_template", "system_prompt", "template", "preset") if getattr(gen, k) != getattr(ev, k)]
    if differ:
        warnings.warn(f"eval.dataset renders prompts unlike generate.dataset ({', '.join(differ)} differ): the rounds are evaluated "
                      "on prompts written otherwise than those they train on — make them equal unless that is meant", stacklevel=2)
    if one_file and ev.source == gen.source and gen.limit is None and ev.limit is None:
        warnings.warn(f"eval.dataset is generate.dataset's file ({gen.source}; one file has no splits): the rounds are evaluated on "
                      "the prompts they train on — point eval.dataset.source at held-out problems", stacklevel=2)


def check_starting_model(cfg: IterateConfig, model: str, *, hub: bool = True) -> None:
    """A pipeline's starting model: there (a mistyped path, a directory without config.json or tokenizer; a hub id whose config
    cannot be read, unless not ``hub``: `config check` stays offline), and with room in its context for a prompt beside each
    completion (generate refused it at round 0, after the engine had started; a mistyped relative path, read as a hub id,
    failed there too, with a run dir made)."""
    check_model(model)
    if not Path(model).is_dir() and not hub:
        return
    try:
        own = context_length(model)  # read once (a hub id's config.json: fetched); a section's max_model_len overrides it
    except UserError as e:
        if Path(model).is_dir():
            raise
        raise UserError(f"model {model}: no such directory (from {Path.cwd()}), and as a hub id: {e}") from None
    for stage, section in (("generate", cfg.generate), ("eval", cfg.eval)):
        context = own if section.engine.max_model_len is None else section.engine.max_model_len
        if context is not None and section.sampling.max_new_tokens >= context:
            raise UserError(f"{stage}.sampling.max_new_tokens {section.sampling.max_new_tokens} leaves no room for a prompt in the context "
                            f"of {model} ({context} tokens) — lower it (--set {stage}.sampling.max_new_tokens=...)")
