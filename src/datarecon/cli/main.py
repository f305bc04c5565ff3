"""The ``datarecon`` command line.

Each area registers its commands from its own module (``register(app)``);
this module only assembles them and turns user errors into one-line messages
with exit code 2 (never a traceback).
"""

from __future__ import annotations

# typer and datarecon's own modules (which load torch) are imported inside the functions of this
# module, never at its top: the console script imports this module before main() runs, and a Ctrl-C
# during that import would end in a traceback. main() imports them inside its own error handling;
# the command modules (cli/*.py) are imported by make_app() and import at their top as usual.
import errno
import functools
import importlib
import os
import signal
import sqlite3
import sys
import threading
from collections.abc import Iterator
from typing import Any

# Modules that contribute commands, in help order.
_COMMAND_MODULES = ("data", "train", "reconstruct", "evaluate", "membership", "identifiability", "report", "run",
                    "sweep", "reproduce", "audit", "demo", "examples")
#: the top-level command each module registers → the module: a command line naming one of them imports that module
#: alone (the others load torch, scipy and matplotlib for nothing; docs/PERFORMANCE.md "Start-up").
#: ``tests/cli/test_commands.py`` checks it against what the modules register.
COMMAND_MODULE = {"data": "data", "train": "train", "info": "train", "reconstruct": "reconstruct",
                  "evaluate": "evaluate", "membership": "membership", "identifiability": "identifiability",
                  "report": "report", "run": "run", "sweep": "sweep", "store": "sweep", "reproduce": "reproduce",
                  "audit": "audit", "demo": "demo", "examples": "examples"}


def version_cmd() -> None:
    """Print the versions that determine numerical results."""
    import typer

    from datarecon.utils.io import versions

    for k, v in versions().items():
        typer.echo(f"{k} {v}")


@functools.cache
def make_app(only: str | None = None) -> Any:
    """The typer application with every area's commands registered (built once per process), or only those of the
    command module ``only`` (a name of :data:`_COMMAND_MODULES`: what a command line naming one command needs)."""
    import typer

    app = typer.Typer(
        rich_markup_mode=None,  # plain click help: readable at 80 columns, "[dp]" shown as typed
        name="datarecon",
        help="Training-data reconstruction attacks (KKT, DecoReco, bilevel) and their evaluation.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    app.command("version")(version_cmd)

    def _version_flag(value: bool) -> None:
        if value:
            version_cmd()
            raise typer.Exit()

    @app.callback()
    def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version_flag,
                                           help="Print the versions that determine numerical results, as "
                                           "`datarecon version` does, and exit.")) -> None:
        """Training-data reconstruction attacks (KKT, DecoReco, bilevel) and their evaluation."""
    for name in _COMMAND_MODULES if only is None else tuple(m for m in (only,) if m):
        importlib.import_module(f"datarecon.cli.{name}").register(app)
    return app


def module_for(args: list[str]) -> str | None:
    """The one command module a command line needs (its first argument names a command of it), "" for none
    (``version``, ``--version``), else None: every module (``--help`` of the whole program, a typo)."""
    first = args[0] if args else ""
    if first in ("version", "--version"):
        return ""
    return COMMAND_MODULE.get(first)


#: exit code of a run stopped by Ctrl-C (128 + SIGINT), as shells report it
INTERRUPTED = 130
#: exit code of a run stopped by SIGTERM (128 + SIGTERM)
TERMINATED = 143
#: what to do after Ctrl-C, SIGTERM or a full disk, per command; commands not listed are simply rerun
_RESUME_HINTS = {
    "train": "rerun the same command with --resume to continue from the last checkpoint",
    "reconstruct": "rerun the same command with --resume to continue from the last checkpoint",
    "run": "rerun the same command to resume the experiment (finished stages are skipped)",
    "sweep": "rerun the same command to resume the sweep (finished runs are skipped, the others continue "
             "from their checkpoints)",
    "reproduce": "rerun the same command with --resume to continue (finished pieces are skipped)",
    "audit": "rerun the same command with --resume to continue (finished pieces are skipped)",
    "demo": "rerun it with --overwrite to start afresh",
    "membership": "rerun the same command to continue (the reference models finished in --out are kept and not "
                  "trained again)",
}
_RERUN = "rerun the same command"


def _command(argv: list[str]) -> str:
    return next((a for a in argv if not a.startswith("-")), "")


def interrupt_message(argv: list[str], *, terminated: bool = False) -> str:
    """The line printed after Ctrl-C (or SIGTERM): that the run stopped, and how to continue it."""
    hint = _RESUME_HINTS.get(_command(argv))
    return ("terminated" if terminated else "interrupted") + (f"; {hint}" if hint else "")


def continue_hint(argv: list[str]) -> str:
    """How to continue a command that stopped on an environment error (a full disk)."""
    return _RESUME_HINTS.get(_command(argv), _RERUN).split(" to ")[0]


class _Signals:
    """SIGTERM raises KeyboardInterrupt (so a run checkpoints and stops as on Ctrl-C) and is remembered."""

    terminated = False

    def __enter__(self) -> _Signals:
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_term)
        return self

    def _on_term(self, signum: int, frame: Any) -> None:
        if not _Signals.terminated:
            _Signals.terminated = True
            raise KeyboardInterrupt

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _option_value(argv: list[str], *names: str) -> str | None:
    """The value of the first of ``names`` on the command line (``--out X`` or ``--out=X``), or None."""
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
        if any(arg.startswith(f"{n}=") for n in names):
            return arg.split("=", 1)[1]
    return None


def environment_message(exc: BaseException, argv: list[str]) -> str | None:
    """One line for an error of the environment (disk, permissions, paths, memory, a damaged store
    index), naming the fix; None for anything else (an internal error)."""
    from datarecon.utils.atomic import DISK_FULL_ERRNOS, disk_full_message

    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and any(
            s in str(exc) for s in ("can't allocate memory", "out of memory", "not enough memory"))):
        return ("not enough memory for these sizes (" + " ".join(str(exc).split())[:160] + "); reduce the sizes "
                "(--candidates, --hidden, --n-per-class, batch sizes) or use a machine with more memory")
    out = _option_value(argv, "--out", "-o")
    if isinstance(exc, sqlite3.OperationalError) and "full" in str(exc):
        return disk_full_message(f"the results index in {out}" if out else "the results index (index.sqlite)",
                                 hint=continue_hint(argv))
    if isinstance(exc, sqlite3.DatabaseError):
        return (f"the results index is damaged ({exc}); rebuild it from the run folders with "
                "`datarecon store rebuild STORE` (the runs themselves are intact)")
    if not isinstance(exc, OSError):
        return None
    where = exc.filename if exc.filename is not None else "a file"
    if exc.errno in DISK_FULL_ERRNOS:  # a write that names no file: the folder it wrote into, at least
        return disk_full_message(exc.filename or (f"a file in {out}" if out else None), hint=continue_hint(argv))
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"cannot write {where}: {exc.strerror.lower() if exc.strerror else 'permission denied'}; choose an "
                "--out in a folder you can write (or fix its permissions)")
    if exc.errno == errno.ENAMETOOLONG:
        return f"the path {str(where)[:80]}... is too long for the filesystem; choose a shorter --out"
    if exc.errno == errno.ENOTDIR:
        return f"{where}: a part of this path is a file, not a folder; choose another --out"
    if exc.errno == errno.EISDIR:
        return f"{where} is a folder where a file is needed; choose another path"
    if exc.errno == errno.ENOENT:
        return f"{where} not found; check the path"
    return f"{exc.strerror or type(exc).__name__}: {where}; check the path and the disk"


def _walk_commands(cmd: Any) -> Iterator[Any]:
    """``cmd`` and every sub-command under it (depth first)."""
    yield cmd
    for sub in getattr(cmd, "commands", {}).values():
        yield from _walk_commands(sub)


def build_command(args: list[str] | None = None) -> Any:
    """The (click) command tree of :func:`make_app` (only the module ``args`` names a command of, when it names
    one), with flags shown as flags.

    typer labels boolean flags ``<bool>`` in the help, which reads as if ``--resume true`` were
    accepted; flags take no value, so their type column is left empty here.
    """
    import typer.main

    from datarecon.cli._repeats import refuse_repeats

    cmd = typer.main.get_command(make_app(module_for(args or [])))
    for command in _walk_commands(cmd):
        if not getattr(command, "commands", None):  # a leaf command: a single-valued option given twice is an error
            refuse_repeats(command, _usage_errors()[0])
        for param in command.params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
    return cmd


def _usage_errors() -> tuple[type[Exception], type[Exception]]:
    """(UsageError, NoArgsIsHelpError) of the click that typer runs on: recent typers ship their own
    copy (``typer._click``), older ones use the ``click`` package (before click 8.2 a bare group
    prints its help without an exception: a class nothing raises stands in)."""
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
    :class:`DataReconError` become ``error: <message>`` on one line with exit 2, and so do errors
    of the environment (a full disk, a path that cannot be written, too little memory, a damaged
    store index: :func:`environment_message`); Ctrl-C prints how to resume and exits 130, SIGTERM
    the same with exit 143; anything else is an internal error (exit 1) whose traceback is shown
    only with ``DATARECON_DEBUG=1``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            from datarecon.cli._common import set_invocation
        except Exception as exc:  # loading failed: an installed package's damaged metadata is named, else re-raised
            damaged = damaged_metadata()
            if damaged is None or os.environ.get("DATARECON_DEBUG"):
                raise
            print(f"error: {damaged}, and PyTorch reads every installed package's entry points as it loads "
                  f"({type(exc).__name__}); reinstall or remove that package", file=sys.stderr)
            return 2

        usage_error, no_args_is_help = _usage_errors()
        set_invocation(args)
        _Signals.terminated = False
        with _Signals():
            return _run(args, usage_error, no_args_is_help)
    except KeyboardInterrupt:  # Ctrl-C while the command line was still loading (nothing was written)
        print(interrupt_message(args), file=sys.stderr)
        return INTERRUPTED


def damaged_metadata() -> str | None:
    """The first installed distribution whose metadata cannot be read (its ``entry_points.txt`` not UTF-8 or not
    parsed), in words; None when every one reads."""
    from importlib.metadata import distributions

    for dist in distributions():
        try:
            dist.entry_points  # noqa: B018 - read for its failure
        except Exception as exc:  # noqa: BLE001 - any failure of third-party metadata is the answer
            return (f"the installed package metadata in {getattr(dist, '_path', '?')} cannot be read "
                    f"({type(exc).__name__}: {exc})")
    return None


def _stopped(args: list[str]) -> int:
    import typer

    terminated = _Signals.terminated
    typer.echo(interrupt_message(args, terminated=terminated), err=True)
    return TERMINATED if terminated else INTERRUPTED


def empty_argument(args: list[str]) -> str | None:
    """The refusal of an empty argument (``--out ""``, ``--out=``, ``run ""``), else None.

    An empty string is never a meaningful path or value, and as a path it would read as the current
    folder (``--out ""`` would name the folder the command runs in).
    """
    for i, arg in enumerate(args):
        if arg.startswith("--") and arg.endswith("=") and len(arg) > 3:
            return f"an empty value was given for {arg[:-1]}; pass a non-empty path or value"
        if arg == "":
            after = f"after {args[i - 1]} " if i > 0 else ""
            return f"an empty argument was given {after}(\"\"); pass a non-empty path or value"
    return None


def _run(args: list[str], usage_error: type[Exception], no_args_is_help: type[Exception]) -> int:
    import typer

    from datarecon.cli._warnings import cli_warnings
    from datarecon.errors import DataReconError, DiskFullError
    from datarecon.registry import plugin_failure
    from datarecon.utils.atomic import disk_full_message

    try:
        if (empty := empty_argument(args)) is not None:
            raise DataReconError(empty)
        with cli_warnings():  # one line each, "warning: ...", once per topic
            returned = build_command(args).main(args=args, standalone_mode=False, prog_name="datarecon")
        # typer.Exit(code) comes back as code
        code = returned if isinstance(returned, int) and not isinstance(returned, bool) else 0
        if code == INTERRUPTED:  # typer turns KeyboardInterrupt into a silent Exit(130)
            return _stopped(args)
        return code
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except no_args_is_help as exc:  # a bare command group: its help
        exc.show()
        return exc.exit_code
    except usage_error as exc:
        typer.echo(f"error: {usage_message(exc)}", err=True)
        return exc.exit_code
    except typer.Abort:
        return _stopped(args)
    except DataReconError as exc:
        text = disk_full_message(exc.path, hint=continue_hint(args)) if isinstance(exc, DiskFullError) else \
            exc.cli_message
        typer.echo(f"error: {_one_line(text)}", err=True)
        return 2
    except KeyboardInterrupt:
        return _stopped(args)
    except Exception as exc:
        message = environment_message(exc, args) or plugin_failure(exc)
        if message is not None:
            typer.echo(f"error: {_one_line(message)}", err=True)
            return 2
        if os.environ.get("DATARECON_DEBUG"):
            raise
        typer.echo(f"internal error: {type(exc).__name__}: {exc} (set DATARECON_DEBUG=1 for a traceback)",
                   err=True)
        return 1


def _one_line(text: str) -> str:
    """``text`` on one line (an error message built from a library's multi-line text)."""
    return " ".join(text.split())


def entry() -> None:
    """The console script (and ``python -m datarecon.cli.main``): :func:`main`, then exit with its code.

    After Ctrl-C or SIGTERM the process ends with ``os._exit`` once its output is flushed: every
    run has checkpointed and every file is written and fsynced by then, and the interpreter's own
    shutdown could abort the process: PyTorch's C++ threads that served the interrupted runs'
    autograd calls are torn down by static destructors then ("terminate called without an active
    exception", SIGABRT instead of exit 130; pytorch/pytorch#38228 describes the mechanism).
    """
    code = main()
    if code in (INTERRUPTED, TERMINATED):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
