"""Wall time of the README's first Python block (train, attack, evaluate) under each thread setting.

    python benchmarks/python_api_threads.py [--settings 1,0] [--out FILE.json]

Each setting runs in a fresh interpreter with ``DATARECON_THREADS`` set to it (1: datarecon's default, applied when
the package is imported; 0: PyTorch's own default, every core), one after the other, so the two are timed on the
same machine minutes apart.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

RUNNER = """
import pathlib, sys, tempfile, time
block = open(sys.argv[1], encoding="utf-8").read()
with tempfile.TemporaryDirectory() as d:
    t0 = time.perf_counter()
    exec(compile(block, "README", "exec"), {"workdir": pathlib.Path(d)})
    import torch
    print("THREADS", torch.get_num_threads(), "WALL", time.perf_counter() - t0)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--settings", default="1,0")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    block = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)[0]
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "readme_block0.py"
    path.write_text(block, encoding="utf-8")
    rows = []
    for setting in a.settings.split(","):
        env = {**os.environ, "DATARECON_THREADS": setting}
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", RUNNER, str(path)], capture_output=True, text=True, env=env)
        total = time.perf_counter() - t0
        if res.returncode != 0:
            raise SystemExit(res.stderr[-2000:])
        threads, wall = res.stdout.split("THREADS", 1)[1].split("WALL")
        rows.append({"DATARECON_THREADS": setting, "torch_threads": int(threads), "block_s": float(wall),
                     "process_s": total, "load_average": os.getloadavg()})
        print(f"DATARECON_THREADS={setting}: torch threads {int(threads)}, block {float(wall):.1f} s, process "
              f"{total:.1f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
