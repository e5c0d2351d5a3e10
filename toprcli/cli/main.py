"""The `topr` app: one thin module per command, registered here.

Command modules import torch, vLLM and friends inside their functions, so
`topr --help` stays fast.
"""

from __future__ import annotations

import typer

from toprcli.cli import config_cmd, curate, generate, import_gguf, info, init_model, iterate, report, score, train, verifier_data
from toprcli.cli import eval as eval_cli

app = typer.Typer(
    name="topr",
    help=(
        "Offline, iterative RL of language models from verifiable rewards with TOPR "
        "(Tapered Off-Policy REINFORCE, arXiv 2503.14286).\n\n"
        "Stages: generate → score → curate → train → eval; `topr iterate` chains them per round."
    ),
    rich_markup_mode="rich",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_show_locals=False,
)

app.command("info")(info.info)
app.command("init-model")(init_model.init_model)
app.command("import-gguf")(import_gguf.import_gguf)
app.command("generate")(generate.generate)
app.command("score")(score.score)
app.command("curate")(curate.curate)
app.command("train")(train.train)
app.command("eval")(eval_cli.eval_command)
app.command("iterate")(iterate.iterate)
app.command("report")(report.report)
app.command("verifier-data")(verifier_data.verifier_data)
app.add_typer(config_cmd.app, name="config")


def main() -> None:
    """The ``topr`` script and ``python -m toprcli``: the command owns this process."""
    from toprcli.cli.common import begin_process, restore_output

    begin_process()
    try:
        app()
    finally:
        restore_output()  # a traceback (a bug) must reach the terminal, not the log
