"""The one checkpoint format against the two it replaced, at the papers' state sizes: save and load times.

States (random tensors of the real shapes; a checkpoint's cost does not depend on the values):

* ``attack-paper``: a KKT/DecoReco run of haim2022's paper rung on CIFAR: m = 1000 candidates
  (2n, n = 500) of 3x32x32 in float32, their momentum buffer, multipliers and their buffer, a
  generator state; metadata with the last metrics.
* ``train-paper``: the D-1000-1000-1 target (3072·1000 + 1000·1000 + 1000 weights) in float64 and
  its momentum buffer; metadata with 50 history rows.
* ``--quick``: both at a hundredth of the size.

Three writers, timed *interleaved* (the order rotates each repeat, so load hits all alike):

* ``format2``: :func:`datarecon.kernel.checkpoint.save` (one file; the SHA-256 of the tensors in its header);
* ``legacy-attack``: one safetensors file with the metadata as header text (attacks before format 2);
* ``legacy-train``: a tensor file, its SHA-256, then ``state.json`` naming it (training before format 2).

and the matching loads (``format2`` verifies the SHA-256; ``legacy-train`` hashes the file). The
ratios ``format2 / legacy-*`` of the medians are the result. Files go to a temporary folder on the
same disk as the results.

Usage::

    python benchmarks/bench_checkpoint.py --threads 1            # → results/checkpoint.json
    python benchmarks/bench_checkpoint.py --quick --threads 1    # a hundredth of the sizes

Exits non-zero on any error.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import base_parser, results_path, write_results


def attack_state(scale: float) -> tuple[dict[str, torch.Tensor], dict]:
    m = max(2, int(1000 * scale))
    g = torch.Generator().manual_seed(0)
    tensors = {"x": torch.randn(m, 3, 32, 32, generator=g), "x_momentum": torch.randn(m, 3, 32, 32, generator=g),
               "lambda": torch.rand(m, generator=g), "lambda_momentum": torch.rand(m, generator=g),
               "__generator_state__": g.get_state()}
    meta = {"steps_done": 5000, "config_hash": "0" * 16, "resume_key": "1" * 16, "status": "running",
            "metrics": {"loss": 1.0, "rel_residual": 0.5, "residual": 2.0}, "wall_time_s": 1.0}
    return tensors, meta


def train_state(scale: float) -> tuple[dict[str, torch.Tensor], dict]:
    d, h = max(4, int(3072 * scale)), max(4, int(1000 * scale))
    g = torch.Generator().manual_seed(0)
    shapes = {"0.weight": (h, d), "2.weight": (h, h), "4.weight": (1, h)}
    tensors = {f"{kind}.{k}": torch.randn(s, generator=g, dtype=torch.float64)
               for k, s in shapes.items() for kind in ("model", "opt")}
    rows = [{"step": i, "loss": 0.1, "energy": 0.1, "train_acc": 1.0, "min_margin": 0.5, "weight_norm": 3.0,
             "normalised_margin": 0.01, "grad_norm": 0.01, "lr": 0.01} for i in range(50)]
    return tensors, {"tag": "t", "epoch": 1000, "history": rows, "status": "running", "wall_time_s": 1.0}


def save_format2(folder: Path, tensors, meta) -> None:
    from datarecon.kernel import checkpoint

    checkpoint.save(folder, tensors, meta, kind=checkpoint.Kind.ATTACK)


def load_format2(folder: Path) -> None:
    from datarecon.kernel import checkpoint

    checkpoint.load(folder, kind=checkpoint.Kind.ATTACK)


def save_legacy_attack(folder: Path, tensors, meta) -> None:
    from datarecon.utils.io import atomic_write_json, save_tensors, to_jsonable

    save_tensors(folder / "state.safetensors", tensors,
                 metadata={"progress": json.dumps(to_jsonable(meta), sort_keys=True)})
    atomic_write_json(folder / "progress.json", meta)


def load_legacy_attack(folder: Path) -> None:
    from safetensors import safe_open

    from datarecon.utils.io import load_tensors

    load_tensors(folder / "state.safetensors")
    with safe_open(str(folder / "state.safetensors"), framework="pt") as fh:
        json.loads(fh.metadata()["progress"])


def save_legacy_train(folder: Path, tensors, meta) -> None:
    from datarecon.utils.io import atomic_write_json, save_tensors, sha256_file

    name = f"state-{meta.get('epoch', 0):09d}.safetensors"
    save_tensors(folder / name, tensors)
    atomic_write_json(folder / "state.json", {"format": "datarecon-train-checkpoint/1", "tensors": name,
                                              "sha256": sha256_file(folder / name), **meta})


def load_legacy_train(folder: Path) -> None:
    from datarecon.utils.io import load_tensors, read_json, sha256_file

    info = read_json(folder / "state.json")
    path = folder / info["tensors"]
    assert sha256_file(path) == info["sha256"]
    load_tensors(path)


WRITERS = {"format2": (save_format2, load_format2), "legacy-attack": (save_legacy_attack, load_legacy_attack),
           "legacy-train": (save_legacy_train, load_legacy_train)}


def bench(state, *, repeats: int, root: Path) -> dict:
    tensors, meta = state
    times: dict[str, dict[str, list[float]]] = {k: {"save": [], "load": []} for k in WRITERS}
    names = list(WRITERS)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            save, load = WRITERS[name]
            folder = root / f"{name}-{r}"
            folder.mkdir(parents=True)
            t0 = time.perf_counter()
            save(folder, tensors, meta)
            t1 = time.perf_counter()
            load(folder)
            t2 = time.perf_counter()
            times[name]["save"].append(t1 - t0)
            times[name]["load"].append(t2 - t1)
            for p in folder.iterdir():
                p.unlink()
            folder.rmdir()
    med = {k: {op: statistics.median(v) for op, v in ops.items()} for k, ops in times.items()}
    size_mb = sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20
    return {"state_mb": round(size_mb, 2), "median_s": med,
            "ratios": {f"format2/{k}": {op: med["format2"][op] / med[k][op] for op in ("save", "load")}
                       for k in ("legacy-attack", "legacy-train")}}


def main(argv: list[str] | None = None) -> int:
    ap = base_parser(__doc__, quick_help="a hundredth of the sizes", repeats_help="timed repeats (default 7; 3 quick)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (3 if args.quick else 7)
    scale = 0.01 if args.quick else 1.0
    out = results_path("checkpoint", quick=args.quick, out=args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        for name, make in (("attack-paper", attack_state), ("train-paper", train_state)):
            res = bench(make(scale), repeats=repeats, root=Path(tmp) / name)
            results[name] = res
            r = res["ratios"]
            print(f"{name}: {res['state_mb']} MB; format2 save {res['median_s']['format2']['save']:.3f} s, "
                  f"load {res['median_s']['format2']['load']:.3f} s; format2/legacy-attack save "
                  f"{r['format2/legacy-attack']['save']:.2f} load {r['format2/legacy-attack']['load']:.2f}; "
                  f"format2/legacy-train save {r['format2/legacy-train']['save']:.2f} "
                  f"load {r['format2/legacy-train']['load']:.2f}")
    write_results(out, benchmark="checkpoint", quick=args.quick, repeats=repeats, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
