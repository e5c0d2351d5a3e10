"""The `topr` app: stage commands built from their configs (cli/builder.py), the rest by hand.

Command modules import torch, vLLM and friends inside their functions; the configs they are
built from import the loss registry (torch), so `topr --help` takes about two seconds.
"""

from __future__ import annotations

import inspect
import re
import shutil
import sys
import traceback
from typing import Annotated

import typer
from typer import rich_utils

from toprcli.cli import config_cmd, curate, generate, info, iterate, models, report, score, train, verifier_data
from toprcli.cli import eval as eval_cli
from toprcli.cli.builder import register
from toprcli.cli.common import begin_process, fail, note_in_log, restore_output, tell_interrupted

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

if rich_utils.MAX_WIDTH is None and not sys.stdout.isatty():  # `--help | less`: 80 columns split the examples' commands
    rich_utils.MAX_WIDTH = 200  # (TERMINAL_WIDTH, when set, still decides)


def _print_version(value: bool) -> None:
    if value:
        from toprcli import __version__

        typer.echo(f"topr {__version__}")
        raise typer.Exit()


@app.callback()
def _topr(version: Annotated[bool, typer.Option("--version", "-V", metavar="", callback=_print_version, is_eager=True,
                                                help="Print topr's version and exit (`topr info`: every package's).")] = False) -> None:
    pass


app.command("info")(info.info)
app.command("init-model")(models.init_model)
app.command("import-gguf")(models.import_gguf)
register(app, generate.STAGE, score.STAGE, curate.STAGE, train.STAGE, eval_cli.STAGE, iterate.STAGE, verifier_data.STAGE)
app.command("report")(report.report)
app.add_typer(config_cmd.app, name="config")

HELP_COLUMNS = 120  # typer's option table (flag, --no-flag, type, help) needs this many: below, flag names are cut


def _plain_help(doc: str | None) -> str | None:
    """A command's help without rich markup for click's plain formatter; an indented block (the examples) kept as written."""
    if doc is None:
        return None
    paragraphs = inspect.cleandoc(re.sub(r"\[/?bold\]|\[/\]", "", doc)).split("\n\n")
    return "\n\n".join("\b\n" + p if any(line.startswith(" ") for line in p.splitlines()) else p for p in paragraphs)


if sys.stdout.isatty() and shutil.get_terminal_size().columns < HELP_COLUMNS:  # an 80-column terminal: click's help wraps
    app.rich_markup_mode = config_cmd.app.rich_markup_mode = None
    for command in [*app.registered_commands, *config_cmd.app.registered_commands]:
        command.help = _plain_help(command.help or command.callback.__doc__)


def main() -> None:
    """The ``topr`` script and ``python -m toprcli``: the command owns this process."""
    from toprcli.interrupt import Interrupted

    begin_process()
    try:
        code = app(standalone_mode=False)  # click's usage errors come here (usage_error), to be one line like every other
        raise SystemExit(code if isinstance(code, int) else 0)
    except Interrupted as e:  # before a command's own handler runs, or after it returned (typer does not catch it)
        tell_interrupted(e)
        raise SystemExit(e.exit_code) from None
    except Exception as e:
        if not any(c.__name__ == "UsageError" for c in type(e).__mro__):  # typer carries its own copy of click
            note_in_log(traceback.format_exc())  # a bug's traceback: on the terminal, and kept with the run
            raise
        raise SystemExit(usage_error(e)) from None
    finally:
        restore_output()  # a traceback (a bug) must reach the terminal, not the log


def usage_error(e: Exception) -> int:
    """Click's usage error (an unknown option or command, a value of the wrong type, a missing argument) as one error
    line, like every other bad input; ``topr`` or ``topr config`` alone still show their help. The exit code."""
    if type(e).__name__ == "NoArgsIsHelpError":
        if app.rich_markup_mode is None:  # click's plain help (a narrow terminal) is the error's message
            typer.echo(e.format_message())
        else:
            rich_utils.rich_format_error(e)  # typer printed the help as it made the error
        return e.exit_code
    where = e.ctx.command_path if e.ctx is not None else "topr"
    return fail(f"{e.format_message()} — see `{where} --help`").exit_code
