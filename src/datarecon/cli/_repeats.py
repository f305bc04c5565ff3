"""Refuse a file or folder option given more than once.

click keeps the last value of an option that is not ``multiple``: ``datarecon evaluate RUN
--train a.safetensors --train b.safetensors`` would evaluate against ``b`` without a word. For an
option that names a file or folder (training images, a config, an output folder, a data folder)
one of several would be picked silently, so :func:`refuse_repeats` makes a leaf command fail,
before it runs, with a usage error naming the option and how often it was given. Numbers and
words keep the usual last-one-wins rule (``--epochs 40 ... --epochs 2`` overrides), which scripts
rely on to override a default they spelled out earlier.
"""

from __future__ import annotations

import pathlib
import typing
from collections.abc import Sequence
from typing import Any

__all__ = ["is_path_option", "repeated_options", "refuse_repeats"]


def repeated_options(params: Sequence[Any], args: Sequence[str]) -> list[tuple[str, int]]:
    """``(option name, count)`` for every single-valued file or folder option that ``args`` gives more than once.

    Args:
        params: a click command's parameters.
        args: the command's own arguments (after its name); ``--`` ends the options.

    Returns:
        In the order of ``params``; flags, ``multiple`` options and options whose values are not
        paths are never reported.
    """
    tokens = list(args)
    if "--" in tokens:
        tokens = tokens[:tokens.index("--")]
    out = []
    for p in params:
        opts = [*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())]
        if getattr(p, "param_type_name", "") != "option" or getattr(p, "multiple", False) \
                or getattr(p, "is_flag", False) or getattr(p, "count", False) or not is_path_option(p):
            continue
        n = sum(1 for t in tokens for o in opts if t == o or (o.startswith("--") and t.startswith(o + "=")))
        if n > 1:
            out.append((max(opts, key=len), n))
    return out


def is_path_option(param: Any) -> bool:
    """Whether the option's values are files or folders: click's ``Path`` type, or (typer versions that
    keep the annotation instead) a ``pathlib.Path`` annotation, alone or in a union with None."""
    if type(getattr(param, "type", None)).__name__ == "Path":
        return True
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    candidates = [annotation, *typing.get_args(annotation)]
    return any(isinstance(a, type) and issubclass(a, pathlib.PurePath) for a in candidates)


def refuse_repeats(cmd: Any, usage_error: type[Exception]) -> None:
    """Wrap ``cmd.parse_args`` so that a repeated single-valued option is a usage error (exit 2)."""
    parse = cmd.parse_args

    def parse_args(ctx: Any, args: list[str]) -> list[str]:
        repeated = repeated_options(cmd.params, args)
        if repeated:
            name, n = repeated[0]
            raise usage_error(f"{name} given {n} times; give it once", ctx=ctx)
        return parse(ctx, args)

    cmd.parse_args = parse_args
