"""Example configuration files shipped with the package (sweeps, reproduction overrides).

The files live in ``datarecon/examples/`` inside the installed package (``examples/`` in a
source checkout points there), so ``pip install datarecon`` users have them too:
:func:`list_examples` names them with their one-line summary and :func:`copy_example` copies one
out (``datarecon examples [NAME]`` on the command line).

Example:
    >>> from datarecon.experiments.examples import copy_example, list_examples
    >>> sorted(list_examples())[:1]
    ['runkel2024-paper-dryrun.yaml']
    >>> copy_example("sweep-tiny.yaml", out="my-sweep.yaml")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from datarecon.errors import DataReconError
from datarecon.kernel.outdir import check_out_file
from datarecon.utils.io import atomic_write_bytes

__all__ = ["list_examples", "read_example", "copy_example"]

_SUFFIXES = (".yaml", ".yml", ".toml")


def _folder():
    return resources.files("datarecon") / "examples"


def list_examples() -> dict[str, str]:
    """``{file name: summary}`` of the shipped examples, sorted by name.

    The summary is the first comment line of the file (without ``#``), or "".
    """
    out: dict[str, str] = {}
    for entry in sorted(_folder().iterdir(), key=lambda e: e.name):
        if entry.is_file() and entry.name.endswith(_SUFFIXES):
            first = next((ln for ln in entry.read_text(encoding="utf-8").splitlines() if ln.strip()), "")
            out[entry.name] = first.lstrip("#").strip().rstrip(":") if first.lstrip().startswith("#") else ""
    return out


def read_example(name: str) -> bytes:
    """The bytes of example ``name`` (a file name from :func:`list_examples`).

    Raises:
        DataReconError: unknown name (the message lists the shipped ones).
    """
    names = list_examples()
    if name not in names:
        raise DataReconError(f"unknown example {name!r}; shipped examples: {', '.join(names)} "
                             "(`datarecon examples` lists them)")
    return (_folder() / name).read_bytes()


def copy_example(name: str, *, out: str | os.PathLike | None = None, overwrite: bool = False) -> Path:
    """Copy example ``name`` to ``out`` (default: ``./NAME``; a folder receives ``NAME`` inside it).

    Args:
        name: A file name from :func:`list_examples`.
        out: Destination file, or a folder: an existing one, or one written with a trailing slash
            (``--out configs/``), which is created.
        overwrite: Replace an existing destination file that is an unchanged copy of a shipped
            example (the output rule of every command: :func:`datarecon.kernel.outdir.check_out_file`;
            an edited copy is the user's and is kept).

    Returns:
        The path written.

    Raises:
        DataReconError: unknown name, the destination lies inside another datarecon folder, or it
            exists and is not replaceable (``overwrite`` False, or not an unchanged example).
    """
    data = read_example(name)
    dest = Path(name) if out is None else Path(out)
    if dest.is_dir() or (out is not None and str(out).endswith(("/", os.sep))):
        dest = dest / name
    check_out_file(dest, overwrite=overwrite, ours=is_shipped_example, what="copy of a shipped example")
    atomic_write_bytes(dest, data)
    return dest


def is_shipped_example(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds exactly one of the shipped examples (a copy nobody edited)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return False
    return any(data == read_example(name) for name in list_examples())
