"""The README is executable truth.

* Blocks marked ``<!-- readme-test: run -->`` (the walkthroughs) run as written, each in a
  fresh directory with the installed ``topr`` on PATH.
* Every other ``topr ...`` line in the README's code blocks, and every example in every
  command's ``--help``, is parsed by the real CLI (click's ``make_context``: options, types,
  required arguments; nothing runs), so an unknown option or a missing argument fails.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer

from conftest import REPO
from toprcli.cli.main import app

README = REPO / "README.md"
RUN_MARK = "<!-- readme-test: run -->"
FENCE = re.compile(r"(?P<mark><!-- readme-test: run -->\n)?^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)\n(?P<code>.*?)\n(?P=indent)```", re.S | re.M)
SHELL_WORDS = {"do", "then", "else", "time", "nohup", "env", "srun", "exec"}
SEPARATORS = {";", "&&", "||", "|", "&", ">", ">>", "<", "2>", "(", ")"}


def code_blocks(text: str) -> list[tuple[str, bool]]:
    """(code, marked to run) of every fenced block."""
    return [(m["code"], bool(m["mark"])) for m in FENCE.finditer(text)]


def logical_lines(code: str) -> list[str]:
    return code.replace("\\\n", " ").splitlines()


def topr_argvs(line: str) -> list[list[str]]:
    """The argument lists of every ``topr`` (or ``-m toprcli``) invocation on a shell line."""
    line = re.sub(r"\$\{?\w+\}?", "1", line)  # shell variables: a placeholder value
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    segments, current = [], []
    for tok in tokens:
        if tok in SEPARATORS or set(tok) <= set(";&|<>()"):
            segments.append(current)
            current = []
        else:
            current.append(tok)
    segments.append(current)
    out = []
    for seg in segments:
        words = [w for w in seg if not re.fullmatch(r"\w+=\S*", w) or "topr" in seg[: seg.index(w)]]
        while words and words[0] in SHELL_WORDS:
            words = words[1:]
        if words and words[0] == "topr":
            out.append(words[1:])
        elif "-m" in words and words.index("-m") + 1 < len(words) and words[words.index("-m") + 1] == "toprcli":
            out.append(words[words.index("-m") + 2:])
    return out


def parse_problem(argv: list[str]) -> str | None:
    """None if the real CLI accepts ``argv`` (without running it), else click's message.

    typer may carry its own copy of click, so groups and errors are recognised by what they do.
    """
    cmd = typer.main.get_command(app)
    try:
        ctx = cmd.make_context("topr", list(argv))
        while hasattr(cmd, "resolve_command"):  # a group: descend to the subcommand
            rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
            if not rest:
                return None
            name, cmd, rest = cmd.resolve_command(ctx, rest)
            ctx = cmd.make_context(name, rest, parent=ctx)
    except Exception as e:
        if type(e).__name__ == "Exit":  # --help and the like
            return None
        if hasattr(e, "format_message"):
            return e.format_message()
        raise
    return None


def readme_problems(text: str) -> list[str]:
    """Every ``topr`` line of the README's code blocks that the CLI refuses, with why."""
    problems = []
    for code, _ in code_blocks(text):
        for line in logical_lines(code):
            for argv in topr_argvs(line):
                why = parse_problem(argv)
                if why:
                    problems.append(f"`{line.strip()}`: {why}")
    return problems


def help_examples() -> list[tuple[str, str]]:
    """(command, example line) of every command's ``Examples:`` / ``Example:`` in its --help."""
    root = typer.main.get_command(app)
    found = []

    def walk(cmd, path: str) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}")
            return
        doc = cmd.help or ""
        for line in re.findall(r"\[bold\](.*?)\[/\]", doc):
            if line.strip().startswith(("topr", "torchrun", "python")):
                found.append((path, line.replace('\\"', '"')))

    walk(root, "topr")
    return found


def test_every_topr_line_in_the_readme_parses():
    text = README.read_text()
    assert sum(len(topr_argvs(line)) for code, _ in code_blocks(text) for line in logical_lines(code)) > 25
    assert readme_problems(text) == []


def test_every_help_example_parses():
    examples = help_examples()
    commands = {c for c, _ in examples}
    assert {"topr generate", "topr score", "topr curate", "topr train", "topr eval", "topr iterate"} <= commands
    bad = [f"{c}: `{line}`: {why}" for c, line in examples for argv in topr_argvs(line) if (why := parse_problem(argv))]
    assert bad == []


def test_the_checker_catches_a_misspelt_option_and_a_missing_argument():
    text = README.read_text()
    assert "--max-new-tokens 64" in text
    misspelt = text.replace("--max-new-tokens 64", "--max-new-token 64", 1)
    problems = readme_problems(misspelt)
    assert len(problems) == 1 and "No such option: --max-new-token" in problems[0]
    missing = text.replace("topr report RUN_DIR", "topr report", 1) + "\n```bash\ntopr import-gguf model.gguf\n```\n"
    assert any("Missing argument" in p for p in readme_problems(missing))
    assert parse_problem(["eval", "-d", "builtin:gsm8k", "-m", "m", "-o", "o"]) is None
    assert "No such option" in parse_problem(["eval", "--no-such-flag"])


def test_readme_marks_the_walkthroughs_to_run():
    marked = [code for code, run in code_blocks(README.read_text()) if run]
    assert len(marked) == 2 and all("topr init-model" in code for code in marked)


@pytest.mark.integration
@pytest.mark.real_model
@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_readme_walkthrough_runs_as_written(which, tmp_path, smollm2_dir):
    """The marked block runs under bash -e in a fresh directory; every command exits 0 and its outputs exist."""
    (code,) = [c for c, run in code_blocks(README.read_text()) if run and f"models/{which}" in c]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "OMP_WAIT_POLICY": "PASSIVE"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # SmolLM2's default cache (15% of RAM) takes 15 s more to start; 2 prompts fill a little
    t0 = time.perf_counter()
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    print(f"README walkthrough ({which}): {time.perf_counter() - t0:.0f} s")
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n{done.stdout[-2000:]}"
    for out in ("samples/_manifest.json", "scored/_manifest.json", "train.parquet", "policy/config.json", "eval/eval.json"):
        assert (tmp_path / "work" / which / out).exists(), out  # each block its own work/<model>/: both run in one directory
    assert "Traceback" not in done.stderr
