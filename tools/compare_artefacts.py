"""Compare two output folders of the same command file by file: tensors bit for bit, JSON values.

Used to check that a refactoring leaves the smoke reproductions unchanged (docs/DESIGN.md):

    datarecon reproduce haim2022 --scale smoke --threads 1 --out BEFORE   # on the old commit
    datarecon reproduce haim2022 --scale smoke --threads 1 --out AFTER    # on the new one
    python tools/compare_artefacts.py BEFORE AFTER

Compares every ``.safetensors`` (dtype, shape and bytes of each tensor), ``.json`` / ``.jsonl``
(values, recursively) and ``.csv`` (text) file present in both folders; keys that hold times,
versions, paths or host details are skipped. Prints each difference (at most 5 per file) and the
counts; exits 1 when a file differs or exists on one side only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

SUFFIXES = (".safetensors", ".json", ".jsonl", ".csv")
#: the tensor of a checkpoint that holds its JSON metadata (datarecon.kernel.checkpoint)
META = "__meta__"
#: substrings of JSON keys whose values differ between identical runs (clocks, machines, folders)
SKIP = ("wall", "time", "versions", "_s", "started", "finished", "updated", "path", "dir", "out", "command",
        "created", "host", "pid", "mtime", "elapsed")


#: (first folder, second folder) as strings: a value that differs only by them is the same
_ROOTS: list[str] = []


def _walk(x, y, where: str, diffs: list[str]) -> None:
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            if any(s in k for s in SKIP):
                continue
            if k not in x or k not in y:
                diffs.append(f"{where}.{k}: missing on one side")
            else:
                _walk(x[k], y[k], f"{where}.{k}", diffs)
    elif isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            diffs.append(f"{where}: length {len(x)} vs {len(y)}")
            return
        for i, (u, v) in enumerate(zip(x, y)):
            _walk(u, v, f"{where}[{i}]", diffs)
    elif x != y and not (isinstance(x, str) and isinstance(y, str) and _ROOTS and x.replace(*_ROOTS) == y):
        diffs.append(f"{where}: {str(x)[:60]} vs {str(y)[:60]}")


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))) \
        if a.dtype != torch.bool else bool(torch.equal(a, b))


def _file_diffs(a: Path, b: Path, rel: Path) -> tuple[list[str], int]:
    """(differences, tensors compared) of one file present on both sides."""
    if rel.suffix == ".safetensors":
        ta, tb = load_file(a / rel), load_file(b / rel)
        diffs = []
        if META in ta and META in tb:  # a checkpoint's metadata: JSON bytes, compared as values
            _walk(*(json.loads(bytes(t[META].tolist()).decode()) for t in (ta, tb)), f"{rel}:{META}", diffs)
        diffs += [f"{rel}:{k}" for k in ta if k != META and (k not in tb or not _same_tensor(ta[k], tb[k]))]
        return diffs + [f"{rel}:{k}: only in the second" for k in tb if k not in ta], len(ta)
    diffs: list[str] = []
    if rel.suffix == ".json":
        _walk(json.loads((a / rel).read_text()), json.loads((b / rel).read_text()), str(rel), diffs)
    elif rel.suffix == ".jsonl":
        rows = [[json.loads(line) for line in (d / rel).read_text().splitlines() if line.strip()] for d in (a, b)]
        _walk(rows[0], rows[1], str(rel), diffs)
    elif (a / rel).read_text() != (b / rel).read_text():
        diffs.append(f"{rel}: text differs")
    return diffs, 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    args = ap.parse_args(argv)
    _ROOTS[:] = [str(args.first), str(args.second)]
    files = [{p.relative_to(d) for p in d.rglob("*") if p.is_file() and p.suffix in SUFFIXES}
             for d in (args.first, args.second)]
    one_side = sorted(files[0] ^ files[1])
    for rel in one_side:
        print(f"only on one side: {rel}")
    differing = tensors = 0
    for rel in sorted(files[0] & files[1]):
        diffs, n = _file_diffs(args.first, args.second, rel)
        tensors += n
        differing += bool(diffs)
        for d in diffs[:5]:
            print(f"differs: {d}")
    print(f"{len(files[0] & files[1])} files compared, {tensors} tensors; {differing} differ, "
          f"{len(one_side)} on one side only")
    return 1 if differing or one_side else 0


if __name__ == "__main__":
    sys.exit(main())
