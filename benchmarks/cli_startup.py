"""Start-up time of the command line: wall time of ``datarecon ARGS`` for a few commands that do no work.

    python benchmarks/cli_startup.py [--src DIR] [--repeats 5] [--out FILE.json]

``--src`` runs the package found in DIR (e.g. an exported older commit's ``src``) instead of the
installed one, so two versions are timed by the same interpreter on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

COMMANDS = (["--version"], ["--help"], ["train", "--help"], ["reconstruct", "--help"], ["evaluate", "--help"],
            ["membership", "--help"], ["report", "--help"])


def wall(args: list[str], src: str | None) -> float:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from datarecon.cli.main import entry; entry()", *args], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--src", default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = {}
    for args in COMMANDS:
        times = [wall(args, a.src) for _ in range(a.repeats)]
        rows[" ".join(args)] = {"median_s": statistics.median(times), "min_s": min(times)}
        print(f"datarecon {' '.join(args):<22} median {statistics.median(times):.2f} s  min {min(times):.2f} s",
              flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump({"src": a.src or "installed", "repeats": a.repeats, "rows": rows,
                       "load_average": os.getloadavg()}, fh, indent=2)


if __name__ == "__main__":
    main()
