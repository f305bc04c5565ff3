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
_COMMAND_MODULES = ("data", "train", "reconstruct", "evaluate", "report", "sweep", "reproduce", "demo",
                    "examples")


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
    cmd = typer.main.get_command(app)
    for c in _walk_commands(cmd):
        for param in c.params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
    return cmd


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code.

    Usage errors are reported by typer itself (exit 2); :class:`DataReconError` becomes
    ``error: <message>`` with exit 2; anything else is an internal error (exit 1) whose
    traceback is shown only with ``DATARECON_DEBUG=1``.
    """
    try:
        build_command().main(args=argv, standalone_mode=True, prog_name="datarecon")
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except DataReconError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    except KeyboardInterrupt:
        typer.echo("interrupted; rerun the same command with --resume to continue", err=True)
        return 130
    except Exception as exc:
        if os.environ.get("DATARECON_DEBUG"):
            raise
        typer.echo(f"internal error: {type(exc).__name__}: {exc} (set DATARECON_DEBUG=1 for a traceback)",
                   err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
