"""Compare the checkpoints of two recordings of the same commands (tools/record_runs.sh): every tensor bit for bit,
and the metadata equal once both sides are read through datarecon.kernel.resume.Progress.from_meta, timing fields
aside. tools/compare_artefacts.py compares the metadata key by key, so between a recording made before the one
checkpoint schema (training's tag/epoch/finished, the attacks' config_hash/steps_done vocabulary) and one made
after it, it lists every checkpoint; this tells whether anything but the vocabulary changed.

    python tools/compare_checkpoints.py BEFORE AFTER

A training checkpoint of the old vocabulary recorded no total and no last metrics: those are not compared. Exits 1
when a checkpoint differs or exists on one side only.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from datarecon.kernel import checkpoint
from datarecon.kernel.resume import Progress
from datarecon.utils.io import strip_timing


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    flat = (lambda t: t.reshape(-1).contiguous().view(torch.uint8))  # noqa: E731
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(flat(a), flat(b)))


def compare(path_a: Path, path_b: Path) -> list[str]:
    """The differences of one checkpoint file on both sides (none: the same state and progress)."""
    ta, tb = load_file(path_a), load_file(path_b)
    metas = [json.loads(bytes(t.pop(checkpoint.META_KEY).tolist())) for t in (ta, tb)]
    diffs = [f"tensor {k}" for k in sorted(set(ta) | set(tb)) if k not in ta or k not in tb or not _same_bits(ta[k], tb[k])]
    kind = checkpoint.kind_of(path_a.parent) or checkpoint.Kind.ATTACK
    pa, pb = (Progress.from_meta(m, kind=kind) for m in metas)
    fa, fb = strip_timing(pa.to_meta()), strip_timing(pb.to_meta())
    for f in (fa, fb):
        if pa.total is None or pb.total is None:  # the old training vocabulary recorded neither
            f.pop("total", None)
            f.pop("metrics", None)
        f.pop("schema", None)
    return diffs + [f"metadata {k}" for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def main(argv: list[str]) -> int:
    a, b = Path(argv[0]), Path(argv[1])
    names = {p.relative_to(a) for p in a.rglob(checkpoint.STATE_FILE)} | {p.relative_to(b) for p in b.rglob(checkpoint.STATE_FILE)}
    bad = 0
    for rel in sorted(names):
        if not ((a / rel).is_file() and (b / rel).is_file()):
            print(f"{rel}: on one side only")
            bad += 1
            continue
        diffs = compare(a / rel, b / rel)
        if diffs:
            print(f"{rel}: {', '.join(diffs)}")
            bad += 1
    print(f"{len(names)} checkpoints compared; {bad} differ beyond the vocabulary")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
