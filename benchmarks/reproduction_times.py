"""Wall time of a finished (or partly finished) reproduction, per piece kind and per attack.

Reads the completion markers ``OUT/**/DONE.json`` that ``datarecon reproduce`` writes and, for
attack pieces, the run record ``run/run.json`` (steps, method, Hessian-vector products). Prints the
total and per-kind wall time and, for every attack, its wall time per step (for the bilevel attack:
per outer step, the number the performance issue asks for at each scale). The sum of piece wall
times is the reproduction's compute time; it excludes process start-up and report rendering.

With ``--estimates`` it also rebuilds the reproduction's plan from ``OUT/reproduction.json`` and
sets each piece's measured wall time beside its ``--dry-run`` estimate on ``cpu``
(``datarecon.experiments.reproduce.cost``): the ratio per piece kind checks the cost model (the
CPU figures are for one thread on an idle machine, so a loaded machine shows ratios above 1).

Usage::

    python benchmarks/reproduction_times.py out/small-runkel [--json benchmarks/results/reproduce_small.json]
    python benchmarks/reproduction_times.py out/medium-runkel --estimates

Exits non-zero on error (e.g. no DONE.json under OUT).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def collect(out: Path) -> dict[str, Any]:
    """Per-piece rows and per-kind totals of the reproduction in ``out``."""
    markers = sorted(out.rglob("DONE.json"))
    if not markers:
        raise FileNotFoundError(f"no DONE.json under {out}: run `datarecon reproduce ... --out {out}` first")
    rows = []
    for marker in markers:
        done = json.loads(marker.read_text(encoding="utf-8"))
        row: dict[str, Any] = {"key": done.get("key"), "kind": done.get("kind"),
                               "wall_s": float(done.get("wall_time_s") or 0.0)}
        run_json = marker.parent / "run" / "run.json"
        batch = (done.get("summary") or {}).get("runs")
        if done.get("kind") == "attack" and isinstance(batch, dict) and batch:
            # a batch piece (experiments/pipeline/common.attack_batch_piece): its runs step together, so
            # one step of the piece is a step of every run still going
            runs = [json.loads((marker.parent / name / "run" / "run.json").read_text(encoding="utf-8"))
                    for name in sorted(batch)]
            steps = max(int(r.get("steps_done") or 0) for r in runs)
            wall = max(float(r.get("wall_time_s") or 0.0) for r in runs)
            row |= {"method": runs[0].get("method"), "steps": steps, "m": runs[0].get("m"), "runs": len(runs),
                    "mode": (done.get("summary") or {}).get("mode"), "attack_wall_s": wall,
                    "ms_per_step": 1e3 * wall / steps if steps else None,
                    "ms_per_run_step": 1e3 * wall / sum(int(r.get("steps_done") or 0) for r in runs) if steps else None,
                    "num_parameters": (runs[0].get("extra") or {}).get("num_parameters"),
                    "hvps": (runs[0].get("extra") or {}).get("hvp_count")}
        elif done.get("kind") == "attack" and run_json.is_file():
            run = json.loads(run_json.read_text(encoding="utf-8"))
            steps = int(run.get("steps_done") or 0)
            extra = run.get("extra") or {}
            row |= {"method": run.get("method"), "steps": steps, "m": run.get("m"),
                    "attack_wall_s": float(run.get("wall_time_s") or 0.0),
                    "ms_per_step": 1e3 * float(run.get("wall_time_s") or 0.0) / steps if steps else None,
                    "num_parameters": extra.get("num_parameters"), "hvps": extra.get("hvp_count")}
        rows.append(row)
    by_kind: dict[str, float] = defaultdict(float)
    for r in rows:
        by_kind[str(r["kind"])] += r["wall_s"]
    return {"out": str(out), "pieces": len(rows), "total_wall_s": sum(r["wall_s"] for r in rows),
            "by_kind_wall_s": dict(by_kind), "rows": rows}


def with_estimates(res: dict[str, Any], out: Path, *, device: str = "cpu") -> dict[str, Any]:
    """Add each piece's cost-model estimate (``estimate_s``) and the measured ÷ estimated ratio per kind."""
    from datarecon.experiments.reproduce import REPRODUCTIONS
    from datarecon.utils.io import read_json

    manifest = read_json(out / "reproduction.json")
    entry = REPRODUCTIONS.get(manifest["name"])
    pieces = {p.key: p for p in entry.plan(entry.config_cls.model_validate(manifest["config"]))}
    ratios: dict[str, list[float]] = defaultdict(list)
    for r in res["rows"]:
        p = pieces.get(r["key"])
        est = p.estimate(device) if p is not None and p.estimate is not None else None
        r["estimate_s"] = est
        if est:
            ratios[str(r["kind"])].append(r["wall_s"] / est)
    res["estimate_device"] = device
    res["measured_over_estimate"] = {
        k: {"pieces": len(v), "median": sorted(v)[len(v) // 2], "min": min(v), "max": max(v),
            "total_measured_s": sum(r["wall_s"] for r in res["rows"] if r["kind"] == k and r.get("estimate_s")),
            "total_estimate_s": sum(r["estimate_s"] for r in res["rows"] if r["kind"] == k and r.get("estimate_s"))}
        for k, v in ratios.items()}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="a reproduction's --out folder")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers as JSON here")
    ap.add_argument("--estimates", action="store_true", help="compare with the --dry-run estimates on cpu")
    args = ap.parse_args(argv)
    try:
        res = collect(args.out)
        if args.estimates:
            res = with_estimates(res, args.out)
        print(f"{res['out']}: {res['pieces']} finished pieces, {res['total_wall_s']:.1f} s of piece wall time")
        for kind, wall in sorted(res["by_kind_wall_s"].items()):
            print(f"  {kind:<10} {wall:8.1f} s")
        print("attacks (wall per step):")
        for r in res["rows"]:
            if r.get("ms_per_step") is not None:
                print(f"  {r['key']:<48} {r['method']:<9} P={r['num_parameters'] or '-':<8} m={r['m']:<4} "
                      f"{r['steps']:>5} steps  {r['ms_per_step']:9.1f} ms/step")
        if args.estimates:
            print("measured ÷ estimated (cpu cost model), per piece kind:")
            for kind, v in sorted(res["measured_over_estimate"].items()):
                print(f"  {kind:<10} {v['pieces']:>3} pieces: median {v['median']:.2f} (min {v['min']:.2f}, max "
                      f"{v['max']:.2f}); total {v['total_measured_s']:.0f} s measured vs {v['total_estimate_s']:.0f} s "
                      "estimated")
            for r in res["rows"]:
                if r.get("estimate_s") and r["kind"] in ("train", "attack") and "landscape" not in r["key"]:
                    print(f"  {r['key']:<48} {r['wall_s']:8.1f} s measured  {r['estimate_s']:8.1f} s estimated")
        if args.json:
            from datarecon.utils.io import atomic_write_json

            atomic_write_json(args.json, res)
            print(f"wrote {args.json}")
    except Exception as exc:  # one line, non-zero exit
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
