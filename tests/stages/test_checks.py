"""stages/checks.py: what iterate and `topr config check` refuse (or warn of) before any work."""

from __future__ import annotations

import warnings

import pytest
import yaml
from typer.testing import CliRunner

from toprcli.cli.main import app
from toprcli.config import ConfigError, IterateConfig, from_dict
from toprcli.stages.checks import check_eval_dataset


def _cfg(generate: dict, eval_: dict | None = None) -> IterateConfig:
    return from_dict(IterateConfig, {"generate": {"dataset": generate}, **({"eval": {"dataset": eval_}} if eval_ else {})})


def test_an_unset_eval_dataset_is_refused_when_the_rounds_train_on_another_task(tmp_path):
    """generate.dataset alone: every round's eval measured the default builtin:arith level 2, in silence."""
    with pytest.raises(ConfigError, match="eval.dataset is not set: every round would be evaluated on builtin:arith .*builtin:gsm8k with split test"):
        check_eval_dataset(_cfg({"source": "builtin:gsm8k"}))
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    with pytest.raises(ConfigError, match="a file of held-out problems"):
        check_eval_dataset(_cfg({"source": str(data)}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_eval_dataset(_cfg({"source": "builtin:gsm8k"}, {"source": "builtin:gsm8k", "split": "test"}))  # set: quiet
        check_eval_dataset(IterateConfig())  # the defaults: arithmetic both
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"generate": {"dataset": {"source": "builtin:gsm8k"}}}))
    r = CliRunner().invoke(app, ["config", "check", str(config)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "eval.dataset is not set" in r.stderr


def test_an_eval_rendered_otherwise_or_on_the_training_file_is_warned_of(tmp_path):
    with pytest.warns(UserWarning, match=r"renders prompts unlike generate.dataset \(chat_template, system_prompt differ\)"):
        check_eval_dataset(_cfg({"source": "builtin:gsm8k", "chat_template": True, "system_prompt": "Think."},
                                {"source": "builtin:gsm8k", "split": "test"}))
    data = tmp_path / "all.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    with pytest.warns(UserWarning, match="evaluated on the prompts they train on"):
        check_eval_dataset(_cfg({"source": str(data)}, {"source": str(data), "split": "test"}))


def test_a_starting_model_that_is_neither_a_dir_here_nor_a_reachable_hub_id_is_refused_before_work(tmp_path, monkeypatch):
    """`model: models/tiny` from a directory without it read as a hub id, passed, and failed at round 0's eval with a
    connection error, a run dir made; `config check` stays offline (a hub id's config is not fetched)."""
    from toprcli.config import IterateConfig
    from toprcli.errors import UserError
    from toprcli.stages import checks

    def unreachable(model, override=None):
        raise UserError(f"cannot read the config of {model}: We couldn't connect to 'https://huggingface.co' — check the model dir or hub id")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(checks, "context_length", unreachable)
    with pytest.raises(UserError, match=rf"model models/tiny: no such directory \(from {tmp_path}\), and as a hub id: cannot read the config"):
        checks.check_starting_model(IterateConfig(model="models/tiny"), "models/tiny")
    checks.check_starting_model(IterateConfig(model="models/tiny"), "models/tiny", hub=False)  # config check: not fetched
