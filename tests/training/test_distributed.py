"""Training in other processes: torchrun + FSDP2 on CPU (gloo), and a real SIGKILL + --resume.

Tolerances: a 2-rank FSDP run sums the same per-sequence gradients as one
process, in a different order (sharded reduce-scatter, other micro-batches),
so weights agree to float32 rounding: max |Δw| < 1e-5 after the run (weights
move by ~1e-2). A resumed single-process run repeats the same operations in
the same order: identical weights (tolerance 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from builders import grouped_file, write_curated

from conftest import KILLER as KILLER_SCRIPT
from toprcli.config import TrainConfig
from toprcli.stages.train import run as train_policy

pytestmark = pytest.mark.slow

FSDP_TOLERANCE = 1e-5


def _max_diff(a: Path, b: Path) -> float:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def _train_args(model: Path, data: Path, out: Path, opts: dict) -> list[str]:
    args = ["train", "-m", str(model), "-d", str(data), "-o", str(out), "--no-progress"]
    for k, v in opts.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            args.append(flag)
        elif isinstance(v, list):
            for item in v:
                args += [flag, str(item)]
        else:
            args += [flag, str(v)]
    return args


KILLER = str(KILLER_SCRIPT)


def _torchrun(args: list[str], env: dict[str, str], timeout: int = 240) -> subprocess.CompletedProcess:
    """2 ranks of `topr ARGS`; with KILL_AFTER_CHECKPOINT in env, each rank SIGKILLs itself after that checkpoint."""
    entry = [KILLER] if "KILL_AFTER_CHECKPOINT" in env else ["-m", "toprcli"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *entry, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _cfg(model: Path, data: Path, out: Path, opts: dict) -> TrainConfig:
    opts = dict(opts)
    if "lora_target" in opts:
        opts["lora_target_modules"] = opts.pop("lora_target")
    return TrainConfig(model=str(model), data=str(data), out=str(out), **opts)


def test_fsdp_two_ranks_match_one_process_and_resume_after_sigkill(tiny_model_dir, tmp_path):
    """2 ranks (FSDP2, gloo), killed after a checkpoint and resumed == one uninterrupted process; the ranks share one
    copy of the training set on the machine (node_data)."""
    data = write_curated(tmp_path / "train.parquet", n=45, policy=str(tiny_model_dir))
    # odd batch and a small token budget: ranks get different numbers of real micro-batches
    opts = dict(optimizer="adafactor", lr=1e-2, batch_size=15, max_steps=5, micro_batch_tokens=120, save_every=2,
                schedule="cosine", warmup_steps=1)
    train_policy(_cfg(tiny_model_dir, data, tmp_path / "single", opts))

    out, tmp = tmp_path / "fsdp", tmp_path / "tmp"
    tmp.mkdir()
    killed = _torchrun(_train_args(tiny_model_dir, data, out, opts), _env(KILL_AFTER_CHECKPOINT="2", TMPDIR=str(tmp)))
    assert killed.returncode != 0, killed.stdout + killed.stderr
    assert not out.exists() and (tmp_path / "fsdp.partial" / "checkpoints" / "step-00000002").is_dir()
    # The machine's ranks mapped one copy of the set (local rank 0's), removed once the process group formed: a kill leaves none.
    assert "cannot share the training set" not in killed.stderr and not list(tmp.glob("topr-data-*"))
    done = _torchrun(_train_args(tiny_model_dir, data, out, {**opts, "resume": True}), _env(TMPDIR=str(tmp)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not list(tmp.glob("topr-data-*"))
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["resumed_from_step"] == 2 and summary["steps"] == 5
    assert _max_diff(tmp_path / "single", out) < FSDP_TOLERANCE
    assert _max_diff(tiny_model_dir, out) > 1e-3
    single = [json.loads(x) for x in (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()]
    dist = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in dist] == [1, 2, 3, 4, 5]
    for a, b in zip(single, dist):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-5)
        assert (b["n_pos"], b["n_neg"], b["tokens"]) == (a["n_pos"], a["n_neg"], a["tokens"])


def test_fsdp_lora_is_saved_merged_and_matches_one_process(tiny_model_dir, tmp_path):
    data = write_curated(tmp_path / "train.parquet", n=32, policy=str(tiny_model_dir))
    opts = dict(optimizer="adamw", lr=1e-2, batch_size=16, max_steps=2, lora_rank=4, lora_target=["q_proj", "v_proj"])
    train_policy(_cfg(tiny_model_dir, data, tmp_path / "single", opts))
    res = _torchrun(_train_args(tiny_model_dir, data, tmp_path / "fsdp", opts), _env())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert _max_diff(tmp_path / "single", tmp_path / "fsdp") < FSDP_TOLERANCE


def test_cli_resume_after_sigkill(tiny_model_dir, tmp_path):
    """A real `topr train` process killed (SIGKILL) after its step-4 checkpoint, then --resume."""
    data = write_curated(tmp_path / "train.parquet", n=40, policy=str(tiny_model_dir))
    opts = dict(optimizer="adamw", lr=1e-3, batch_size=8, max_steps=7, save_every=2)
    train_policy(_cfg(tiny_model_dir, data, tmp_path / "ref", opts))
    out = tmp_path / "run"
    args = _train_args(tiny_model_dir, data, out, opts)
    killed = subprocess.run([sys.executable, KILLER, *args], env=_env(KILL_AFTER_CHECKPOINT="4"), capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not out.exists()
    lines = (tmp_path / "run.partial" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]
    done = subprocess.run([sys.executable, "-m", "toprcli", *args, "--resume"], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _max_diff(tmp_path / "ref", out) == 0.0
    assert not (tmp_path / "run.partial").exists()


def test_fsdp_streams_a_tied_embedding_model_into_the_shards(tmp_path):
    """Tied input/output embeddings (SmolLM2, Llama 3.2, Qwen 0.5B) stay one parameter under meta
    initialisation and streaming: 2 ranks == one process."""
    from toprcli.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tied", seed=3, tie_word_embeddings=True)
    data = write_curated(tmp_path / "train.parquet", n=24, policy=str(model))
    opts = dict(optimizer="adafactor", lr=1e-2, batch_size=12, max_steps=2)
    single = train_policy(_cfg(model, data, tmp_path / "single", opts))
    res = _torchrun(_train_args(model, data, tmp_path / "fsdp", opts), _env())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert _max_diff(tmp_path / "single", tmp_path / "fsdp") < FSDP_TOLERANCE
    assert _max_diff(model, tmp_path / "fsdp") > 1e-3
    from safetensors import safe_open

    names = [sorted(safe_open(d / "model.safetensors", "pt").keys()) for d in (tmp_path / "single", tmp_path / "fsdp")]
    assert names[0] == names[1] and "lm_head.weight" not in names[1]  # rank 0 writes the gathered dict: the tied tensor once
    fsdp = json.loads((tmp_path / "fsdp" / "train_summary.json").read_text())
    assert fsdp["world_size"] == 2 and fsdp["peak_host_rss_mib"] > 0 and single["peak_host_rss_mib"] > 0


def test_fsdp_shared_prefix_matches_one_process(tiny_model_dir, tmp_path):
    """Each decoder layer runs twice per forward (prompts, then completions): FSDP2 gathers it for both."""
    data = grouped_file(tmp_path / "train.parquet", per_prompt=(4, 1, 3, 6, 2, 5, 3, 4), policy=str(tiny_model_dir))
    opts = dict(optimizer="adafactor", lr=1e-2, batch_size=9, max_steps=2, micro_batch_tokens=60, shared_prefix=True)
    train_policy(_cfg(tiny_model_dir, data, tmp_path / "single", opts))
    res = _torchrun(_train_args(tiny_model_dir, data, tmp_path / "fsdp", opts), _env())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert _max_diff(tmp_path / "single", tmp_path / "fsdp") < FSDP_TOLERANCE
    assert json.loads((tmp_path / "fsdp" / "train_summary.json").read_text())["shared_prefix"]


def test_ranks_die_with_a_killed_torchrun_agent(tiny_model_dir, tmp_path):
    """SIGKILL the user's torchrun mid-run: its ranks exit too (none waits in a collective forever)."""
    import signal
    import time

    from toprcli.processes import descendants

    data = write_curated(tmp_path / "train.parquet", n=64, policy=str(tiny_model_dir))
    args = _train_args(tiny_model_dir, data, tmp_path / "out", dict(optimizer="adamw", batch_size=8, max_steps=10_000))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "toprcli", *args]
    agent = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = tmp_path / "out.partial" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.5)
    assert metrics.exists(), "training never started"
    ranks = descendants(agent.pid)
    assert len(ranks) >= 2
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait()
    deadline = time.time() + 15
    while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in ranks):
        time.sleep(0.2)
    alive = [p for p in ranks if Path(f"/proc/{p}").exists() and "zombie" not in Path(f"/proc/{p}/status").read_text()]
    assert not alive, f"ranks left behind: {alive}"


def test_a_large_all_reduce_goes_in_chunks_and_sums_every_element(tmp_path):
    """The pass over the data all-reduced one tensor of every token of the dataset on the device at once (130 GB at 8M
    rows of 4k tokens): it goes REDUCE_CHUNK elements at a time; each rank's part is summed in place, the max too.
    A choice made from one rank's view of the files holds only if every rank's agrees (every_rank)."""
    script = tmp_path / "reduce.py"
    script.write_text(
        "import os, sys, torch, torch.distributed as dist\n"
        "from toprcli.training import distributed as d\n"
        "dist.init_process_group('gloo')\n"
        "rank = dist.get_rank()\n"
        "ctx = d.DistContext(rank=rank, world_size=2)\n"
        "d.REDUCE_CHUNK = 3\n"
        "t = torch.zeros(10)\n"
        "t[rank::2] = torch.arange(10, dtype=torch.float32)[rank::2] + 1\n"
        "m = torch.full((7,), float(rank))\n"
        "d.all_reduce(t, ctx); d.all_reduce(m, ctx, op='max')\n"
        "agreed = [d.every_rank(True, ctx), d.every_rank(rank == 0, ctx), d.every_rank(False, ctx)]\n"  # a rank's own view, agreed
        "open(f'{sys.argv[1]}/rank{rank}.txt', 'w').write(f'{t.tolist()} {m.tolist()} {agreed}')\n"
        "dist.destroy_process_group()\n")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path)],
                         env=_env(), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    expected = f"{[float(i + 1) for i in range(10)]} {[1.0] * 7} {[True, False, False]}"
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == [expected, expected]


def test_more_local_ranks_than_gpus_is_refused_not_doubled_up(monkeypatch):
    """LOCAL_RANK modulo the visible GPUs (for a launcher that shows each rank its own) put ranks 4-7 of 8 on GPUs 0-3
    of 4: NCCL's duplicate-GPU error later. One GPU visible per rank is cuda:0; more ranks than GPUs, one line."""
    import torch

    from toprcli.errors import UserError
    from toprcli.training.distributed import local_cuda_index

    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert local_cuda_index() == 0
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert local_cuda_index() == 5
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    with pytest.raises(UserError, match="local rank 5 of a machine that shows 4 GPUs — start at most 4 ranks per machine"):
        local_cuda_index()
