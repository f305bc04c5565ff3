"""Shared tail of the benchmark scripts: where results go and how they are written.

Imported by the scripts as ``from _common import ...`` (``python benchmarks/<script>.py`` puts
this folder first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: Default folder of the JSON results.
RESULTS_DIR = Path(__file__).parent / "results"


def base_parser(doc: str | None, *, quick_help: str, repeats_help: str) -> argparse.ArgumentParser:
    """The options every timing benchmark takes: --quick, --repeats, --threads, --out."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--repeats", type=int, default=None, help=repeats_help)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--out", type=Path, default=None, help="JSON output path")
    return ap


def results_path(name: str, *, quick: bool, out: Path | None = None) -> Path:
    """``out`` if given, else ``benchmarks/results/<name>.json`` (``<name>_quick.json`` when ``quick``)."""
    return out or RESULTS_DIR / (f"{name}_quick.json" if quick else f"{name}.json")


def write_results(out: Path, *, benchmark: str, quick: bool, **fields: Any) -> None:
    """Write the results JSON atomically, then print ``wrote <out>``.

    Args:
        out: Destination file (its folder is created).
        benchmark: Benchmark name (``"benchmark"`` key).
        quick: Whether ``--quick`` was given (``"quick"`` key).
        **fields: Benchmark-specific entries; ``command`` (this process's argv), ``threads``
            (``torch.get_num_threads()``) and ``versions`` (``datarecon.utils.io.versions()``)
            are added.
    """
    import torch

    from datarecon.utils.io import atomic_write_json, versions

    atomic_write_json(out, {"benchmark": benchmark, "quick": quick, "command": " ".join(sys.argv),
                            "threads": torch.get_num_threads(), "versions": versions(), **fields})
    print(f"wrote {out}")


def machine() -> dict[str, Any]:
    """Where a measurement ran: CPU count, load average (1, 5, 15 min) and the torch thread count."""
    import os

    import torch

    return {"cpus": os.cpu_count(), "load_average": [round(v, 2) for v in os.getloadavg()],
            "threads": torch.get_num_threads()}


def set_threads(threads: int | None) -> None:
    """``torch.set_num_threads(threads)`` when given."""
    if threads:
        import torch

        torch.set_num_threads(int(threads))
