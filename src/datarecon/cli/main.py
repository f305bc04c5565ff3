"""The ``datarecon`` command line.

Each area registers its commands from its own module (``register(app)``);
this module only assembles them and turns user errors into one-line messages
with exit code 2 (never a traceback).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import typer
import typer.main

from datarecon.errors import DataReconError

app = typer.Typer(
    name="datarecon",
    help="Training-data reconstruction attacks (KKT, DecoReco, bilevel) and their evaluation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Modules that contribute commands, in help order.
_COMMAND_MODULES = ("data", "train", "reconstruct", "evaluate", "membership", "report", "run", "sweep", "reproduce",
                    "audit", "demo", "examples")


@app.command("version")
def version_cmd() -> None:
    """Print the versions that determine numerical results."""
    from datarecon.utils.io import versions

    for k, v in versions().items():
        typer.echo(f"{k} {v}")


def _register_all() -> None:
    import importlib

    for name in _COMMAND_MODULES:
        module = importlib.import_module(f"datarecon.cli.{name}")
        module.register(app)


_register_all()


#: exit code of a run stopped by Ctrl-C (128 + SIGINT), as shells report it
INTERRUPTED = 130
#: what to do after Ctrl-C, per command; commands not listed have nothing to resume
_RESUME_HINTS = {
    "train": "rerun the same command with --resume to continue from the last checkpoint",
    "reconstruct": "rerun the same command with --resume to continue from the last checkpoint",
    "run": "rerun the same command to resume the experiment (finished stages are skipped)",
    "sweep": "rerun the same command to resume the sweep (finished runs are skipped, the others continue "
             "from their checkpoints)",
    "reproduce": "rerun the same command with --resume to continue (finished pieces are skipped)",
    "demo": "rerun it with --overwrite to start afresh",
}


def interrupt_message(argv: list[str]) -> str:
    """The line printed after Ctrl-C: that the run stopped, and how to continue it."""
    command = next((a for a in argv if not a.startswith("-")), "")
    hint = _RESUME_HINTS.get(command)
    return "interrupted" + (f"; {hint}" if hint else "")


def _walk_commands(cmd: Any) -> Iterator[Any]:
    """``cmd`` and every sub-command under it (depth first)."""
    yield cmd
    for sub in getattr(cmd, "commands", {}).values():
        yield from _walk_commands(sub)


def build_command() -> Any:
    """The (click) command tree of :data:`app`, with flags shown as flags.

    typer labels boolean flags ``<bool>`` in the help, which reads as if ``--resume true`` were
    accepted; flags take no value, so their type column is left empty here.
    """
    from datarecon.cli._repeats import refuse_repeats

    cmd = typer.main.get_command(app)
    for c in _walk_commands(cmd):
        if not getattr(c, "commands", None):  # a leaf command: a single-valued option given twice is an error
            refuse_repeats(c, _usage_errors()[0])
        for param in c.params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
    return cmd


def _usage_errors() -> tuple[type[Exception], type[Exception]]:
    """(UsageError, NoArgsIsHelpError) of the click that typer runs on: recent typers ship their own
    copy (``typer._click``), older ones use the ``click`` package (before click 8.2 a bare group
    prints its help without an exception: a class nothing raises stands in)."""
    import importlib

    import typer.core

    click = getattr(typer.core, "_click", None) or importlib.import_module("click")
    no_args = getattr(click.exceptions, "NoArgsIsHelpError", None) or type("NeverRaised", (Exception,), {})
    return click.exceptions.UsageError, no_args


def usage_message(exc: Any) -> str:
    """One line for a click usage error: click's own words (which name the option and, for a typo,
    the options it resembles) and where the command's options are listed."""
    text = " ".join(exc.format_message().split())
    text += "" if text.endswith((".", "?", "!")) else "."
    ctx = getattr(exc, "ctx", None)
    return text + (f" See '{ctx.command_path} --help'." if ctx is not None else "")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code.

    Usage errors (an unknown or missing option, a value of the wrong type) and
    :class:`DataReconError` become ``error: <message>`` on one line with exit 2, and so does a full
    disk (which file, and that the last checkpoint is intact); Ctrl-C prints how to resume and exits
    130; anything else is an internal error (exit 1) whose traceback is shown only with
    ``DATARECON_DEBUG=1``.
    """
    from datarecon.utils.io import DISK_FULL_ERRNOS, disk_full_message

    usage_error, no_args_is_help = _usage_errors()

    from datarecon.cli._warnings import cli_warnings

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        with cli_warnings():  # one line each, "warning: ...", once per topic
            rv = build_command().main(args=args, standalone_mode=False, prog_name="datarecon")
        code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0  # typer.Exit(code) comes back as code
        if code == INTERRUPTED:  # typer turns KeyboardInterrupt into a silent Exit(130)
            typer.echo(interrupt_message(args), err=True)
        return code
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except no_args_is_help as exc:  # a bare command group: its help, as before
        exc.show()
        return exc.exit_code
    except usage_error as exc:
        typer.echo(f"error: {usage_message(exc)}", err=True)
        return exc.exit_code
    except typer.Abort:
        typer.echo(interrupt_message(args), err=True)
        return INTERRUPTED
    except DataReconError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    except KeyboardInterrupt:
        typer.echo(interrupt_message(args), err=True)
        return INTERRUPTED
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:  # e.g. a history append
            typer.echo(f"error: {disk_full_message(exc.filename)}", err=True)
            return 2
        if os.environ.get("DATARECON_DEBUG"):
            raise
        typer.echo(f"internal error: {type(exc).__name__}: {exc} (set DATARECON_DEBUG=1 for a traceback)",
                   err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
