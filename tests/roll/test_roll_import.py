"""`topr config import-roll` (toprcli/roll/: importer, rules, loss_rules, keys, interp).

The fixtures in tests/fixtures/roll/ are written for toprcli from the settings of two
alibaba/ROLL example configs (Apache-2.0, commit 8eb27cc); see their headers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import FIXTURES
from toprcli.cli.main import app
from toprcli.config import IterateConfig, TrainConfig, from_dict
from toprcli.errors import UserError
from toprcli.roll.importer import LEFT_OUT, MAPPED, UNKNOWN, import_roll
from toprcli.roll.interp import resolve
from toprcli.roll.placement import device_count

DATA = FIXTURES / "roll"
OFFPOLICY = DATA / "rlvr_offpolicy_topr.yaml"
EXAMPLE_TOPR = DATA / "example_topr.yaml"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def rows(result) -> dict:
    return {r.key: r for r in result.rows}


def minimal(**top) -> dict:
    """The smallest ROLL file: a model, a length, a PG worker."""
    data = {
        "pretrain": "m",
        "response_length": 64,
        "actor_train": {"worker_cls": "roll.pipeline.rlvr.actor_pg_worker.ActorPGWorker", "pg_variant": "topr"},
        "actor_infer": {"generating_args": {"temperature": 1.0, "top_p": 1.0, "top_k": -1}},
    }
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


@pytest.fixture
def cli():
    return CliRunner()


# -- interpolation ------------------------------------------------------------------------------


def test_interpolation_absolute_relative_typed_and_in_text():
    data = {
        "n": 8,
        "name": "run-${n}-${a.b}",
        "a": {"b": "x", "c": "${.b}", "d": {"e": "${..b}", "f": "${n}"}},
        "lst": [1, "${lst[0]}", "${lst.0}"],
        "flag": True,
        "text": "on=${flag} none=${nothing}",
        "nothing": None,
        "lit": "\\${not.a.ref}",
        "nested": "${a.${key}}",
        "key": "b",
    }
    out = resolve(data)
    d = out.data
    assert d["name"] == "run-8-x"
    assert d["a"]["c"] == "x" and d["a"]["d"]["e"] == "x"
    assert d["a"]["d"]["f"] == 8 and isinstance(d["a"]["d"]["f"], int)  # a whole-value reference keeps its type
    assert d["lst"] == [1, 1, 1]
    assert d["text"] == "on=True none=None"  # what OmegaConf 2.3 gives (str of the value)
    assert d["lit"] == "${not.a.ref}"
    assert d["nested"] == "x"
    assert out.unresolved == {}


def test_interpolation_as_omegaconf_through_references_and_with_escaped_literals():
    """Both checked against OmegaConf 2.3: a reference through a node that is itself a reference, and an escaped
    literal substituted into text (it was read again and refused as a reference to an undefined key)."""
    d = resolve({"base": {"tp": 2}, "x": "${base}", "y": "${x.tp}", "tag": "\\${x}", "exp_name": "run-${tag}"}).data
    assert d["y"] == 2 and d["x"] == {"tp": 2}
    assert d["tag"] == "${x}" and d["exp_name"] == "run-${x}"
    with pytest.raises(UserError, match="'x.pp', which the file does not define"):
        resolve({"base": {"tp": 2}, "x": "${base}", "y": "${x.pp}"})


def test_interpolation_resolvers_are_reported_not_evaluated():
    out = resolve({"home": "${oc.env:HOME}", "copy": "${home}", "dir": "${home}/x", "ok": 1})
    assert out.data["home"] == "${oc.env:HOME}"
    assert set(out.unresolved) == {"home", "copy", "dir"}


@pytest.mark.parametrize(
    "data, message",
    [
        ({"a": "${b}", "b": "${c}", "c": "${a}"}, "interpolation cycle: a → b → c → a"),
        ({"a": {"b": "${a}"}}, "interpolation cycle"),
        ({"a": "${missing.key}"}, "refers to 'missing.key', which the file does not define"),
        ({"a": "x${b}", "b": {"c": 1}}, "refers to a mapping or list"),
    ],
)
def test_interpolation_errors_are_one_line(data, message):
    with pytest.raises(UserError, match=message):
        resolve(data)


def test_unresolved_value_is_refused_only_where_it_is_mapped():
    result = import_roll(minimal(output_dir="${oc.env:HOME}/out"))  # left out anyway: fine
    assert "unresolved" in rows(result)["output_dir"].detail
    with pytest.raises(UserError, match="pretrain.*resolver"):
        import_roll(minimal(pretrain="${oc.env:MODEL}"))


# -- the two examples (the "done when") -------------------------------------------------


def test_offpolicy_example_with_negative_weight_imports_as_topr(tmp_path):
    result = import_roll(load(OFFPOLICY))
    assert result.unknown == []
    cfg = from_dict(IterateConfig, result.config)  # what `topr config check` validates
    assert cfg.model == "Qwen/Qwen2.5-7B"
    assert cfg.train.loss == "topr"
    assert cfg.train.loss_options == {"ratio_level": "token", "negative_weight": 0.5}
    assert cfg.generate.n == 8
    s = cfg.generate.sampling
    assert (s.max_new_tokens, s.temperature, s.top_p, s.top_k) == (8192, 0.99, 0.99, 100)
    assert cfg.train.lr == 1e-6 and cfg.train.optimizer == "adamw"
    assert cfg.train.whiten_advantages is True and cfg.train.adv_clip == 2.0
    # sampling comes from the data at training time: the import never sets train's copy
    assert (cfg.train.temperature, cfg.train.top_p, cfg.train.top_k) == (None, None, None)
    assert (cfg.eval.sampling.temperature, cfg.eval.sampling.top_p, cfg.eval.sampling.top_k, cfg.eval.k) == (0.6, 0.6, 50, 1)
    assert cfg.eval.sampling.max_new_tokens == 8192
    assert cfg.train.batch_size == 1 * 64 * 16  # per device × accumulation × 16 data-parallel ranks
    assert (cfg.train.warmup_steps, cfg.train.dtype, cfg.train.gradient_checkpointing) == (20, "bfloat16", True)
    assert cfg.run_dir == "runs/Qwen2.5-7B-RLVR-topr"  # exp_name, interpolated
    c = cfg.curate
    assert (c.baseline, c.std_normalize, c.reward_clip, c.drop_truncated, c.keep_accuracy) == (
        "batch-mean", "batch", 10.0, True, [0.1, 0.95]
    )
    assert (cfg.score.verifier, cfg.score.reward_correct, cfg.score.reward_incorrect) == ("math", 1.0, 0.0)
    r = rows(result)
    assert r["actor_train.topr_negative_weight"].status == MAPPED
    assert "negative_weight = 0.5" in r["actor_train.topr_negative_weight"].detail
    assert r["dual_clip_loss"].status == LEFT_OUT and "only ROLL's ppo" in r["dual_clip_loss"].detail
    assert r["actor_train.strategy_args.strategy_config.tensor_model_parallel_size"].status == LEFT_OUT
    assert "not a ROLL config field" in r["actor_train.data_args.dataset_dir"].detail
    assert all(row.detail for row in result.rows)  # every key says what it maps to, or why not
    assert [c.split(" (")[0].split(":")[0] for c in result.callouts] == [  # no scheduler given: ROLL's linear decay; its warm-up
        "actor_train.training_args.lr_scheduler_type is not set", "the learning-rate schedule restarts every round here"]


def test_example_topr_calls_out_the_documented_but_unread_keys():
    result = import_roll(load(EXAMPLE_TOPR))
    assert result.unknown == []
    r = rows(result)
    for key, reads in (("positive_loss_coef", "topr_positive_weight"), ("use_topr_neg_loss_coef", "topr_negative_weight")):
        assert r[key].status == LEFT_OUT and reads in r[key].detail
        assert any(c.startswith(key) and reads in c for c in result.callouts)
    # rl_loss_coef IS read by ROLL (a loss scale), and 0.0 switches the policy loss off
    assert any(c.startswith("rl_loss_coef: 0.0") and "multiplies" in c for c in result.callouts)
    # no pg_variant: ROLL's ActorWorker trains PPO-clip, and the import says so
    cfg = from_dict(IterateConfig, result.config)
    assert cfg.train.loss == "ppo" and cfg.train.loss_options == {"clip_ratio": 0.2, "dual_clip": pytest.approx(1.4)}
    assert any("never TOPR" in c for c in result.callouts)
    assert (cfg.train.kl_coef, cfg.train.kl_estimator, cfg.train.ref_model) == (0.001, "k3", "Qwen/Qwen2.5-7B")
    assert cfg.generate.engine.gpu_memory_utilization == 0.8 and cfg.generate.engine.max_model_len == 8000
    assert r["rewards.math_rule.worker_cls"].status == LEFT_OUT  # five reward domains: no single verifier
    assert "adv_estimator" in " ".join(result.callouts)  # gae needs a critic


def test_every_variant_gives_options_the_trainer_accepts():
    from toprcli.training.prepare import resolve_loss

    knobs = {"tis_upper_bound": 2.0, "cispo_epsilon_high": 0.3, "kimi15_tau": 0.2, "topr_positive_weight": 0.8}
    for variant, loss in (("vanilla", "reinforce"), ("ppo", "ppo"), ("tis", "tis"), ("topr", "topr"), ("cispo", "cispo"), ("kimi15", "kimi15")):
        data = minimal(actor_train={"pg_variant": variant, **knobs}, dual_clip_loss=True, use_pg_clip_range=True, pg_clip_high=0.28)
        result = import_roll(data)
        train = from_dict(IterateConfig, result.config).train
        assert train.loss == loss
        setup = resolve_loss(TrainConfig(loss=train.loss, loss_options=train.loss_options))  # runs the loss once
        assert setup.name == loss
    r = rows(import_roll(minimal(actor_train={"pg_variant": "cispo"})))
    assert "clip_low = 0.1, train.loss_options.clip_high = 0.1" in r["actor_train.pg_variant"].detail  # ROLL's defaults


def test_loss_knobs_by_hand():
    res = import_roll(minimal(actor_train={"pg_variant": "tis", "tis_lower_bound": 0.1}, tis_upper_bound=2))
    assert res.config["train"]["loss_options"] == {"ratio_level": "token", "lower": 0.1, "upper": 2.0}
    r = rows(res)
    assert "dacite" not in r["tis_upper_bound"].detail and "drops it" in r["tis_upper_bound"].detail
    res = import_roll(minimal(pg_clip=0.1, dual_clip_loss=True, use_pg_clip_range=True, pg_clip_low=0.2, pg_clip_high=0.28,
                              actor_train={"pg_variant": "ppo"}))
    assert res.config["train"]["loss_options"] == {"clip_ratio": 0.1, "clip_low": 0.2, "clip_high": 0.28, "dual_clip": pytest.approx(1.2)}
    res = import_roll(minimal(actor_train={"pg_variant": "vanilla", "topr_negative_weight": 0.5}))
    assert res.config["train"]["loss"] == "reinforce" and "loss_options" not in res.config["train"]
    assert "only ROLL's topr loss reads it" in rows(res)["actor_train.topr_negative_weight"].detail
    # a topr weight at the top level is imported, with a word that ROLL reads actor_train's only
    res = import_roll(minimal(topr_positive_weight=2.0))
    assert res.config["train"]["loss_options"]["positive_weight"] == 2.0
    assert "ignores this top-level value" in rows(res)["topr_positive_weight"].detail


def test_pg_variant_rules_and_refusals():
    res = import_roll(minimal(actor_train={"pg_variant": None}, pg_variant="kimi15", exp_name="x-${pg_variant}"))
    assert res.config["train"]["loss"] == "kimi15" and res.config["run_dir"] == "runs/x-kimi15"
    assert any("only at the top level" in c for c in res.callouts)
    res = import_roll({**minimal(), "actor_train": {"pg_variant": "topr"}})  # no ActorPGWorker
    assert any("worker_cls is not set" in c for c in res.callouts)
    with pytest.raises(UserError, match="'grpo' is not a ROLL pg_variant"):
        import_roll(minimal(actor_train={"pg_variant": "grpo"}))
    with pytest.raises(UserError, match="ROLL itself refuses"):
        import_roll(minimal(actor_train={"pg_variant": None}))
    with pytest.raises(UserError, match="neither response_length nor sequence_length"):
        import_roll({k: v for k, v in minimal().items() if k != "response_length"})
    with pytest.raises(UserError, match="learning_rate: 'fast' is not a number"):
        import_roll(minimal(actor_train={"training_args": {"learning_rate": "fast"}}))


def test_lengths_normalisation_and_legacy_reward_norm():
    res = import_roll(minimal(prompt_length=100, sequence_length=612, val_prompt_length=12, val_sequence_length=44))
    assert res.config["generate"]["sampling"]["max_new_tokens"] == 512
    assert res.config["eval"]["sampling"]["max_new_tokens"] == 32
    res = import_roll(minimal(adv_estimator="grpo", norm_mean_type="batch"))
    assert (res.config["curate"]["baseline"], res.config["curate"]["std_normalize"]) == ("group-mean", "group")
    assert "grpo overrides it" in rows(res)["norm_mean_type"].detail
    res = import_roll(minimal(reward_norm="group", reward_shift=True))
    assert res.config["curate"] == {"baseline": "group-mean"}  # shift: mean only
    assert "older ROLL key" in rows(res)["reward_norm"].detail
    res = import_roll(minimal(norm_mean_type="running", norm_std_type="group", loss_agg_mode="seq-mean-token-sum-norm"))
    assert res.config["curate"] == {"baseline": "batch-mean", "std_normalize": "group"}
    # ROLL divides by its loss mask's width: prompt_length (default 1024) + response_length (64) − 1
    assert (res.config["train"]["aggregation"], res.config["train"]["norm_length"]) == ("seq-mean-token-sum-norm", 1024 + 64 - 1)


def test_difficulty_mask_needs_groups_and_thresholds_are_validated():
    res = import_roll(minimal(difficulty_mask=True, num_return_sequences_in_group=1))
    assert "curate" not in res.config and "only with num_return_sequences_in_group > 1" in rows(res)["difficulty_mask"].detail
    res = import_roll(minimal(difficulty_mask=True, num_return_sequences_in_group=4))
    assert res.config["curate"]["keep_accuracy"] == [0.0, 1.0]  # RLVRConfig's default thresholds
    with pytest.raises(UserError, match="does not validate.*keep_accuracy"):
        from toprcli.roll.importer import validate

        validate(import_roll(minimal(difficulty_mask=True, num_return_sequences_in_group=4, difficulty_low_threshold=0.9,
                                     difficulty_high_threshold=0.1)))
    # Legal in ROLL, and they mean what they say: -0.1 keeps the prompts no sample solved (once refused as invalid).
    res = import_roll(minimal(difficulty_mask=True, num_return_sequences_in_group=4, difficulty_low_threshold=-0.1,
                              difficulty_high_threshold=1.1))
    from toprcli.roll.importer import validate

    assert validate(res).curate.keep_accuracy == [-0.1, 1.1]


def test_greedy_rollouts_are_refused_and_greedy_validation_maps_to_eval_greedy():
    hf_infer = {"strategy_args": {"strategy_name": "hf_infer"}}
    with pytest.raises(UserError, match="greedy rollouts"):
        import_roll(minimal(actor_infer={"generating_args": {"do_sample": False}, **hf_infer}))
    # vLLM (and SGLang) never read do_sample: ROLL samples at the temperature given, and so does the import.
    res = import_roll(minimal(actor_infer={"generating_args": {"do_sample": False, "temperature": 0.99},
                                           "strategy_args": {"strategy_name": "vllm"}},
                              validation={"generating_args": {"do_sample": False, "temperature": 0.6, "num_return_sequences": 4}}))
    assert res.config["generate"]["sampling"]["temperature"] == 0.99 and res.config["eval"]["sampling"]["temperature"] == 0.6
    assert res.config["eval"]["k"] == 4 and "greedy" not in res.config["eval"]
    assert rows(res)["actor_infer.generating_args.do_sample"].status == LEFT_OUT
    res = import_roll(minimal(validation={"generating_args": {"temperature": 0, "num_return_sequences": 1}}))
    assert res.config["eval"]["greedy"] is True and "temperature" not in res.config["eval"]["sampling"]
    res = import_roll(minimal(actor_infer={"generating_args": {"temperature": 0.7}}))
    assert res.config["generate"]["sampling"]["top_p"] == 0.7  # ROLL's default where the file is silent
    assert any("top_p is not set" in c for c in res.callouts)


def test_one_validation_length_without_the_other_is_refused_as_roll_refuses_it():
    with pytest.raises(UserError, match="val_prompt_length is set without val_sequence_length"):
        import_roll(minimal(val_prompt_length=512))
    with pytest.raises(UserError, match="null"):
        import_roll(minimal(prompt_length=None))  # once a TypeError traceback


def test_a_silent_file_gets_rolls_defaults_not_toprs():
    """ROLL's group of 1, lr 5e-5 and 8 sequences per device where the file says nothing (topr's own: 16, 5e-7, 64)."""
    res = import_roll(minimal(actor_train={"device_mapping": "list(range(0,4))"}))
    assert (res.config["generate"]["n"], res.config["train"]["lr"], res.config["train"]["batch_size"]) == (1, 5e-5, 8 * 4)
    assert sum("is not set: " in c for c in res.callouts) >= 3


def test_each_workers_own_model_is_used_when_all_three_set_one():
    paths = {w: {"model_args": {"model_name_or_path": "/ckpt/sft" if w != "reference" else "/ckpt/ref"}}
             for w in ("actor_train", "actor_infer", "reference")}
    res = import_roll(minimal(**paths, use_kl_loss=True, kl_loss_coef=0.01))
    assert res.config["model"] == "/ckpt/sft" and res.config["train"]["ref_model"] == "/ckpt/ref"
    assert rows(res)["pretrain"].status == LEFT_OUT
    one = import_roll(minimal(actor_train={"model_args": {"model_name_or_path": "/ckpt/sft"}}))
    assert one.config["model"] == "m"  # not all three: ROLL gives every worker pretrain


def test_lora_is_on_exactly_when_lora_target_is_set_with_rolls_rank_and_alpha():
    args = lambda **kw: minimal(actor_train={"model_args": kw})  # noqa: E731
    res = import_roll(args(lora_target="all-linear"))
    assert (res.config["train"]["lora_rank"], res.config["train"]["lora_alpha"], res.config["train"]["lora_target_modules"]) == (8, 16, None)
    res = import_roll(args(lora_rank=64, lora_target="q_proj,v_proj"))
    assert (res.config["train"]["lora_rank"], res.config["train"]["lora_alpha"]) == (64, 128)
    res = import_roll(args(lora_rank=64))  # no target: ROLL trains the full model
    assert "lora_rank" not in res.config["train"] and rows(res)["actor_train.model_args.lora_rank"].status == LEFT_OUT


def test_catalogue_tells_roll_keys_from_typos():
    data = minimal(
        whiten_advantage=True,  # typo
        tracker_kwargs={"anything": {"goes": 1}},  # free mapping
        rewards={"mine": {"worker_cls": "my.Worker", "query_filter_config": {"type": "mean_filter", "filter_args": {"x": 1}}}},
        teacher={"teacher_14B": {"model_args": {"dtype": "bf16"}}},
        reward_norm=None,  # legacy
        actor_infer={"model_args": {"flash_attn": "fa2"}, "cispo_epsilon_low": 0.2, "generating_args": {"top_kk": 5}},
    )
    r = rows(import_roll(data))
    assert r["whiten_advantage"].status == UNKNOWN and "did you mean whiten_advantages" in r["whiten_advantage"].detail
    assert r["actor_infer.generating_args.top_kk"].status == UNKNOWN
    assert "generating_args.top_k?" in r["actor_infer.generating_args.top_kk"].detail
    for key in ("tracker_kwargs.anything.goes", "rewards.mine.query_filter_config.filter_args.x", "teacher.teacher_14B.model_args.dtype",
                "reward_norm", "actor_infer.model_args.flash_attn", "actor_infer.cispo_epsilon_low"):
        assert r[key].status == LEFT_OUT, key
    assert "actor_train only" in r["actor_infer.cispo_epsilon_low"].detail


def test_device_count():
    assert device_count("list(range(0,16))") == 16
    assert device_count("list(range(12, 16))") == 4
    assert device_count("list(range(0,16,2))") == 8
    assert device_count([0, 1, 2]) == 3 and device_count("[0, 1]") == 2
    assert device_count("gpu0") is None and device_count(None) is None


# -- the command ------------------------------------------------------------------------------


def test_cli_writes_a_config_that_passes_check(tmp_path, cli):
    out = tmp_path / "topr.yaml"
    res = cli.invoke(app, ["config", "import-roll", str(OFFPOLICY), "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "actor_train.topr_negative_weight" in res.output and "left out" in res.output and "0 unknown" in res.output
    assert out.read_text().startswith("# topr pipeline config imported from the ROLL config")
    check = cli.invoke(app, ["config", "check", str(out)])
    assert check.exit_code == 0, check.output
    resolved = yaml.safe_load(check.stdout)
    assert resolved["train"]["loss_options"]["negative_weight"] == 0.5 and resolved["generate"]["n"] == 8
    # an existing --out is kept unless --overwrite
    res = cli.invoke(app, ["config", "import-roll", str(EXAMPLE_TOPR), "--out", str(out)])
    assert res.exit_code == 2 and "already exists" in res.output
    res = cli.invoke(app, ["config", "import-roll", str(EXAMPLE_TOPR), "--out", str(out), "--overwrite"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "call-out" in res.output and "positive_loss_coef" in res.output
    assert yaml.safe_load(out.read_text())["train"]["loss"] == "ppo"
    assert [p.name for p in tmp_path.iterdir()] == ["topr.yaml"]  # no temporary left behind


def test_cli_refuses_a_misspelt_key_and_writes_nothing(tmp_path, cli):
    text = EXAMPLE_TOPR.read_text().replace("\nwhiten_advantages: true", "\nwhiten_advantage: true")
    assert "whiten_advantage: true" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    out = tmp_path / "topr.yaml"
    res = cli.invoke(app, ["config", "import-roll", str(bad), "--out", str(out)])
    assert res.exit_code == 2
    assert "1 unknown key(s)" in res.output and "whiten_advantage (not a ROLL key; did you mean whiten_advantages?)" in res.output
    assert "--allow-unknown" in res.output and not out.exists()
    res = cli.invoke(app, ["config", "import-roll", str(bad), "--out", str(out), "--allow-unknown", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["unknown"] == ["whiten_advantage"] and out.exists()
    statuses = {r["key"]: r["status"] for r in report["rows"]}
    assert statuses["whiten_advantage"] == "unknown" and statuses["pretrain"] == "mapped"
    assert "whiten_advantages" not in yaml.safe_load(out.read_text())["train"]


def test_cli_errors_and_help(tmp_path, cli):
    res = cli.invoke(app, ["config", "import-roll", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "o.yaml")])
    assert res.exit_code == 2 and "config file not found" in res.output
    cyc = tmp_path / "cycle.yaml"
    cyc.write_text("pretrain: ${exp_name}\nexp_name: ${pretrain}\nresponse_length: 8\n")
    res = cli.invoke(app, ["config", "import-roll", str(cyc), "--out", str(tmp_path / "o.yaml")])
    assert res.exit_code == 2 and "interpolation cycle" in res.output and not (tmp_path / "o.yaml").exists()
    res = cli.invoke(app, ["config", "import-roll", "--help"])
    assert res.exit_code == 0 and "Examples" in res.output and "--allow-unknown" in res.output


def test_rolls_silent_defaults_that_change_the_algorithm_are_called_out():
    """A file without adv_estimator (ROLL: gae, a critic) or lr_scheduler_type (ROLL: linear to 0) imported with no word;
    gamma, which ROLL's reinforce return discounts by, was 'critic / GAE' only."""
    callouts = " ".join(import_roll(minimal()).callouts)
    assert "adv_estimator: not set, ROLL default gae" in callouts and "lr_scheduler_type is not set: ROLL's default is linear" in callouts
    assert "gamma 0.9: ROLL's reinforce discounts" in " ".join(import_roll(minimal(adv_estimator="reinforce", gamma=0.9)).callouts)
    assert not [c for c in import_roll(minimal(adv_estimator="reinforce", gamma=1.0)).callouts if "gamma" in c]


def test_nulls_lora_forms_and_values_of_another_kind():
    """ppo_epochs: null was a TypeError traceback (exit 1); lora_alpha null or 0 (ROLL: 2 × rank) was refused; a regex
    lora_target became a module name that failed at the first training step; a list as a dtype crashed."""
    lora = {"model_args": {"lora_target": "q_proj,v_proj", "lora_rank": 4, "lora_alpha": None}}
    assert import_roll(minimal(actor_train=lora)).config["train"]["lora_alpha"] == 8
    with pytest.raises(UserError, match="ppo_epochs: None is not a value ROLL takes there"):  # ROLL's range(None) fails too
        import_roll(minimal(ppo_epochs=None))
    with pytest.raises(UserError, match="lora_rank is null"):
        import_roll(minimal(actor_train={"model_args": {**lora["model_args"], "lora_rank": None}}))
    assert import_roll(minimal(actor_train={"model_args": {**lora["model_args"], "lora_alpha": 0}})).config["train"]["lora_alpha"] == 8
    with pytest.raises(UserError, match=r"lora_target 'q_proj\|v_proj': ROLL reads it as a regular expression"):
        import_roll(minimal(actor_train={"model_args": {"lora_target": "q_proj|v_proj"}}))
    with pytest.raises(UserError, match=r"actor_train.model_args.dtype: \['bf16'\] is not a value ROLL takes there"):
        import_roll(minimal(actor_train={"model_args": {"dtype": ["bf16"]}}))


def test_device_mappings_as_rolls_examples_write_them():
    """list([0,1,2,3,8,9,10,11]) (ROLL's own separate-placement example) and list(range(8)) were not read: the batch
    came out 8× too small, said to be 'not given'. A form topr cannot read is called out."""
    assert device_count("list([0,1,2,3,8,9,10,11])") == 8 and device_count("list(range(8))") == 8
    base = {"training_args": {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 32}}
    result = import_roll(minimal(actor_train={**base, "device_mapping": "list([0,1,2,3,8,9,10,11])"}))
    assert result.config["train"]["batch_size"] == 256
    odd = import_roll(minimal(actor_train={**base, "device_mapping": "[i for i in range(8)]"}))
    assert odd.config["train"]["batch_size"] == 32 and any("is not a form topr reads" in c for c in odd.callouts)


def test_a_resolver_inside_a_referenced_mapping_is_refused_where_mapped():
    """model_args: ${validation.model_args} holding ${oc.env:MODEL} was written as model: ${oc.env:MODEL}."""
    data = minimal(validation={"model_args": {"model_name_or_path": "${oc.env:MODEL}"}})
    data["actor_train"]["model_args"] = "${validation.model_args}"
    with pytest.raises(UserError, match="actor_train.model_args: '\\$\\{validation.model_args\\}' uses a resolver topr does not evaluate"):
        import_roll(data)


def test_what_the_import_writes_passes_check_or_is_refused_in_one_line(tmp_path, cli):
    """Loss knobs ROLL takes but the loss refuses were written, and config check then refused the file; pg_clip null
    crashed check; a negative entropy coefficient (ROLL: off) failed the first step; malformed sections were tracebacks."""
    from toprcli.roll.importer import validate

    for actor, words in (({"topr_negative_weight": -1}, "negative_weight"),
                         ({"pg_variant": "tis", "tis_lower_bound": 0.5, "tis_upper_bound": 0.2}, "loss 'tis'")):
        with pytest.raises(UserError, match=f"does not validate: .*{words}"):
            validate(import_roll(minimal(actor_train=actor)))
    with pytest.raises(UserError, match="pg_clip: null is not a number"):
        import_roll(minimal(actor_train={"pg_variant": "ppo"}, pg_clip=None))
    assert "entropy_coef" not in import_roll(minimal(entropy_loss_coef=-0.01)).config.get("train", {})
    megatron = {"strategy_args": {"strategy_name": "megatron_train", "strategy_config": {"tensor_model_parallel_size": "auto"}},
                "device_mapping": "list(range(8))"}
    for data, words in ((minimal(actor_train=megatron), "tensor_model_parallel_size: 'auto' is not an integer"),
                        (minimal(rewards={"math_rule": "oops"}), "rewards.math_rule: 'oops' is not a mapping"),
                        (minimal(actor_train={"pg_variant": ["topr"]}), r"actor_train.pg_variant: \['topr'\] is not a ROLL pg_variant")):
        with pytest.raises(UserError, match=words):
            import_roll(data)
    assert import_roll(minimal(actor_train={**megatron, "strategy_args": {**megatron["strategy_args"], "strategy_config": [1, 2]}}))


def test_validation_without_a_sample_count_takes_rolls_one():
    result = import_roll(minimal(validation={"generating_args": {"temperature": 0.6, "top_p": 0.7, "top_k": 50}}))
    assert result.config["eval"]["k"] == 1 and any("num_return_sequences is not set" in c for c in result.callouts)


def test_an_out_that_is_the_roll_file_and_a_misspelt_key_are_named(tmp_path, cli):
    """--out the ROLL file itself, with --overwrite, replaced it; a misspelt response_length was reported as missing
    without naming the misspelt key."""
    roll = tmp_path / "roll.yaml"
    roll.write_text("pretrain: x\nresponse_lenght: 512\n")
    before = roll.read_text()
    r = cli.invoke(app, ["config", "import-roll", str(roll), "--out", str(roll), "--overwrite"])
    assert r.exit_code == 2 and "is the ROLL config being imported" in r.output and roll.read_text() == before
    r = cli.invoke(app, ["config", "import-roll", str(roll), "--out", str(tmp_path / "t.yaml")])
    assert r.exit_code == 2 and "response_lenght (not a ROLL key; did you mean response_length?)" in r.output


def test_a_linear_schedule_is_imported_as_one():
    """ROLL's (and transformers') linear schedule was left out: topr had constant and cosine only."""
    result = import_roll(minimal(actor_train={"training_args": {"lr_scheduler_type": "linear"}}))
    assert rows(result)["actor_train.training_args.lr_scheduler_type"].status == MAPPED and result.config["train"]["schedule"] == "linear"
    assert any("restarts every round" in c for c in result.callouts)  # each round decays on its own


def test_adam_betas_are_imported():
    """ROLL's adam_beta1/adam_beta2 were left out: topr had no AdamW betas."""
    result = import_roll(minimal(actor_train={"training_args": {"adam_beta2": 0.95}}))
    assert rows(result)["actor_train.training_args.adam_beta2"].status == MAPPED and result.config["train"]["adam_betas"] == [0.9, 0.95]
    assert from_dict(IterateConfig, result.config).train.adam_betas == [0.9, 0.95]
