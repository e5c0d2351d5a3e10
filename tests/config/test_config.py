"""Typed configs: defaults, YAML loading, overrides, and one-line errors with exit code 2."""

from __future__ import annotations

import warnings

import pytest
from typer.testing import CliRunner

from conftest import REPO
from toprcli.cli.main import app
from toprcli.config import (
    ConfigError,
    CurateConfig,
    GenerateConfig,
    IterateConfig,
    TrainConfig,
    config_to_dict,
    load_config,
    parse_override,
)

runner = CliRunner()


def test_defaults_follow_the_paper():
    g, t = GenerateConfig(), TrainConfig()
    assert (g.n, g.sampling.temperature, g.sampling.top_p, g.sampling.top_k, g.sampling.max_new_tokens) == (16, 1.0, 1.0, -1, 512)
    assert (t.temperature, t.top_p, t.top_k, t.min_p) == (None, None, None, None)  # read from the data
    assert (t.optimizer, t.lr, t.schedule, t.grad_clip, t.epochs, t.loss) == ("adafactor", 5e-7, "constant", 1.0, 1.0, "topr")


def test_yaml_and_overrides(tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text("model: m\nn: 4\nsampling: {temperature: 0.7}\ndataset:\n  source: builtin:arith\n  split: test\n")
    cfg = load_config(GenerateConfig, f, {"n": 8, "sampling.top_k": None, "dataset.level": 3})
    assert cfg.n == 8 and cfg.sampling.temperature == 0.7 and cfg.sampling.top_k == -1
    assert cfg.dataset.split == "test" and cfg.dataset.level == 3


def test_pipeline_file_gives_each_stage_its_section(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("rounds: 2\ngenerate:\n  n: 3\ntrain:\n  lr: 1e-4\n  loss: sft\n")
    assert load_config(GenerateConfig, f).n == 3
    t = load_config(TrainConfig, f)
    assert t.lr == 1e-4 and t.loss == "sft"  # '1e-4' (a string to PyYAML) is read as a float
    it = load_config(IterateConfig, f)
    assert it.rounds == 2 and it.generate.n == 3


@pytest.mark.parametrize(
    "yaml_text, words",
    [
        ("nn: 3\n", ["unknown config key: 'nn'", "did you mean 'n'?"]),
        ("n: 0\n", ["'n'", "0", "integer >= 1"]),
        ("n: three\n", ["'n'", "'three'", "an integer"]),
        ("engine: {backend: tpu}\n", ["'engine.backend'", "'tpu'", "'vllm'"]),
        ("temperature: 0.7\n", ["unknown config key: 'temperature' (moved to 'sampling.temperature')"]),
        ("dataset:\n  splt: test\n", ["unknown config key: 'dataset.splt' (did you mean 'dataset.split'?)"]),
        ("sampling: {top_p: 1.5}\n", ["'sampling.top_p'", "1.5", "(0, 1]"]),
        ("sampling: {min_p: 1.0}\n", ["'sampling.min_p'", "[0, 1)"]),
        ("- a\n- b\n", ["must be a mapping"]),
        ("n: [\n", ["not valid YAML"]),
    ],
)
def test_bad_configs_name_key_value_and_allowed(tmp_path, yaml_text, words):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml_text)
    with pytest.raises(ConfigError) as e:
        load_config(GenerateConfig, f)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_a_pipeline_key_at_the_wrong_level_lists_every_section_that_has_it():
    """A top-level `seed` was 'moved to curate.seed' (the first section with that name: a seed of --subsample only, which a
    user then set believing the run seeded) and `temperature` 'moved to train.temperature' (a check-only key)."""
    from toprcli.config import from_dict

    with pytest.raises(ConfigError) as e:
        from_dict(IterateConfig, {"temperature": 0.5, "lr": 1e-6, "sampling": {"top_p": 0.9}})
    assert ("'temperature' (it is generate.sampling.temperature, train.temperature or eval.sampling.temperature: write the one you mean)"
            in str(e.value)) and "'lr' (moved to 'train.lr')" in str(e.value)
    assert "'sampling' (it is generate.sampling or eval.sampling: write the one you mean)" in str(e.value)  # a section, too


def test_iterate_refuses_train_sampling_that_contradicts_generate(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("generate:\n  sampling: {temperature: 0.7}\ntrain:\n  temperature: 0.5\n")
    with pytest.raises(ConfigError, match="train.temperature is 0.5 but generate.sampling.temperature is 0.7"):
        load_config(IterateConfig, f)
    f.write_text("generate:\n  sampling: {temperature: 0.7}\ntrain:\n  temperature: 0.7\n")
    assert load_config(IterateConfig, f).train.temperature == 0.7


def test_warm_start_trains_with_overrides_of_the_train_config(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("train:\n  micro_batch_tokens: 1000\n  lr: 1e-6\nwarm_start:\n  enabled: true\n  train: {lr: 0.01, epochs: 3}\n")
    ws = load_config(IterateConfig, f).warm_start_train()
    assert (ws.loss, ws.optimizer, ws.lr, ws.epochs, ws.micro_batch_tokens) == ("sft", "adamw", 0.01, 3.0, 1000)
    f.write_text("warm_start:\n  train: {optimiser: adamw}\n")
    with pytest.raises(ConfigError, match="warm_start.train.optimiser"):
        load_config(IterateConfig, f)


def test_eval_sampling_needs_a_temperature():
    with pytest.raises(ConfigError, match="sampling.temperature"):
        load_config(IterateConfig, None, {"eval.sampling.temperature": 0})


@pytest.mark.parametrize("temperature", [1e-6, 0.005, 2.5])
def test_a_temperature_vllm_would_not_sample_at_is_refused(temperature):
    """Below 1e-5 vLLM decodes greedily (μ at T = 1), below 0.01 it samples at 0.01, above 2 it raises: μ would not
    be the recorded temperature's, which training reads."""
    with pytest.raises(ConfigError, match=r"0 \(greedy\) or a number in \[0.01, 2\]"):
        load_config(GenerateConfig, None, sets={"temperature": temperature})
    assert load_config(GenerateConfig, None, sets={"temperature": 0}).sampling.temperature == 0


def test_curate_fraction_bounds():
    with pytest.raises(ConfigError, match="strictly between 0 and 1"):
        load_config(CurateConfig, None, {"positive_fraction": 1.0})


def test_parse_override():
    assert parse_override("train.lr=1e-6") == ("train.lr", "1e-6")
    assert parse_override("generate.n=4") == ("generate.n", 4)
    with pytest.raises(ConfigError):
        parse_override("nokey")


def test_config_show_and_check_cli(tmp_path):
    r = runner.invoke(app, ["config", "show", "train"])
    assert r.exit_code == 0 and "optimizer: adafactor" in r.stdout
    r = runner.invoke(app, ["config", "show"])
    assert r.exit_code == 0 and "warm_start:" in r.stdout and "generate:" in r.stdout
    good = tmp_path / "ok.yaml"
    good.write_text("rounds: 2\ngenerate:\n  n: 2\n")
    r = runner.invoke(app, ["config", "check", str(good)])
    assert r.exit_code == 0 and "rounds: 2" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: 2\ntrain:\n  optimizer: sgd\n")
    r = runner.invoke(app, ["config", "check", str(bad)])
    assert r.exit_code == 2
    assert "train.optimizer" in r.stderr and "'sgd'" in r.stderr and "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1
    r = runner.invoke(app, ["config", "show", "nope"])
    assert r.exit_code == 2 and "unknown stage" in r.stderr


def test_what_each_round_sets_is_neither_shown_nor_taken_in_a_pipeline_config(tmp_path):
    """`config show` printed generate.out, train.data, train.tracking, ... for a user to edit: tracking was refused
    when filled, the others were overridden by every round in silence (now said, and dropped)."""
    import yaml

    shown = yaml.safe_load(runner.invoke(app, ["config", "show"]).stdout)
    assert "out" not in shown["generate"] and "data" not in shown["train"] and "tracking" not in shown["eval"]
    assert "n" in shown["generate"] and "lr" in shown["train"] and "tracking" in shown  # the settings a user edits stay
    from toprcli.cli.iterate import check_config

    (tmp_path / "p.yaml").write_text("train:\n  data: mine.parquet\n  out: ''\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dropped in silence where records are read (a run recorded with it goes on)
        cfg = load_config(IterateConfig, tmp_path / "p.yaml")
    assert cfg.train.data == ""
    with pytest.warns(UserWarning, match=r"^train.data in .*p.yaml: each round sets it .* so it is not used$"):  # said of a -c
        check_config(str(tmp_path / "p.yaml"), {}, cfg)


def test_resolved_config_is_plain_data():
    d = config_to_dict(IterateConfig())
    assert d["train"]["loss"] == "topr" and isinstance(d["generate"]["dataset"], dict)


def test_shipped_configs_are_valid():

    for f in sorted((REPO / "configs").glob("*.yaml")):
        load_config(IterateConfig, f)


def test_a_verifier_trained_by_iterate_judges_candidates_as_it_was_trained():
    from toprcli.config import ConfigError, IterateConfig, from_dict

    with pytest.raises(ConfigError, match="verifier_chat_template"):
        from_dict(IterateConfig, {"generate": {"dataset": {"chat_template": True}}, "eval": {"candidates": "scored"}})
    cfg = from_dict(IterateConfig, {"generate": {"dataset": {"chat_template": True}},
                                           "eval": {"candidates": "scored", "verifier_chat_template": True}})
    assert cfg.eval.candidates == "scored"
    # The system prompt it was trained with is the one it judges with (the judge once dropped it).
    with pytest.raises(ConfigError, match="eval.dataset.system_prompt differs"):
        from_dict(IterateConfig, {"generate": {"dataset": {"system_prompt": "You grade solutions.", "chat_template": True}},
                                  "eval": {"candidates": "scored", "verifier_chat_template": True}})
    same = {"system_prompt": "You grade solutions.", "chat_template": True}
    cfg = from_dict(IterateConfig, {"generate": {"dataset": same}, "eval": {"candidates": "scored", "dataset": same, "verifier_chat_template": True}})
    from toprcli.stages.eval_judge import _spec

    assert _spec(cfg.eval, "x").system_prompt == "You grade solutions."
    with pytest.raises(ConfigError, match="choose one"):
        from_dict(IterateConfig, {"eval": {"candidates": "scored", "verifier_model": "m"}})


def test_a_mapping_flag_adds_to_the_files_or_the_default_mapping(tmp_path):
    """`--verifier-by-source NAME=math` adds a data_source (it replaced the built-in ones, so GSM8K rows then had no
    verifier); `--loss-option` adds to the file's loss_options; `--set` still sets the whole mapping."""
    from toprcli.config import ScoreConfig, TrainConfig, load_config
    from toprcli.config.schema import VERIFIER_BY_SOURCE

    score = load_config(ScoreConfig, None, {"verifier_by_source": {"my/src": "math"}})
    assert score.verifier_by_source == {**VERIFIER_BY_SOURCE, "my/src": "math"}
    f = tmp_path / "train.yaml"
    f.write_text("loss_options: {ratio_level: token}\n")
    train = load_config(TrainConfig, f, {"loss_options": {"positive_weight": 0.5}})
    assert train.loss_options == {"ratio_level": "token", "positive_weight": 0.5}
    assert load_config(TrainConfig, f, sets={"loss_options": {}}).loss_options == {}


def test_a_system_prompt_needs_the_chat_template():
    """Without --chat-template the system prompt was dropped in silence, and recorded in the manifest as if used."""
    from toprcli.config import GenerateConfig

    with pytest.raises(ConfigError, match="dataset.system_prompt needs dataset.chat_template: true"):
        load_config(GenerateConfig, None, sets={"dataset.system_prompt": "Be brief."})


def test_set_keeps_a_string_fields_text_as_written():
    """`--set` values arrive as text: a string field keeps it (a split named 2023 was refused, a regex lost its
    ' # x' as a YAML comment, '#id' became unset, 010 became 8); other fields read it as YAML."""
    from toprcli.config import GenerateConfig, ScoreConfig, TrainConfig, load_config, split_override

    sets = dict(split_override(t) for t in ["dataset.split=2023", "dataset.id_column=#id", "model=010", "dataset.system_prompt=Be brief.  ",
                                                   "dataset.chat_template=true"])
    cfg = load_config(GenerateConfig, None, sets=sets)
    assert (cfg.dataset.split, cfg.dataset.id_column, cfg.model, cfg.dataset.system_prompt) == ("2023", "#id", "010", "Be brief.  ")
    assert load_config(ScoreConfig, None, sets=dict([split_override("verifier=regex:answer is (\\d+) # x")])).verifier == "regex:answer is (\\d+) # x"
    train = load_config(TrainConfig, None, sets=dict(split_override(t) for t in ["lr=1e-6", "max_steps=null", "lora_target_modules=[q_proj]", "loss_options.clip=0.2"]))
    assert (train.lr, train.max_steps, train.lora_target_modules, train.loss_options) == (1e-6, None, ["q_proj"], {"clip": 0.2})
    # an optional string field takes null as None: the text "null" became a system prompt, a KL reference, a project
    unset = dict(split_override(t) for t in ["ref_model=null", "tracking.project=~"])
    assert (load_config(TrainConfig, None, sets=unset).ref_model, load_config(TrainConfig, None, sets=unset).tracking.project) == (None, None)
    assert load_config(GenerateConfig, None, sets={"dataset.system_prompt": "null", "dataset.split": "null"}).dataset.system_prompt is None
    assert load_config(GenerateConfig, None, sets={"dataset.split": "null"}).dataset.split == "null"  # a str field: its text


def test_a_section_left_empty_is_its_defaults_everywhere(tmp_path):
    """`generate:` with nothing under it: the defaults, for `topr iterate` as for `topr generate` (iterate refused
    it as 'expected a mapping'); an old `tensorboard: true` beside an empty `tracking:` migrates (a TypeError)."""
    from toprcli.config import GenerateConfig, IterateConfig, TrainConfig, load_config

    f = tmp_path / "run.yaml"
    f.write_text("rounds: 1\ngenerate:\n  sampling:\ntrain:\n  tensorboard: true\ntracking:\n")
    cfg = load_config(IterateConfig, f)
    assert cfg.generate == GenerateConfig() and cfg.tracking.report_to == ["tensorboard"]
    assert load_config(GenerateConfig, f) == GenerateConfig()
    t = tmp_path / "train.yaml"
    t.write_text("tensorboard: true\ntracking:\n")
    assert load_config(TrainConfig, t).tracking.report_to == ["tensorboard"]


def test_a_section_given_in_part_keeps_the_rest_of_its_parents_default(tmp_path):
    """eval's dataset defaults to the test split and its sampling to seed 1234, the pipeline's curate to
    unreachable_baseline 0: naming only an eval dataset (file or flag) evaluated on the train split."""
    from toprcli.config import EvalConfig, IterateConfig, load_config

    f = tmp_path / "run.yaml"
    f.write_text("eval:\n  dataset: {source: openai/gsm8k}\n  sampling: {temperature: 0.7}\ncurate:\n  positive_fraction: 0.5\n")
    cfg = load_config(IterateConfig, f)
    assert (cfg.eval.dataset.split, cfg.eval.sampling.seed, cfg.curate.unreachable_baseline) == ("test", 1234, 0.0)
    assert (cfg.eval.dataset.source, cfg.eval.sampling.temperature, cfg.curate.positive_fraction) == ("openai/gsm8k", 0.7, 0.5)
    flags = load_config(EvalConfig, None, {"dataset.source": "openai/gsm8k", "sampling.temperature": 0.7})
    assert (flags.dataset.split, flags.sampling.seed) == ("test", 1234)
    assert load_config(EvalConfig, f).dataset.split == "test"  # eval's own section of the pipeline file


def test_lora_dropout_is_refused_for_losses_that_read_mu():
    """Dropout in the LoRA modules stayed on while training (the base model's is off): π was random, and the ratio
    π/μ carried dropout noise. SFT reads no μ, so it may keep it."""
    from toprcli.config import TrainConfig

    with pytest.raises(ConfigError, match="lora_dropout 0.1 with loss topr: dropout makes π random"):
        load_config(TrainConfig, None, sets={"lora_rank": 8, "lora_dropout": 0.1})
    assert load_config(TrainConfig, None, sets={"lora_rank": 8, "lora_dropout": 0.1, "loss": "sft"}).lora_dropout == 0.1


def test_a_mappings_keys_and_values_are_of_its_types(tmp_path):
    """verifier_by_source {foo: 5} reached score and crashed it (a traceback); a data_source with dots
    (lighteval/MATH-v1.5) given with --set was split into nested mappings."""
    from toprcli.config import ScoreConfig

    with pytest.raises(ConfigError, match="bad value for 'verifier_by_source'.*a mapping of a string to a string"):
        load_config(ScoreConfig, overrides={"verifier_by_source": {"foo": 5}})
    (tmp_path / "s.yaml").write_text("verifier_by_source: {5: math}\n")
    with pytest.raises(ConfigError, match="verifier_by_source"):
        load_config(ScoreConfig, tmp_path / "s.yaml")
    cfg = load_config(ScoreConfig, sets={"verifier_by_source.lighteval/MATH-v1.5": "math"})
    assert cfg.verifier_by_source["lighteval/MATH-v1.5"] == "math" and cfg.verifier_by_source["openai/gsm8k"] == "gsm8k"
    r = runner.invoke(app, ["score", "-s", "x", "-o", "y", "--verifier-by-source", "foo=5"])
    assert r.exit_code == 2 and "bad value for 'verifier_by_source'" in r.output and len(r.output.strip().splitlines()) == 1


def test_set_below_a_field_that_is_no_mapping_is_one_error():
    with pytest.raises(ConfigError, match=r"--set lr.x: 'lr' is a number, not a mapping — write --set lr=VALUE"):
        load_config(TrainConfig, sets={"lr.x": "1"})
    with pytest.raises(ConfigError, match=r"'sampling.top_p' is a number"):
        load_config(GenerateConfig, sets={"sampling.top_p.x": "1"})


def test_a_flag_reaches_into_a_section_left_empty(tmp_path):
    """`sampling:` left empty is its defaults; a flag or --set into it said 'sampling is not a mapping'."""
    (tmp_path / "g.yaml").write_text("generate:\n  sampling:\n  n: 4\ntrain:\ntracking:\n")
    assert load_config(GenerateConfig, tmp_path / "g.yaml", {"sampling.top_p": 0.9}).sampling.top_p == 0.9
    assert load_config(IterateConfig, tmp_path / "g.yaml", {"tracking.tags": {"a": "b"}}, sets={"train.lr": "1e-4"}).train.lr == 1e-4


@pytest.mark.parametrize("yaml_text, words", [
    ("curate:\n  baseline: batch_mean\n", "bad value for 'curate.baseline': 'batch_mean'"),
    ("curate:\n  baseline: 0.5\n  positive_fraction: 0.2\n", "both given"),
    ("curate:\n  positive_fraction: 0.2\n  std_normalize: group\n", "std_normalize: group"),
    ("replay_weight: -1\n", "bad value for 'replay_weight'"),  # (a pipeline's source weights: curate.source_weights is each round's)
    ("curate:\n  unreachable_baseline: .nan\n", "expected a finite number"),
    ("train:\n  entropy_coef: .inf\n", "expected a finite number"),
    ("train:\n  epochs: .inf\n", "expected a finite number > 0"),
])
def test_config_check_refuses_what_a_stage_would_refuse_later(tmp_path, yaml_text, words):
    """These passed `topr config check`, and iterate ran round 0's generate and score before curate refused them
    (or, for NaN, wrote NaN advantages)."""
    (tmp_path / "p.yaml").write_text(yaml_text)
    r = runner.invoke(app, ["config", "check", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("key, meant", [("traing", "train"), ("evals", "eval"), ("scor", "score"), ("warm_starts", "warm_start"),
                                        ("generat", "generate"), ("tracker", "tracking")])
def test_a_misspelt_section_is_named(key, meant):
    with pytest.raises(ConfigError, match=f"'{key}' \\(did you mean '{meant}'\\?\\)"):
        load_config(IterateConfig, None, {key: 1})


def test_a_flag_without_key_value_names_itself():
    r = runner.invoke(app, ["train", "-m", "a", "-d", "b", "-o", "c", "--loss-option", "beta"])
    assert r.exit_code == 2 and "--loss-option 'beta': write it as KEY=VALUE, e.g. --loss-option name=value" in r.output, r.output


def test_set_reads_an_integer_as_its_flag_does():
    """YAML 1.1 reads 010 as 8: `--set seed=010` and `--seed 010` gave different seeds."""
    assert load_config(CurateConfig, sets={"seed": "010"}).seed == 10 == load_config(CurateConfig, None, {"seed": 10}).seed


def test_a_key_written_twice_is_refused_with_its_lines(tmp_path):
    """YAML's last key silently won: `train: {lr: 0.001}` then `train: {loss: sft}` dropped the lr, and config check said ok."""
    from toprcli.config import read_yaml

    dup = tmp_path / "dup.yaml"
    dup.write_text("train: {lr: 0.001}\nrounds: 2\ntrain: {loss: sft}\n")
    with pytest.raises(ConfigError, match=r"dup.yaml: line 3 is not valid YAML \(key 'train' is written twice \(also on line 1\)"):
        read_yaml(dup)
    inner = tmp_path / "inner.yaml"
    inner.write_text("train:\n  lr: 1\n  lr: 2\n")
    with pytest.raises(ConfigError, match=r"line 3 .*'lr' is written twice"):
        read_yaml(inner)
    merged = tmp_path / "merged.yaml"  # a merge key is not a duplicate
    merged.write_text("base: &b {lr: 1}\ntrain:\n  <<: *b\n  loss: sft\n")
    assert read_yaml(merged)["train"] == {"lr": 1, "loss": "sft"}
    with pytest.raises(ConfigError, match="is a directory — pass a YAML config file"):
        read_yaml(tmp_path)


def test_config_check_refuses_a_model_that_is_not_there(tmp_path):
    """`model: ./models/nosuch` passed config check; iterate refused it at once. A config without a model is a config for
    `iterate --model`: fine."""
    (tmp_path / "m.yaml").write_text("model: ./models/nosuch\n")
    r = runner.invoke(app, ["config", "check", str(tmp_path / "m.yaml")])
    assert r.exit_code == 2 and "model dir not found: ./models/nosuch" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "none.yaml").write_text("rounds: 1\n")
    assert runner.invoke(app, ["config", "check", str(tmp_path / "none.yaml")]).exit_code == 0


@pytest.mark.parametrize("key", ["train.seed", "generate.sampling.seed", "eval.bootstrap_seed", "curate.seed"])
def test_a_seed_outside_what_torch_and_numpy_take_is_refused(tmp_path, key):
    """A seed of 2**64 was an OverflowError traceback where torch seeded; -1 failed in numpy's default_rng."""
    from toprcli.config import IterateConfig

    for bad in (-1, 2**64):
        with pytest.raises(ConfigError, match=r"expected an integer in \[0, 2\*\*63\)"):
            load_config(IterateConfig, None, sets={key: str(bad)})


def test_report_to_takes_what_trl_users_write(tmp_path):
    """`report_to: wandb` (TRL's form) was 'expected a list of a string'; `--report-to wandb,mlflow` and `none` were refused."""
    from toprcli.config import TrainConfig, load_config

    (tmp_path / "t.yaml").write_text("tracking: {report_to: wandb}\n")
    assert load_config(TrainConfig, tmp_path / "t.yaml").tracking.report_to == ["wandb"]
    assert load_config(TrainConfig, None, {"tracking.report_to": ["wandb,mlflow", "tensorboard"]}).tracking.report_to == ["wandb", "mlflow", "tensorboard"]
    assert load_config(TrainConfig, None, sets={"report_to": "none"}).tracking.report_to == []
    (tmp_path / "old.yaml").write_text("tensorboard: true\ntracking: {report_to: wandb}\n")  # before trackers, with TRL's form
    assert load_config(TrainConfig, tmp_path / "old.yaml").tracking.report_to == ["wandb", "tensorboard"]
    with pytest.raises(ConfigError, match=r"'tracking.report_to': \['wandb', 'comet'\] — expected a list of tensorboard"):
        load_config(TrainConfig, None, {"tracking.report_to": ["wandb,comet"]})


def test_config_check_takes_the_stage_config_config_show_writes(tmp_path):
    """`topr config show train > t.yaml && topr config check t.yaml` refused ~45 keys as moved (to train.*), though
    `topr train -c t.yaml` takes the file: a stage's config is checked as that stage's, found or named with --stage."""
    shown = CliRunner().invoke(app, ["config", "show", "train"]).stdout
    (tmp_path / "t.yaml").write_text(shown)
    r = CliRunner().invoke(app, ["config", "check", str(tmp_path / "t.yaml")])
    assert r.exit_code == 0 and "is a valid train config" in r.stderr, r.output
    (tmp_path / "t.yaml").write_text(shown.replace("\nlr: 5.0e-07", "\nlr: -1"))
    r = CliRunner().invoke(app, ["config", "check", str(tmp_path / "t.yaml")])
    assert r.exit_code == 2 and "bad value for 'lr': -1" in r.output, r.output
    r = CliRunner().invoke(app, ["config", "check", str(tmp_path / "t.yaml"), "--stage", "generate"])
    assert r.exit_code == 2 and "unknown config keys" in r.output
    (tmp_path / "t.yaml").write_text(shown.replace("\nloss_options: {}", "\nloss_options: {bogus_option: 3}"))  # as `topr train` checks
    r = CliRunner().invoke(app, ["config", "check", str(tmp_path / "t.yaml")])
    assert r.exit_code == 2 and "bogus_option" in r.output, r.output


def test_pairs_for_a_loss_that_reads_rows_one_by_one_is_said():
    """A DPO config's curate.pairs carried into a TOPR branch trained each round on paired rows only (32 of 192 kept),
    in silence."""
    from toprcli.config import IterateConfig, load_config

    with pytest.warns(UserWarning, match="curate.pairs is matched but train.loss topr reads rows one by one"):
        load_config(IterateConfig, None, sets={"curate.pairs": "matched"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(IterateConfig, None, sets={"curate.pairs": "matched", "train.loss": "dpo"})


def test_a_config_warning_is_one_line(tmp_path):
    """The curate.pairs warning came as Python's two-line form (`fields.py:186: UserWarning: ...` and the source line):
    topr's own warnings were one line only once output went to a log."""
    import subprocess
    import sys

    (tmp_path / "p.yaml").write_text("curate: {pairs: matched}\n")
    done = subprocess.run([sys.executable, "-m", "toprcli", "config", "check", str(tmp_path / "p.yaml")], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 0 and lines[0].startswith("warning: curate.pairs is matched") and "UserWarning" not in done.stderr, done.stderr


def test_a_config_built_in_python_is_checked_by_its_stage_as_a_files_would_be(tmp_path):
    """Configs built in Python skipped every check: batch_size 0 hung the trainer (a step plan that never grew), workers
    -1 the scorer, a dict for sampling was an AttributeError; data_parallel_size 2 and nproc_per_node 2 ran in one
    process, in silence (the launch functions start the children)."""
    from toprcli.config import GenerateConfig, ScoreConfig, TrainConfig, validated
    from toprcli.errors import UserError
    from toprcli.stages import generate, score, train

    with pytest.raises(ConfigError, match="bad value for 'batch_size': 0"):
        train.run(TrainConfig(model="m", data="d", out=str(tmp_path / "p"), batch_size=0))
    with pytest.raises(ConfigError, match="bad value for 'workers': -1"):
        score.run(ScoreConfig(samples="s", out=str(tmp_path / "s"), workers=-1))
    assert validated(GenerateConfig(sampling={"temperature": 0.7})).sampling.temperature == 0.7  # as YAML gives it
    with pytest.raises(UserError, match=r"call toprcli.launch.run_generate\(cfg\)"):
        generate.run(GenerateConfig(model="m", out=str(tmp_path / "g"), data_parallel_size=2))
    with pytest.raises(UserError, match=r"call toprcli.launch.run_train\(cfg\)"):
        train.run(TrainConfig(model="m", data="d", out=str(tmp_path / "t"), nproc_per_node=2))
    assert list(tmp_path.iterdir()) == []


def test_recompute_behavior_in_a_pipeline_needs_each_round_trained_from_its_sampler(tmp_path):
    """The 8B configs recompute μ: a warm start (gold rows, no sampler) and rounds that replay or train from the base
    were refused at their training, after the round had generated and scored."""
    from toprcli.config import IterateConfig, load_config

    cfg = load_config(IterateConfig, None, sets={"train.recompute_behavior": "true", "warm_start.enabled": "true"})
    assert cfg.warm_start_train().recompute_behavior is False
    for key, value in (("replay_rounds", "1"), ("train_from", "base")):
        with pytest.raises(ConfigError, match="recompute_behavior recomputes μ with the policy a round trains from"):
            load_config(IterateConfig, None, sets={"train.recompute_behavior": "true", key: value})
