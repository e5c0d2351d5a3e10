"""The `topr` app: one thin module per command, registered here."""

from __future__ import annotations

import typer

from toprcli.cli import config_cmd, info, init_model

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
app.command("generate")(__import__("toprcli.cli.generate", fromlist=["generate"]).generate)
app.command("score")(__import__("toprcli.cli.score", fromlist=["score"]).score)
app.command("eval")(__import__("toprcli.cli.eval", fromlist=["eval_command"]).eval_command)
app.command("iterate")(__import__("toprcli.cli.iterate", fromlist=["iterate"]).iterate)
app.command("report")(__import__("toprcli.cli.report", fromlist=["report"]).report)
app.command("curate")(__import__("toprcli.cli.curate", fromlist=["curate"]).curate)
app.command("train")(__import__("toprcli.cli.train", fromlist=["train"]).train)
app.add_typer(config_cmd.app, name="config")


def main() -> None:
    app()
