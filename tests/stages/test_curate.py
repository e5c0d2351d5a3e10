"""The curate stage end to end on small synthetic scored shards (toprcli/stages/curate.py, cli/curate.py)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from toprcli import curation as cu
from toprcli import shards
from toprcli.config import CurateConfig, ConfigError, load_config
from toprcli.stages.curate import manifest_path
from toprcli.stages.curate import run as curate
from toprcli.errors import UserError


def scored_table(
    prompt_ids: list[str],
    correct: list[bool],
    *,
    completions: list[str] | None = None,
    finish: list[str] | None = None,
    sample_index: list[int] | None = None,
    rewards: list[float] | None = None,
    iteration: int = 0,
    policy: str = "pi0",
) -> pa.Table:
    n = len(prompt_ids)
    if sample_index is None:  # 0.. within each prompt, in row order
        seen: dict[str, int] = {}
        sample_index = []
        for p in prompt_ids:
            sample_index.append(seen.get(p, 0))
            seen[p] = seen.get(p, 0) + 1
    if rewards is None:
        rewards = [1.0 if c else -1.0 for c in correct]
    t = pa.table(
        {
            "prompt_id": prompt_ids,
            "prompt": [f"Q: {p}?" for p in prompt_ids],
            "answer": ["42"] * n,
            "prompt_token_ids": pa.array([[1, 2, 3]] * n, pa.list_(pa.int32())),
            "sample_index": pa.array(sample_index, pa.int32()),
            "completion": completions or [f"completion {i}" for i in range(n)],
            "completion_token_ids": pa.array([[4, 5, i % 7] for i in range(n)], pa.list_(pa.int32())),
            "behavior_logprobs": pa.array([[-0.5, -0.25, -1.0]] * n, pa.list_(pa.float32())),
            "finish_reason": finish or ["stop"] * n,
            "policy": [policy] * n,
            "iteration": pa.array([iteration] * n, pa.int32()),
            "reward": pa.array(rewards, pa.float32()),
            "correct": correct,
            "extracted_answer": ["42" if c else "7" for c in correct],
            "verdict": ["correct" if c else "incorrect" for c in correct],
        }
    )
    return shards.conform(t, "scored")


def write_scored(directory, table: pa.Table, rows_per_shard: int | None = None):
    rows_per_shard = rows_per_shard or max(table.num_rows, 1)
    for k, start in enumerate(range(0, max(table.num_rows, 1), rows_per_shard)):
        shards.write_shard(directory, k, table.slice(start, rows_per_shard))
    return str(directory)


def pm1_data(tmp_path, p: float, n_prompts: int = 250, n: int = 16, seed: int = 0, name: str = "scored", **kw):
    rng = np.random.default_rng(seed)
    correct = (rng.random(n_prompts * n) < p).tolist()
    pids = [f"q{i // n}" for i in range(n_prompts * n)]
    return write_scored(tmp_path / name, scored_table(pids, correct, **kw), rows_per_shard=1000)


def run(tmp_path, scored, **kw) -> tuple:
    cfg = CurateConfig(scored=scored if isinstance(scored, list) else [scored], out=str(tmp_path / "train.parquet"), **kw)
    result = curate(cfg)
    return result, pq.read_table(cfg.out)


def test_row_groups_are_bounded_in_bytes_and_the_rows_are_the_same(tmp_path, monkeypatch):
    """Row groups were 65,536 rows whatever a row weighed: with 4k-token rows a group is ~3 GiB, and curate holds two to
    four of them (6-12 GiB where benchmarks/curate.py measured ~1 GiB on short rows). They are ~128 MiB now (at least
    1,024 rows); the rows and their order do not change."""
    import toprcli.shards.scored_inputs as si

    scored = pm1_data(tmp_path, 0.3, n_prompts=700, n=4)
    _, whole = run(tmp_path, scored, positive_fraction=0.2)
    assert pq.ParquetFile(tmp_path / "train.parquet").metadata.num_row_groups == 1
    monkeypatch.setattr(si, "ROW_GROUP_BYTES", 1)  # as if every row weighed more than a group may
    assert si.ScoredInputs.open([scored]).row_group_rows() == 1024  # the floor
    curate(CurateConfig(scored=[scored], out=str(tmp_path / "grouped.parquet"), positive_fraction=0.2))
    grouped = pq.read_table(tmp_path / "grouped.parquet")
    assert pq.ParquetFile(tmp_path / "grouped.parquet").metadata.num_row_groups == 3
    assert grouped.num_rows == whole.num_rows == 2800 and grouped.equals(whole)  # the file's own record (its out) aside


# -- baselines -------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_positive_fraction_hits_target(tmp_path, p):
    scored = pm1_data(tmp_path, p, seed=int(p * 10))
    result, t = run(tmp_path, scored, positive_fraction=0.15)
    adv = t.column("advantage").to_numpy()
    w = t.column("weight").to_numpy()
    share = cu.effective_positive_share(adv, w)
    assert abs(share - 0.15) < 0.005
    assert result["p_effective"] == pytest.approx(share)
    assert result["c"] == pytest.approx(cu.closed_form_baseline(result["p"], 0.15), abs=1e-9)
    assert result["p"] == pytest.approx(np.mean(t.column("correct").to_numpy()))
    assert t.schema.field("advantage").type == pa.float32() and t.schema.field("weight").type == pa.float32()
    shards.validate_columns(t, "curated", "train.parquet")


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_at_least_p_rule_follows_the_data_once_it_passes_the_target(tmp_path, p):
    """p̃ = max(target, p): below the target it is the fixed rule; above it the raw baseline c = 0 (p̃ = p)."""
    scored = pm1_data(tmp_path, p, seed=3)
    fixed, _ = run(tmp_path, scored, positive_fraction=0.3)
    result, t = run(tmp_path, scored, positive_fraction=0.3, positive_fraction_rule="at-least-p", overwrite=True)
    if result["p"] < 0.3:
        assert result["c"] == pytest.approx(fixed["c"]) and result["p_target"] == 0.3 == fixed["p_target"]
    else:
        assert result["p_target"] == pytest.approx(result["p"]) and result["c"] == pytest.approx(0.0, abs=1e-9)
        assert result["p_effective"] == pytest.approx(result["p"]) and fixed["p_effective"] == pytest.approx(0.3)
        np.testing.assert_allclose(t.column("advantage").to_numpy(), t.column("reward").to_numpy())


def test_at_least_p_with_every_row_correct_keeps_the_raw_baseline(tmp_path):
    """p = 1 (every kept row correct, rewards of a plugin that grades): p̃ = max(P, p) = 1 is every A ≥ 0, which
    the raw baseline gives. This was refused as 'unreachable: every curated row has reward 1', which was not true."""
    scored = write_scored(tmp_path / "s", scored_table(["a", "a", "b", "b"], [True] * 4, rewards=[1.0, 0.5, 0.8, 0.2]))
    result, t = run(tmp_path, scored, positive_fraction=0.2, positive_fraction_rule="at-least-p")
    assert result["c"] == 0.0 and result["p_target"] == 1.0 and result["p_effective"] == 1.0
    np.testing.assert_allclose(t.column("advantage").to_numpy(), [1.0, 0.5, 0.8, 0.2])


def test_paper_example_c_0_7(tmp_path):
    # exactly half correct → p = 0.5, P = 0.15 → c = 0.7; A = +0.3 / -1.7
    correct = [True, False] * 8
    scored = write_scored(tmp_path / "s", scored_table([f"q{i // 4}" for i in range(16)], correct))
    result, t = run(tmp_path, scored, positive_fraction=0.15)
    assert result["p"] == 0.5 and result["c"] == pytest.approx(0.7)
    np.testing.assert_allclose(t.column("advantage").to_numpy(), [0.3, -1.7] * 8, rtol=1e-6)
    assert result["p_effective"] == pytest.approx(0.15)


def test_positive_fraction_with_non_binary_rewards(tmp_path):
    rewards = [0.0, 0.25, 1.0, 0.5, 0.0, 0.0, 1.0, 0.75] * 4
    scored = write_scored(
        tmp_path / "s", scored_table([f"q{i // 4}" for i in range(32)], [r == 1.0 for r in rewards], rewards=rewards)
    )
    result, t = run(tmp_path, scored, positive_fraction=0.3)
    assert cu.effective_positive_share(t.column("advantage").to_numpy()) == pytest.approx(0.3, abs=1e-6)


def test_constant_and_default_baseline(tmp_path):
    scored = write_scored(tmp_path / "s", scored_table(["a", "a", "b", "b"], [True, False, False, False]))
    result, t = run(tmp_path, scored)  # default: c = 0, A = R
    np.testing.assert_array_equal(t.column("advantage").to_numpy(), [1, -1, -1, -1])
    assert result["baseline"] == "constant" and result["c"] == 0.0 and result["p_effective"] == pytest.approx(0.25)
    result, t = run(tmp_path, scored, baseline=-0.5, overwrite=True)
    np.testing.assert_allclose(t.column("advantage").to_numpy(), [1.5, -0.5, -0.5, -0.5])
    # p̃ = 1.5 / (1.5 + 1.5) = 0.5 = closed form 0.25·1.5/(1 - 0.5·0.5)
    assert result["p_effective"] == pytest.approx(0.5) == pytest.approx(cu.closed_form_share(0.25, -0.5))


def test_group_baselines_hand_values(tmp_path):
    # prompt a: R = [1, -1, -1, -1] → mean -0.5, LOO: [-1, -1/3, -1/3, -1/3]; prompt b: singleton
    scored = write_scored(tmp_path / "s", scored_table(["a", "a", "a", "a", "b"], [True, False, False, False, True]))
    result, t = run(tmp_path, scored, baseline="group-mean")
    np.testing.assert_allclose(t.column("advantage").to_numpy(), [1.5, -0.5, -0.5, -0.5, 0.0])
    assert result["c"] is None and result["baseline"] == "group-mean"
    result, t = run(tmp_path, scored, baseline="leave-one-out", overwrite=True)
    np.testing.assert_allclose(t.column("advantage").to_numpy(), [2.0, -2 / 3, -2 / 3, -2 / 3, 0.0], rtol=1e-6)
    # p̃ = 2 / (2 + 2) with the zero advantage counting as positive but massless
    assert result["p_effective"] == pytest.approx(0.5) and result["positives"] == 2


def test_group_baseline_uses_all_samples_of_the_prompt(tmp_path):
    # first-positive keeps [+1 (idx0), -1, -1] but the group mean still sees the 2nd positive: mean = 0
    scored = write_scored(tmp_path / "s", scored_table(["a"] * 4, [True, True, False, False]))
    _, t = run(tmp_path, scored, baseline="group-mean", first_positive=True)
    np.testing.assert_allclose(t.column("advantage").to_numpy(), [1.0, -1.0, -1.0])


def test_roll_style_normalisation_hand_values(tmp_path):
    # ROLL's reward_norm with 0/1 scores: prompt a R = [1, 0, 0, 0], prompt b R = [1, 1]
    scored = write_scored(
        tmp_path / "s", scored_table(["a"] * 4 + ["b"] * 2, [True, False, False, False, True, True], rewards=[1, 0, 0, 0, 1, 1])
    )
    # batch mean 0.5 and sample std sqrt(1.5/5) (Bessel, like torch.std)
    result, t = run(tmp_path, scored, baseline="batch-mean", std_normalize="batch")
    sd = (1.5 / 5) ** 0.5
    np.testing.assert_allclose(t.column("advantage").to_numpy(), np.array([0.5, -0.5, -0.5, -0.5, 0.5, 0.5]) / (sd + 1e-6), rtol=1e-6)
    assert result["baseline"] == "batch-mean" and result["c"] == pytest.approx(0.5)
    # GRPO: group mean and group std; prompt a: mean 1/4, std sqrt(0.75/3) = 0.5; prompt b has
    # std 0 and A = 0 (left unscaled, never divided by 1e-6)
    _, t = run(tmp_path, scored, baseline="group-mean", std_normalize="group", overwrite=True)
    np.testing.assert_allclose(t.column("advantage").to_numpy(), [0.75 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, 0, 0], rtol=1e-6)
    # reward_clip clips the normalised value
    _, t = run(tmp_path, scored, baseline="group-mean", std_normalize="group", reward_clip=1.0, overwrite=True)
    np.testing.assert_allclose(t.column("advantage").to_numpy(), [1.0, -0.5, -0.5, -0.5, 0, 0], rtol=1e-5)
    # a batch-mean baseline with a group std: the all-correct prompt b keeps A = 0.5 unscaled
    _, t = run(tmp_path, scored, baseline="batch-mean", std_normalize="group", overwrite=True)
    np.testing.assert_allclose(t.column("advantage").to_numpy()[4:], [0.5, 0.5])


def test_keep_accuracy_uses_all_samples_and_is_strict(tmp_path):
    # accuracies: a 1/4, b 2/4 (one truncated), c 0, d 1
    pids = ["a"] * 4 + ["b"] * 4 + ["c"] * 2 + ["d"] * 2
    correct = [True, False, False, False, True, True, False, False, False, False, True, True]
    finish = ["stop"] * 4 + ["length"] + ["stop"] * 7
    scored = write_scored(tmp_path / "s", scored_table(pids, correct, finish=finish))
    result, t = run(tmp_path, scored, keep_accuracy=[0.25, 1.0])
    assert set(t.column("prompt_id").to_pylist()) == {"b"} and result["dropped"] == {"outside keep_accuracy": 8}
    # b's accuracy counts its truncated (dropped) sample: 2/4, not 1/3
    result, t = run(tmp_path, scored, keep_accuracy=[0.4, 0.6], drop_truncated=True, overwrite=True)
    assert t.column("prompt_id").to_pylist() == ["b"] * 3
    # [0, 1] is drop_uniform_prompts
    _, t = run(tmp_path, scored, keep_accuracy=[0.0, 1.0], overwrite=True)
    assert set(t.column("prompt_id").to_pylist()) == {"a", "b"}
    # a bound beyond [0, 1] is no bound on that side (ROLL's -0.1)
    _, t = run(tmp_path, scored, keep_accuracy=[-0.1, 1.0], overwrite=True)
    assert set(t.column("prompt_id").to_pylist()) == {"a", "b", "c"}


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("keep_accuracy: [0.9, 0.1]", "keep_accuracy"),
        ("keep_accuracy: [0.1]", "keep_accuracy"),
        ("std_normalize: running", "std_normalize"),
        ("reward_clip: 0", "reward_clip"),
    ],
)
def test_roll_style_options_are_validated(tmp_path, yaml_text, message):
    (tmp_path / "c.yaml").write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        load_config(CurateConfig, tmp_path / "c.yaml")


# -- selection -------------------------------------------------------------------


def test_options_compose(tmp_path):
    # prompt a (mixed): rows 0..5; prompt b: all wrong; prompt c: all right
    pids = ["a"] * 6 + ["b"] * 3 + ["c"] * 2
    correct = [True, False, True, False, False, True, False, False, False, True, True]
    comps = ["x", "y", "x2", "y", "z", "x3", "b1", "b2", "b3", "c1", "c2"]
    finish = ["stop", "stop", "stop", "stop", "length", "stop", "stop", "stop", "stop", "stop", "stop"]
    scored = write_scored(tmp_path / "s", scored_table(pids, correct, completions=comps, finish=finish))
    result, t = run(
        tmp_path, scored, drop_truncated=True, dedupe=True, drop_uniform_prompts=True, first_positive=True, max_per_prompt=2
    )
    # truncated: row 4; duplicate: row 3 ("y" again); uniform: b and c; extra positives: rows 2, 5;
    # cap 2 leaves rows 0, 1 of prompt a.
    assert t.column("completion").to_pylist() == ["x", "y"]
    assert result["dropped"] == {
        "truncated": 1,
        "duplicates": 1,
        "uniform-outcome prompts": 5,
        "extra positives": 2,
        "over max per prompt": 0,
    }
    assert (result["rows_in"], result["rows_out"], result["prompts_in"], result["prompts_out"]) == (11, 2, 3, 1)
    # each option alone
    _, t = run(tmp_path, scored, first_positive=True, overwrite=True)
    assert t.column("completion").to_pylist() == ["x", "y", "y", "z", "b1", "b2", "b3", "c1"]
    _, t = run(tmp_path, scored, max_per_prompt=1, overwrite=True)
    assert t.column("completion").to_pylist() == ["x", "b1", "c1"]


def test_dedupe_is_per_prompt_and_exact(tmp_path):
    # identical text under different prompts is kept; near-identical long texts are both kept
    long_a = "step " * 20 + "answer 12 " + "done " * 20
    long_b = long_a.replace("answer 12", "answer 13")
    scored = write_scored(
        tmp_path / "s", scored_table(["p", "p", "q", "p", "p"], [True] * 5, completions=["same", "same", "same", long_a, long_b])
    )
    _, t = run(tmp_path, scored, dedupe=True)
    assert t.column("completion").to_pylist() == ["same", "same", long_a, long_b]
    # a policy that answers every prompt the same way: one copy per prompt (was an OverflowError)
    scored = write_scored(tmp_path / "s2", scored_table(["p", "p", "p", "q"], [True, True, True, False], completions=["x"] * 4))
    _, t = run(tmp_path, scored, dedupe=True, overwrite=True)
    assert t.column("prompt_id").to_pylist() == ["p", "q"]


def test_subsample_is_seeded(tmp_path):
    scored = pm1_data(tmp_path, 0.5, n_prompts=20, n=8)
    r1, t1 = run(tmp_path, scored, subsample=50, seed=1)
    assert r1["rows_out"] == 50 and r1["dropped"]["subsampled out"] == 110
    ids1 = list(zip(t1.column("prompt_id").to_pylist(), t1.column("sample_index").to_pylist()))
    _, t2 = run(tmp_path, scored, subsample=50, seed=1, overwrite=True)
    assert ids1 == list(zip(t2.column("prompt_id").to_pylist(), t2.column("sample_index").to_pylist()))


# -- replay ----------------------------------------------------------------------


def test_a_batch_baseline_counts_a_replayed_round_by_its_weight(tmp_path):
    """The batch mean and std pooled every input unweighted: replay_weight 0.5, or 0, changed nothing."""
    new = write_scored(tmp_path / "r1", scored_table(["a"] * 4, [True, True, True, False], iteration=1, policy="pi1"))  # R: 1 1 1 -1
    old = write_scored(tmp_path / "r0", scored_table(["a"] * 4, [False] * 4, iteration=0, policy="pi0"))  # R: -1 x4
    result, _ = run(tmp_path, [new, old], baseline="batch-mean", source_weights=[1.0, 0.5])
    assert result["c"] == pytest.approx((1 + 1 + 1 - 1 + 0.5 * -4) / 6)  # Σ w R / Σ w = 0 (unweighted: -0.25)
    result, t = run(tmp_path, [new, old], baseline="batch-mean", std_normalize="batch", source_weights=[1.0, 0.0], overwrite=True)
    sd = np.std([1, 1, 1, -1], ddof=1)  # the replayed round counts for nothing: this round's std
    assert result["c"] == pytest.approx(0.5)
    np.testing.assert_allclose(t.column("advantage").to_numpy()[:4], np.array([0.5, 0.5, 0.5, -1.5]) / (sd + 1e-6), rtol=1e-6)


def test_replay_sources_weights_and_groups(tmp_path):
    # the same prompt id in two rounds is two groups: round 1 mean 0, round 0 mean -0.5
    new = write_scored(tmp_path / "r1", scored_table(["a"] * 4, [True, True, False, False], iteration=1, policy="pi1"))
    old = write_scored(tmp_path / "r0", scored_table(["a"] * 4, [True, False, False, False], iteration=0, policy="pi0"))
    result, t = run(tmp_path, [new, old], baseline="group-mean", source_weights=[1.0, 0.5])
    assert t.column("iteration").to_pylist() == [1] * 4 + [0] * 4
    assert t.column("policy").to_pylist() == ["pi1"] * 4 + ["pi0"] * 4
    np.testing.assert_allclose(t.column("weight").to_numpy(), [1.0] * 4 + [0.5] * 4)
    np.testing.assert_allclose(t.column("advantage").to_numpy(), [1, 1, -1, -1, 1.5, -0.5, -0.5, -0.5])
    assert [(s["rows_in"], s["rows_out"], s["weight"], s["iterations"], s["policies"]) for s in result["sources"]] == [
        (4, 4, 1.0, [1], ["pi1"]),
        (4, 4, 0.5, [0], ["pi0"]),
    ]
    # weighted p̃: positives 1+1 + 0.5·1.5 = 2.75; negatives 2 + 0.5·1.5 = 2.75
    assert result["p_effective"] == pytest.approx(0.5)


def test_replay_positive_fraction_uses_weights(tmp_path):
    new = pm1_data(tmp_path, 0.6, name="r1", iteration=1, policy="pi1", n_prompts=50)
    old = pm1_data(tmp_path, 0.2, name="r0", iteration=0, policy="pi0", n_prompts=50, seed=3)
    result, t = run(tmp_path, [new, old], positive_fraction=0.2, source_weights=[1.0, 0.25])
    w = t.column("weight").to_numpy()
    assert cu.effective_positive_share(t.column("advantage").to_numpy(), w) == pytest.approx(0.2, abs=1e-5)
    assert result["p"] == pytest.approx(np.average(t.column("correct").to_numpy(), weights=w))


# -- output, metadata, resume ----------------------------------------------------


def test_metadata_manifest_and_resume(tmp_path):
    scored = pm1_data(tmp_path, 0.3, n_prompts=10, n=4)
    result, t = run(tmp_path, scored, positive_fraction=0.15)
    meta = shards.read_file_metadata(result.out)
    assert meta["stage"] == "curate" and meta["baseline"] == "positive-fraction"
    assert meta["c"] == pytest.approx(result["c"]) and meta["p"] == pytest.approx(result["p"])
    assert meta["p_effective"] == pytest.approx(result["p_effective"]) and meta["positive_fraction"] == 0.15
    assert meta["sources"][0]["path"] == scored and meta["config"]["positive_fraction"] == 0.15
    manifest = json.loads(manifest_path(result.out).read_text())
    assert manifest["stage"] == "curate" and manifest["counts"]["rows_out"] == 40 and scored in manifest["inputs"]
    assert not list(tmp_path.glob(".*.tmp"))
    # same inputs and settings again: nothing rewritten
    mtime = (tmp_path / "train.parquet").stat().st_mtime_ns
    again = curate(CurateConfig(scored=[scored], out=result.out, positive_fraction=0.15))
    assert again.skipped and again["c"] == pytest.approx(result["c"]) and again["rows_out"] == 40
    assert (tmp_path / "train.parquet").stat().st_mtime_ns == mtime
    # `topr score` rerun with nothing to score rewrites its manifest, a second later: the data is the same
    manifest_file = Path(scored) / "_manifest.json"
    manifest_file.write_text(manifest_file.read_text() if manifest_file.exists() else "{}")
    os.utime(manifest_file, (mtime / 1e9 + 5, mtime / 1e9 + 5))
    assert curate(CurateConfig(scored=[scored], out=result.out, positive_fraction=0.15)).skipped
    # other settings: refuse, then overwrite
    with pytest.raises(UserError, match="already exists"):
        curate(CurateConfig(scored=[scored], out=result.out, positive_fraction=0.2))
    r2 = curate(CurateConfig(scored=[scored], out=result.out, positive_fraction=0.2, overwrite=True))
    assert not r2.skipped and r2["p_effective"] == pytest.approx(0.2, abs=1e-6)


def test_mixed_string_types_across_files(tmp_path):
    a = scored_table(["a", "a"], [True, False])
    b = scored_table(["b", "b"], [False, True], iteration=1)
    b = b.set_column(b.schema.get_field_index("completion"), "completion", b.column("completion").cast(pa.large_string()))
    b = b.append_column("extra", pa.array([1, 2]))
    write_scored(tmp_path / "s", a)
    shards.write_shard(tmp_path / "s", 1, b)
    _, t = run(tmp_path, str(tmp_path / "s"))
    assert t.num_rows == 4 and t.column("extra").to_pylist() == [None, None, 1, 2]


# -- bad input -------------------------------------------------------------------


def _no_output(tmp_path):
    return not (tmp_path / "train.parquet").exists() and not list(tmp_path.glob("*.manifest.json"))


def test_a_scored_dir_topr_score_did_not_finish_is_refused(tmp_path):
    """Killed after 1 of 2 shards: curate once built a training set from half the data. A hand-made directory
    (no score record in its files) is read as it is; a finished one has its _manifest.json."""
    t = scored_table(["a", "a", "b", "b"], [True, False, True, False])
    shards.write_shard(tmp_path / "scored", 0, t.slice(0, 2), metadata={"score": {"verifier": "gsm8k"}})
    with pytest.raises(UserError, match="has not finished"):
        run(tmp_path, str(tmp_path / "scored"))
    assert _no_output(tmp_path)
    shards.write_shard(tmp_path / "scored", 1, t.slice(2, 2), metadata={"score": {"verifier": "gsm8k"}})
    shards.write_manifest(tmp_path / "scored", stage="score", config={})
    result, table = run(tmp_path, str(tmp_path / "scored"))
    assert table.num_rows == 4
    result, table = run(tmp_path, write_scored(tmp_path / "by-hand", t), overwrite=True)
    assert table.num_rows == 4


def test_not_scored(tmp_path):
    t = scored_table(["a", "a"], [True, False]).drop_columns(["reward", "correct", "extracted_answer", "verdict"])
    shards.write_shard(tmp_path / "samples", 0, t)
    with pytest.raises(UserError, match="missing column 'reward'"):
        run(tmp_path, str(tmp_path / "samples"))
    assert _no_output(tmp_path)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(positive_fraction=0.2, baseline=0.5), "both given"),
        (dict(positive_fraction=0.2, baseline="group-mean"), "both given"),
        (dict(baseline="median"), "bad value for .baseline.: .median."),
        (dict(positive_fraction=0.2, std_normalize="group"), "std_normalize: group"),
        (dict(positive_fraction=0.2, reward_clip=1.0), "reward_clip"),
        (dict(source_weights=[1.0, 2.0]), "2 source weights for 1"),
        (dict(source_weights=[-1.0]), "bad source weight"),
        (dict(source_weights=[0.0]), "every source weight is 0"),
    ],
)
def test_bad_options(tmp_path, kw, message):
    scored = pm1_data(tmp_path, 0.5, n_prompts=4, n=4)
    with pytest.raises(UserError, match=message):
        run(tmp_path, scored, **kw)
    assert _no_output(tmp_path)


def test_config_rejects_fraction_outside_unit_interval():
    with pytest.raises(ConfigError, match="strictly between 0 and 1"):
        load_config(CurateConfig, None, {"positive_fraction": 1.0})


@pytest.mark.parametrize("correct", [[True] * 8, [False] * 8])
def test_positive_fraction_unreachable(tmp_path, correct):
    scored = write_scored(tmp_path / "s", scored_table(["a"] * 4 + ["b"] * 4, correct))
    with pytest.raises(UserError, match="unreachable"):
        run(tmp_path, scored, positive_fraction=0.15)
    assert _no_output(tmp_path)


def test_unreachable_fraction_can_fall_back_to_a_constant(tmp_path):
    scored = write_scored(tmp_path / "s", scored_table(["a"] * 4 + ["b"] * 4, [False] * 8))
    result, table = run(tmp_path, scored, positive_fraction=0.15, unreachable_baseline=0.0)
    assert table.column("advantage").to_pylist() == [-1.0] * 8  # A = R - 0
    assert result["c"] == 0.0 and "unreachable" in result["baseline"]


def test_unreachable_after_filters_and_empty_selection(tmp_path):
    scored = write_scored(tmp_path / "s", scored_table(["a", "a", "b", "b"], [True, True, False, False]))
    with pytest.raises(UserError, match="no rows left"):
        run(tmp_path, scored, drop_uniform_prompts=True)
    # every negative was truncated: after --drop-truncated only positives are left
    finish = ["stop", "length", "stop", "length"]
    scored = write_scored(tmp_path / "s2", scored_table(["a", "a", "b", "b"], [True, False, True, False], finish=finish))
    with pytest.raises(UserError, match="unreachable: every curated row has reward 1"):
        run(tmp_path, scored, positive_fraction=0.5, drop_truncated=True)
    assert _no_output(tmp_path)
    # the weighted source's rows all dropped: the rows left weigh 0 and carry no share (this was an IndexError)
    weighted = write_scored(tmp_path / "s3", scored_table(["a", "b"], [True, False], finish=["length", "length"]))
    unweighted = write_scored(tmp_path / "s4", scored_table(["c", "d"], [True, False]))
    with pytest.raises(UserError, match="unreachable: every curated row has weight 0"):
        run(tmp_path, [weighted, unweighted], positive_fraction=0.5, source_weights=[1.0, 0.0], drop_truncated=True)
    assert _no_output(tmp_path)
    # rows of both outcomes, but the correct ones weigh 0: the message was 'every curated row has reward -1'
    wrong = write_scored(tmp_path / "s5", scored_table(["a", "a"], [False, False]))
    right = write_scored(tmp_path / "s6", scored_table(["a", "a"], [True, True]))
    with pytest.raises(UserError, match="unreachable: every curated row of weight > 0 has reward -1"):
        run(tmp_path, [wrong, right], positive_fraction=0.2, source_weights=[1.0, 0.0])


def test_missing_input_and_bad_out(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        run(tmp_path, str(tmp_path / "nope"))
    scored = pm1_data(tmp_path, 0.5, n_prompts=2, n=2)
    with pytest.raises(UserError, match="name it \\*.parquet"):
        curate(CurateConfig(scored=[scored], out=str(tmp_path / "outdir")))
    with pytest.raises(UserError, match="given twice"):
        run(tmp_path, [scored, scored])


# -- CLI ---------------------------------------------------------------------------


@pytest.fixture
def cli():
    """The real app."""
    from toprcli.cli import main

    return main.app, ["curate"]


def test_cli_writes_and_summarises(tmp_path, cli):
    app, prefix = cli
    a = pm1_data(tmp_path, 0.5, name="r1", n_prompts=10, n=4, iteration=1)
    b = pm1_data(tmp_path, 0.2, name="r0", n_prompts=10, n=4)
    out = tmp_path / "train.parquet"
    res = CliRunner().invoke(
        app, prefix + ["--scored", a, b, "--source-weights", "1,0.5", "--out", str(out), "--positive-fraction", "0.15", "--json"]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["rows_out"] == 80 and abs(summary["p_effective"] - 0.15) < 1e-6
    assert [s["weight"] for s in summary["sources"]] == [1.0, 0.5]
    res = CliRunner().invoke(app, prefix + ["-s", a, "-s", b, "--out", str(out), "--baseline", "leave-one-out", "--overwrite"])
    assert res.exit_code == 0, res.output
    assert "leave-one-out" in res.stdout and "rows out" in res.stdout


def test_cli_config_file(tmp_path, cli):
    app, prefix = cli
    scored = pm1_data(tmp_path, 0.5, n_prompts=4, n=4)
    cfg = tmp_path / "curate.yaml"
    cfg.write_text(f"scored: [{scored}]\nout: {tmp_path / 'train.parquet'}\nbaseline: group-mean\nmax_per_prompt: 2\n")
    res = CliRunner().invoke(app, prefix + ["--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["baseline"] == "group-mean" and summary["rows_out"] == 8


@pytest.mark.parametrize(
    "args, message",
    [
        (["--positive-fraction", "1.5"], "positive_fraction"),
        (["--positive-fraction", "0.2", "--baseline", "0.1"], "both given"),
        (["--source-weights", "1,x"], "bad value for 'source_weights'"),
        (["--baseline", "median"], "bad value for 'baseline'"),
    ],
)
def test_cli_bad_input_exit_2(tmp_path, cli, args, message):
    app, prefix = cli
    scored = pm1_data(tmp_path, 0.5, n_prompts=4, n=4)
    res = CliRunner().invoke(app, prefix + ["--scored", scored, "--out", str(tmp_path / "train.parquet"), *args])
    assert res.exit_code == 2
    assert message in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "train.parquet").exists()


def test_cli_not_scored_exit_2(tmp_path, cli):
    app, prefix = cli
    t = scored_table(["a", "a"], [True, False]).drop_columns(["reward"])
    shards.write_shard(tmp_path / "samples", 0, t)
    res = CliRunner().invoke(app, prefix + ["--scored", str(tmp_path / "samples"), "--out", str(tmp_path / "train.parquet")])
    assert res.exit_code == 2 and "'reward'" in res.output
    assert not (tmp_path / "train.parquet").exists()


def test_cli_help_has_examples(cli):
    app, prefix = cli
    res = CliRunner().invoke(app, prefix + ["--help"])
    assert res.exit_code == 0 and "--positive-fraction" in res.output and "Examples" in res.output


# -- preference pairs (for --loss dpo) ------------------------------------------------


def test_matched_pairs_are_written_as_chosen_rejected_rows(tmp_path):
    # q0: 2 correct, 3 wrong → 2 pairs; q1: all wrong → none; q2: 1 correct, 1 wrong → 1 pair.
    pids = ["q0"] * 5 + ["q1"] * 3 + ["q2"] * 2
    correct = [True, False, True, False, False, False, False, False, False, True]
    scored = write_scored(tmp_path / "scored", scored_table(pids, correct), rows_per_shard=4)
    result, t = run(tmp_path, scored, pairs="matched")
    assert result["pairs"] == 3 and result["prompts_without_pair"] == 1 and result["rows_out"] == 6
    assert t.column("pair_id").to_pylist() == [0, 0, 1, 1, 2, 2]
    assert t.column("chosen").to_pylist() == [True, False] * 3
    assert t.column("correct").to_pylist() == [True, False] * 3
    pid = t.column("prompt_id").to_pylist()
    assert pid[0::2] == pid[1::2] and sorted(set(pid)) == ["q0", "q2"]
    # q0: the i-th correct (sample 0, 2) with the i-th wrong (sample 1, 3) by sample_index.
    si = t.column("sample_index").to_pylist()
    assert [(si[k], si[k + 1]) for k in (0, 2)] == [(0, 1), (2, 3)]
    assert pq.read_schema(tmp_path / "train.parquet").field("pair_id").type == pa.int64()


def test_all_pairs_repeat_samples_and_the_cap_is_seeded(tmp_path):
    pids = ["q0"] * 5
    correct = [True, True, False, False, False]
    scored = write_scored(tmp_path / "scored", scored_table(pids, correct))
    result, t = run(tmp_path, scored, pairs="all")
    assert result["pairs"] == 6  # 2 correct × 3 wrong
    pairs = set(zip(t.column("sample_index").to_pylist()[0::2], t.column("sample_index").to_pylist()[1::2]))
    assert pairs == {(c, r) for c in (0, 1) for r in (2, 3, 4)}
    capped, t2 = run(tmp_path, scored, pairs="all", max_pairs_per_prompt=2, seed=5, overwrite=True)
    assert capped["pairs"] == 2
    again, t3 = run(tmp_path, scored, pairs="all", max_pairs_per_prompt=2, seed=5, overwrite=True)
    assert t3.column("sample_index").to_pylist() == t2.column("sample_index").to_pylist()


def test_no_pair_at_all_is_one_clear_error_and_writes_nothing(tmp_path):
    scored = write_scored(tmp_path / "scored", scored_table(["q0", "q0", "q1"], [True, True, False]))
    with pytest.raises(UserError, match="no preference pair"):
        run(tmp_path, scored, pairs="matched")
    assert not (tmp_path / "train.parquet").exists()


def test_positive_fraction_with_pairs_is_solved_on_the_pair_rows(tmp_path):
    """c was solved on the rows before pairing, so the written file missed the target (0.056 for 0.15)."""
    scored = pm1_data(tmp_path, 0.75, n_prompts=4, n=4)
    result, t = run(tmp_path, scored, positive_fraction=0.15, pairs="all")
    share = cu.effective_positive_share(t.column("advantage").to_numpy(), t.column("weight").to_numpy())
    assert share == pytest.approx(0.15) and result["p_effective"] == pytest.approx(0.15)


def test_a_training_set_with_no_signal_is_named(tmp_path):
    """One sample per prompt under a group baseline: every advantage is 0 and training changes nothing; it was
    written without a word (a --positive-fraction set without signal is an error)."""
    scored = write_scored(tmp_path / "scored", scored_table([f"q{i}" for i in range(6)], [True, False] * 3))
    with pytest.warns(UserWarning, match="every row written has advantage 0"):
        run(tmp_path, scored, baseline="leave-one-out")


def test_wrong_rows_at_the_baseline_are_said_to_train_nothing(tmp_path):
    """A verl-style plugin's 0/1 rewards under the default baseline 0: every wrong row had advantage 0 and TOPR trained on
    the positives alone, in silence (p̃ 1)."""
    zero_one = write_scored(tmp_path / "s01", scored_table(["q0", "q0", "q1", "q1"], [True, False, False, False], rewards=[1.0, 0.0, 0.0, 0.0]))
    with pytest.warns(UserWarning, match=r"all 3 wrong rows have advantage 0 \(their reward equals the baseline 0\)"):
        run(tmp_path, zero_one)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result, _ = run(tmp_path, zero_one, baseline=0.5, overwrite=True)  # between the two rewards: the wrong rows are negatives
    assert result["p_effective"] == pytest.approx(0.25)


def test_an_out_inside_a_scored_input_is_refused(tmp_path):
    """Its files counted as the input's: the same command again was refused as 'from other inputs'."""
    scored = pm1_data(tmp_path, 0.5, n_prompts=4, n=4)
    with pytest.raises(UserError, match="is inside the scored input"):
        curate(CurateConfig(scored=[scored], out=str(Path(scored) / "train.parquet")))


def test_a_null_in_a_hand_made_scored_file_is_one_line_naming_it(tmp_path):
    """Nulls in `correct` or `sample_index` were cast (a warning, a null correct counted wrong, a null index as
    -2**63), and the trainer then refused the result, pointing back at curate."""
    t = scored_table(["q0"] * 4, [True, False, True, False])
    values = t.column("correct").to_pylist()
    values[1] = None
    t = t.set_column(t.schema.get_field_index("correct"), pa.field("correct", pa.bool_()), pa.array(values, pa.bool_()))
    (tmp_path / "scored").mkdir()
    pq.write_table(t, tmp_path / "scored" / "shard-00000.parquet")
    with pytest.raises(UserError, match="column 'correct' has a null in row 1"):
        run(tmp_path, str(tmp_path / "scored"))


def test_a_killed_curates_half_written_set_is_removed_by_the_next_run(tmp_path):
    """A SIGKILL mid-write left .train.parquet.<pid>.tmp, as large as the set, and no run ever removed it."""
    from toprcli.shards.files import temporary_name

    scored = pm1_data(tmp_path, 0.5, n_prompts=10, n=4)
    mine = temporary_name(tmp_path / "train.parquet").name  # .train.parquet.<pid>-<host>.tmp
    stale = tmp_path / mine.replace(f".{os.getpid()}-", ".999999999-")  # a writer of this machine that is gone
    stale.write_bytes(b"half a set")
    other = tmp_path / mine.replace(f".{os.getpid()}-", ".999999999-").replace(".train.parquet.", ".another.parquet.")  # dead, not ours
    other.write_bytes(b"not ours")
    run(tmp_path, scored)
    assert not stale.exists() and other.exists()


def test_a_curate_killed_before_its_manifest_is_kept_by_the_rerun(tmp_path):
    """A SIGKILL between the rename and the manifest's write left a whole set the rerun refused as "from other inputs"."""
    import signal
    import subprocess
    import sys

    scored = pm1_data(tmp_path, 0.3, n_prompts=10, n=4)
    out = tmp_path / "train.parquet"
    killed = (  # the real stage, killed by SIGKILL as it starts to write the manifest
        "import os, signal\nfrom toprcli import shards\nfrom toprcli.config import CurateConfig\nfrom toprcli.stages import curate\n"
        "write = shards.write_json_atomic\n"
        "shards.write_json_atomic = lambda p, o: os.kill(os.getpid(), signal.SIGKILL) if str(p).endswith('.manifest.json') else write(p, o)\n"
        f"curate.run(CurateConfig(scored=[{scored!r}], out={str(out)!r}, positive_fraction=0.15))\n"
    )
    proc = subprocess.run([sys.executable, "-c", killed], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert out.is_file() and not manifest_path(out).exists()
    mtime = out.stat().st_mtime_ns
    again = curate(CurateConfig(scored=[scored], out=str(out), positive_fraction=0.15))
    assert again.skipped and again["rows_out"] == 40 and again["p_effective"] == pytest.approx(0.15, abs=1e-6)
    assert out.stat().st_mtime_ns == mtime  # kept, not remade
    manifest = json.loads(manifest_path(out).read_text())
    assert manifest["counts"]["rows_out"] == 40 and scored in manifest["inputs"]
    # the file's own record vouches only for its own inputs and settings
    manifest_path(out).unlink()
    with pytest.raises(UserError, match="already exists"):
        curate(CurateConfig(scored=[scored], out=str(out), positive_fraction=0.2))
    assert not manifest_path(out).exists()


def test_an_output_under_the_home_dir_is_written_there(tmp_path, monkeypatch):
    """`--out=~/x.parquet` (no shell expands a ~ after =) was half expanded: pyarrow left a temporary in $HOME per attempt
    and the write failed with a traceback; `run_dir: ~/runs` in YAML made a literal ./~ directory."""
    from toprcli.cli.main import app
    from toprcli.config import IterateConfig, from_dict

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    scored = pm1_data(tmp_path, 0.5, n_prompts=4, n=2)
    res = CliRunner().invoke(app, ["curate", "-s", scored, "--out=~/train.parquet", "--positive-fraction", "0.2"])
    assert res.exit_code == 0, res.output
    assert (home / "train.parquet").is_file() and not (tmp_path / "~").exists() and not list(home.glob(".*.tmp"))
    assert from_dict(IterateConfig, {"run_dir": "~/runs/a"}).run_dir == str(home / "runs" / "a")


def test_scored_inputs_flagged_and_loose_in_another_order_are_refused(tmp_path):
    """`-s r3 r2 -s r1` was [r3, r1, r2] and `r3 -s r2` was [r2, r3]: the weights of --source-weights went to other rounds."""
    import subprocess
    import sys

    from toprcli.cli.main import app

    a, b, c = (pm1_data(tmp_path, 0.5, name=n, n_prompts=4, n=2) for n in ("r3", "r2", "r1"))
    out = str(tmp_path / "train.parquet")
    res = CliRunner().invoke(app, ["curate", "-s", a, b, "-s", c, "--source-weights", "1,0.5,0.25", "-o", out])
    assert res.exit_code == 2 and "their order is lost" in res.output and not os.path.exists(out)
    loose_first = subprocess.run([sys.executable, "-m", "toprcli", "curate", a, "-s", b, "--source-weights", "1,0.5", "-o", out],
                                 capture_output=True, text=True)
    assert loose_first.returncode == 2 and "their order is lost" in loose_first.stderr and not os.path.exists(out)
    attached = subprocess.run([sys.executable, "-m", "toprcli", "curate", a, f"-s{b}", "--source-weights", "1,0.5", "-o", out],
                              capture_output=True, text=True)  # -sDIR is the flag too: it was taken as [b, a]
    assert attached.returncode == 2 and "their order is lost" in attached.stderr and not os.path.exists(out)
    res = CliRunner().invoke(app, ["curate", "--scored", a, b, c, "--source-weights", "1,0.5,0.25", "-o", out, "--json"])
    assert res.exit_code == 0, res.output  # the documented form: in the order written
    assert [s["path"] for s in json.loads(res.stdout.strip().splitlines()[-1])["sources"]] == [a, b, c]


def test_options_that_would_do_nothing_are_refused_at_load():
    """--max-pairs-per-prompt without --pairs, --positive-fraction-rule at-least-p with a --baseline: accepted, no effect."""
    with pytest.raises(ConfigError, match="max_pairs_per_prompt is set but pairs is none"):
        load_config(CurateConfig, None, sets={"max_pairs_per_prompt": 2})
    with pytest.raises(ConfigError, match="positive_fraction_rule at-least-p needs positive_fraction"):
        load_config(CurateConfig, None, sets={"positive_fraction_rule": "at-least-p", "baseline": 0.5})


def test_out_is_never_a_scored_input_and_a_path_spelt_otherwise_is_the_same_input(tmp_path):
    """`-s in.parquet -o in.parquet` was refused as 'from other inputs', and with --overwrite replaced the scored input.
    `-s scored/` after `-s scored` was refused as other inputs."""
    from toprcli.cli.main import app

    scored = pm1_data(tmp_path, 0.5, n_prompts=4, n=4)
    one = str(tmp_path / "in.parquet")
    shutil.copy(sorted(Path(scored).glob("shard-*.parquet"))[0], one)
    before = Path(one).read_bytes()
    res = CliRunner().invoke(app, ["curate", "-s", one, "-o", one, "--positive-fraction", "0.2", "--overwrite"])
    assert res.exit_code == 2 and f"--out {one} is the scored input" in res.output and Path(one).read_bytes() == before
    out = str(tmp_path / "t.parquet")
    first = curate(CurateConfig(scored=[scored], out=out, baseline=0.0))
    again = curate(CurateConfig(scored=[scored + "/"], out=out, baseline=0.0))
    assert not first.skipped and again.skipped


def test_a_curated_set_is_no_scored_input_and_a_refusal_names_what_differs(tmp_path, monkeypatch):
    """A curated file given as --scored was curated again (weights reset to 1, baselines from filtered rows); `-o
    ./t.parquet` after `-o t.parquet` was refused; the refusal never said what differed."""
    scored = write_scored(tmp_path / "s", scored_table(["a"] * 4, [True, False, False, True]))
    monkeypatch.chdir(tmp_path)
    first = curate(CurateConfig(scored=[scored], out="t.parquet"))
    assert curate(CurateConfig(scored=[scored], out="./t.parquet")).skipped
    with pytest.raises(UserError, match=r"t.parquet already exists \(made with baseline=None there vs 0.5 now\)"):
        curate(CurateConfig(scored=[scored], out="t.parquet", baseline="0.5"))
    with pytest.raises(UserError, match="is a curated training set, not scored data"):
        curate(CurateConfig(scored=[first.out], out="t2.parquet"))


def test_inputs_scored_with_different_rewards_are_refused(tmp_path):
    """A replayed round scored with --reward-correct 2 was curated beside one scored with 1: two scales, silently."""
    def scored(name: str, correct_reward: float) -> str:
        settings = {"reward_correct": correct_reward, "reward_incorrect": -1.0, "reward_no_answer": -1.0}
        table = scored_table(["a"] * 4, [True, False, True, False], rewards=[correct_reward, -1.0, correct_reward, -1.0])
        shards.write_shard(tmp_path / name, 0, table, metadata={"score": {"settings": settings}})
        shards.write_manifest(tmp_path / name, stage="score", config=settings)
        return str(tmp_path / name)

    one, other, same = scored("r1", 1.0), scored("r0", 2.0), scored("r2", 1.0)
    with pytest.raises(UserError, match=r"scored with different rewards \(.*r1.*correct 1.0, incorrect -1.0, no answer -1.0; .*r0.*correct 2.0.*"
                                        r"rescore one"):
        run(tmp_path, [one, other])
    assert not (tmp_path / "train.parquet").exists()
    result, _ = run(tmp_path, [one, same])  # the same rewards: curated together
    assert result["rows_out"] == 8


def test_a_set_whose_rows_all_weigh_0_is_refused_and_a_nan_reward_is_located(tmp_path):
    """Filters that left only a weight-0 replayed round wrote a training set that trains nothing, exit 0, with a warning
    blaming group baselines; a NaN reward named neither file nor row."""
    new = write_scored(tmp_path / "r1", scored_table(["a"] * 4, [True, True, True, True], iteration=1, policy="pi1"))
    old = write_scored(tmp_path / "r0", scored_table(["b"] * 4, [True, False, True, False], iteration=0, policy="pi0"))
    with pytest.raises(UserError, match="every row kept has weight 0"):
        run(tmp_path, [new, old], source_weights=[1.0, 0.0], drop_uniform_prompts=True)
    assert not (tmp_path / "train.parquet").exists()
    bad = write_scored(tmp_path / "nan", scored_table(["c"] * 3, [True, False, True], rewards=[1.0, float("nan"), 1.0]))
    with pytest.raises(UserError, match=r"1 rows have a NaN or infinite reward \(the first: .*nan.*shard-00000.parquet, row 1\)"):
        run(tmp_path, [new, bad])
    with pytest.raises(UserError, match=r"as one comma list \(--source-weights 1,0.5"):
        run(tmp_path, [new, old, bad], source_weights=[1.0, 0.5])


def test_a_rerun_with_the_inputs_written_another_way_or_an_unused_seed_is_the_same_output(tmp_path, monkeypatch):
    """`-s A` then `-s /abs/A`, or `--seed 5` with nothing seeded, was refused as made with other settings (only
    --overwrite got through); the inputs are known by their content, and a seed nothing drew from is no setting."""
    write_scored(tmp_path / "r1", scored_table(["a"] * 4 + ["b"] * 4, [True, False] * 4))
    monkeypatch.chdir(tmp_path)
    first, _ = run(tmp_path, ["r1"], positive_fraction=0.2)
    again, _ = run(tmp_path, [str(tmp_path / "r1")], positive_fraction=0.2, seed=5)
    assert again.skipped and again["c"] == first["c"]
    run(tmp_path, ["r1"], positive_fraction=0.2, subsample=6, overwrite=True)
    with pytest.raises(UserError, match="made with seed=0 there vs 5 now"):
        run(tmp_path, ["r1"], positive_fraction=0.2, subsample=6, seed=5)


def test_an_unreachable_baseline_without_a_positive_fraction_is_said_to_do_nothing(tmp_path):
    """--unreachable-baseline 0.3 without --positive-fraction was taken and did nothing, in silence."""
    path = write_scored(tmp_path / "r1", scored_table(["a"] * 4, [True, False, True, False]))
    with pytest.warns(UserWarning, match="--unreachable-baseline 0.3 does nothing without --positive-fraction"):
        run(tmp_path, [path], unreachable_baseline=0.3)


def test_rows_whose_check_failed_are_not_trained_as_negatives(tmp_path):
    """A row whose gold the verifier cannot read (a null answer, a MATH gold under gsm8k) or whose plugin raised is
    'error', rewarded as wrong; curate kept it as a negative, so a correct completion was trained down."""
    table = scored_table(["q0", "q0", "q1", "q1"], [True, False, False, False])
    table = table.set_column(table.schema.get_field_index("verdict"), "verdict", pa.array(["correct", "incorrect", "error", "timeout"]))
    scored = write_scored(tmp_path / "scored", table)
    result, t = run(tmp_path, scored)
    assert result["dropped"] == {"unchecked": 1} and t.column("prompt_id").to_pylist() == ["q0", "q0", "q1"]  # a timeout stays: the policy's
    kept, t = run(tmp_path, scored, drop_unchecked=False, overwrite=True)
    assert "unchecked" not in kept["dropped"] and t.num_rows == 4
    # Nor do they weigh in the baselines: q1's group mean is its timeout's and its wrong row's −1, not the error's too.
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array([1.0, -1.0, 5.0, -1.0], pa.float32()))
    scored = write_scored(tmp_path / "scored2", table)
    _, t = run(tmp_path, scored, baseline="group-mean", overwrite=True)
    assert t.column("advantage").to_pylist() == [1.0, -1.0, 0.0]  # (q0: mean 0; q1: mean −1 over its checked rows)
