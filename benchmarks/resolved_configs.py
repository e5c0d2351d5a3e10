"""The resolved config of every stage command the README and the commands' --help examples show, as JSON.

A refactoring check for the CLI and the config: run it before and after a change and compare the two
files. Each command is parsed and resolved by the real CLI (options, --config, --set, defaults), and
its stage is replaced by a recorder, so nothing runs: no model, no engine, no files written but the
ones ``iterate`` makes to check its run dir (in a temporary working directory). A command the CLI refuses
records its error line instead.

Usage: python benchmarks/resolved_configs.py OUT.json
  e.g. git stash && python benchmarks/resolved_configs.py /tmp/before.json && git stash pop
       python benchmarks/resolved_configs.py /tmp/after.json && cmp /tmp/before.json /tmp/after.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import typer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from test_readme import README, code_blocks, logical_lines, topr_argvs  # noqa: E402
from toprcli.cli import curate, eval as eval_cli, generate, iterate, score, train, verifier_data  # noqa: E402
from toprcli.cli.main import app  # noqa: E402
from toprcli.config import config_to_dict  # noqa: E402

STAGES = {s.STAGE.name: s.STAGE for s in (generate, score, curate, train, eval_cli, iterate, verifier_data)}


def commands() -> list[list[str]]:
    """Every stage command of the README's code blocks and of every command's --help examples, once each."""
    lines = [line for code, _ in code_blocks(README.read_text()) for line in logical_lines(code)]
    group = typer.main.get_command(app)
    for name in STAGES:
        lines += [line.replace("[bold]", "").replace("[/]", "") for line in (group.commands[name].help or "").splitlines()]
    seen: dict[str, list[str]] = {}
    for line in lines:
        for argv in topr_argvs(line):
            if argv and argv[0] in STAGES:
                seen.setdefault(json.dumps(argv), argv)
    return list(seen.values())


def resolve(argv: list[str]) -> dict:
    recorded: dict = {}

    def record(cfg, **_):
        recorded["config"] = config_to_dict(cfg)
        raise typer.Exit(0)

    stage = STAGES[argv[0]]
    stage.run, run = record, stage.run
    try:
        result = CliRunner().invoke(app, argv)
    finally:
        stage.run = run
    return recorded or {"exit_code": result.exit_code, "error": result.output.strip().splitlines()[-1:] if result.output else []}


def main() -> None:
    out = Path(sys.argv[1]).absolute()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # iterate checks its run dir by making it: here, not in the checkout
        (Path(tmp) / "configs").symlink_to(REPO / "configs")  # the examples name configs/demo.yaml
        found = {" ".join(argv): resolve(argv) for argv in commands()}
    out.write_text(json.dumps(found, indent=1, sort_keys=True, default=str) + "\n")
    errors = sum("error" in v for v in found.values())
    print(f"{len(found)} commands resolved ({errors} refused by the CLI) → {out}")


if __name__ == "__main__":
    main()
