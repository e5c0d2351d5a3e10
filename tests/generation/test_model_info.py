"""What a model directory says about itself (toprcli/generation/model_info.py): an in-place reload is
allowed exactly when the architecture and shapes are equal, however transformers spelt them."""

from __future__ import annotations

import json
import shutil

from toprcli.generation.model_info import same_architecture


def test_the_same_architecture_written_by_an_older_transformers_is_the_same(tiny_model_dir, tmp_path):
    """transformers 4.x wrote rope_theta and rope_scaling where 5.x writes rope_parameters: the raw files differ,
    the models do not (comparing the files restarted the engine at every reload of such a checkpoint)."""
    older = tmp_path / "older"
    shutil.copytree(tiny_model_dir, older)
    config = json.loads((older / "config.json").read_text())
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
    config.update(rope_scaling=None, transformers_version="4.46.0", torch_dtype=config.pop("dtype"))
    (older / "config.json").write_text(json.dumps(config))
    assert same_architecture(str(tiny_model_dir), str(older))
    config["num_hidden_layers"] += 1  # another shape: no reload in place
    (older / "config.json").write_text(json.dumps(config))
    assert not same_architecture(str(tiny_model_dir), str(older))
    assert not same_architecture(str(tiny_model_dir), "HuggingFaceTB/SmolLM2-135M")  # no local config to compare


def test_same_tokenizer_reads_what_the_files_say_not_their_bytes(tiny_model_dir, tmp_path):
    """A policy saved by toprcli (save_pretrained rewrites the files) and its verifier of one family compared unequal byte
    for byte, so the verifier never shared the engine; another chat template is another tokenizer."""
    import shutil

    from transformers import AutoTokenizer

    from toprcli.generation.model_info import same_tokenizer

    resaved = tmp_path / "resaved"
    shutil.copytree(tiny_model_dir, resaved)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(resaved)
    (resaved / "generation_config.json").write_text((resaved / "generation_config.json").read_text().replace("{", '{\n  "x_note": 1,', 1))
    assert same_tokenizer(str(tiny_model_dir), str(resaved))
    (resaved / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert not same_tokenizer(str(tiny_model_dir), str(resaved))
