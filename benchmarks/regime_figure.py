"""The regime study's figure: each target's identifiability gap against the count the attack reached on it.

Reads the rows of ``benchmarks/identifiability_regimes.py`` and draws, for the weights-only KKT objective and for
θ_init known, the gap (best fake − truth, relative residual with optimal multipliers) on x and the training images
recovered (of n) on y, each point beside its held-out null (open marker) and labelled by its row.

    python benchmarks/regime_figure.py --rows benchmarks/results/identifiability_regimes.json \\
        --out benchmarks/results/identifiability_regimes_gap_count.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from _common import RESULTS_DIR  # noqa: E402

#: (attacker, identifiability objective, row key of the count)
PANELS = (("weights only", "kkt", "weights_only"), ("θ_init known", "kkt-init", "known_init"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, default=RESULTS_DIR / "identifiability_regimes.json")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "identifiability_regimes_gap_count.png")
    args = ap.parse_args(argv)
    rows = json.loads(args.rows.read_text())
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for ax, (title, objective, key) in zip(axes, PANELS):
        for row in rows:
            gap = row["identifiability"].get(objective, {}).get("gap")
            count, null = row[key].get("count"), row[key].get("heldout")
            if gap is None or count is None:
                continue
            ax.plot([gap], [count], "o", color="tab:blue")
            ax.plot([gap], [null], "o", mfc="none", color="tab:orange")
            ax.annotate(row["row"], (gap, count), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_title(f"{title}: KKT objective ({objective})")
        ax.set_xlabel("identifiability gap (best fake − training set)")
        ax.axvline(0.0, color="grey", lw=0.8, ls="--")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("training images recovered (of 100)")
    axes[0].plot([], [], "o", color="tab:blue", label="count")
    axes[0].plot([], [], "o", mfc="none", color="tab:orange", label="held-out null")
    axes[0].legend(loc="upper left")
    fig.suptitle("Medium CIFAR target (n = 100, D-1000-1000-1): identifiability gap against the count, per regime")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
