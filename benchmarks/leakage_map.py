"""The leakage map: where does a fine-tuned network's training data leak? (docs/RESULTS.md)

A cell is one target x one attack setting, named ``ARCH-sSTEPS-nN-BUDGET[-SETTING]`` (e.g. ``resnet8-s1-n4-b1500``,
``resnet8-s1-n1-b1500-simudy``):

* ARCH: ``cnn`` (CNN 32-64, the control that leaks), ``resnet8`` (ResNet-8 16-32-64 with batch norm) or
  ``resnet8w`` (ResNet-8 64-128-256 with batch norm), each pretrained once on public CIFAR-10 images (every
  class's images after the first 20; the recipes of benchmarks/finetune_rows.sh) into WORK/pre-ARCH;
* STEPS: the fine-tuning from that start, SGD at lr 0.01 on the whole private batch, 1 step (gradient
  inversion) or 20 (SimuDy's recipe), batch norm in eval mode (SimuDy's setting);
* N: 1, 2, 4, 8 or 20 private images drawn across the classes (``train --n-train N``) from the first 2 of
  every class (seed 0; the draw of n is nested in the draw of 2n; n = 20 is the pool, the rows' images);
  the read-out is the pretrained 10-class one; held-out images: the first 4 test images of every class;
* BUDGET: dynamics matching with the public start and the recipe known and the labels restored from the
  read-out's change (attacker-side; the balanced assumption cannot hold for n < 10), m = n candidates:
  ``b1500`` one restart of 1 500 outer steps (the rows' budget), ``b10k`` 4 restarts of 10 000, the restart
  with the highest final cosine kept (the attack's own objective, an attacker-side choice), ``b30k`` one restart
  of 30 000 (SimuDy's budget: 20 x 1 500 steps; run with the ``simudy`` setting);
* SETTING (an optional suffix, the attack-setting axis): none, the ``gradient-inversion`` preset of the rows
  (cosine objective, signed Adam at 0.1, step decay, TV 0.8, uniform start); ``-simudy``, the ``simudy`` preset
  (SimuDy's schedule: Adam 0.01 with betas 0.8/0.9 cosine-annealed with T_max 100, TV 1e-3, Gaussian start 0.5;
  its balanced labels replaced by the restored ones, as in every cell); ``-pca`` and ``-simudy-pca``, the same with
  the public-data prior (``--pca-weight 10``: the residual outside the first 1 024 principal components of the
  public pretraining images, weight fixed before any cell ran so that at a uniform start it weighs about as much
  as the gradient-inversion preset's TV term, not tuned).

Each cell fine-tunes its target if WORK/targets/ARCH-sSTEPS-nN is missing (pretraining first if needed), runs
the attack into WORK/cells/CELL/attack (continued with --resume if it was cut short), evaluates the kept restart
(``datarecon evaluate``: the count above the null-calibrated threshold, with the held-out and noise nulls at that
threshold) and writes SimuDy's mean best SSIM with its 95 % bootstrap interval beside the held-out and noise nulls
(``bench_dynamics.py table``) to WORK/cells/CELL/cell.json, with every command, its wall time and the machine. A
finished cell (its cell.json) is never run again; a rerun of the map fills only the others.

    python benchmarks/leakage_map.py plan [--cells GLOB ...]                 # the cells in the order they run
    python benchmarks/leakage_map.py cell CELL WORK [--threads 1]              # fill one cell
    python benchmarks/leakage_map.py run WORK [--cells GLOB ...] [--max-hours H] [--threads 1]
        [--backend local|ray] [--workers N] [--ray-address auto]              # the whole map (or the cells named)
    python benchmarks/leakage_map.py table WORK [--out benchmarks/results/leakage_map.json]
    python benchmarks/leakage_map.py figure [--results JSON] [--out PNG]

``run`` fans the cells out on datarecon's sweep backends (datarecon.experiments.backends: the local process pool,
in the driver with one worker; Ray on a cluster, the work folder shared), pretrainings first, then the targets,
then the attacks, cheapest and most informative first: the 1 500-step cells at every n of the CNN and ResNet-8,
then the wider ResNet-8, then the 10 000-step cells at n <= 4, then the rest. ``--max-hours H`` leaves out a cell
whose attack is extrapolated (from measured cells, ``table``) to take longer than H hours (e.g. for a GPU).
``table`` collects the finished cells, extrapolates the wall time of the others from the measured ones (labelled
as extrapolations) and states the boundary per architecture: the largest n at which at least half the images are
recovered, or, where no cell leaks, the best mean best SSIM reached. DATARECON (default ``datarecon``) is the
command; DATARECON_DATA points at the data.
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR

ARCHS: dict[str, dict[str, Any]] = {
    "cnn": {"label": "CNN 32-64", "arch": ["--arch", "cnn", "--channels", "32,64"],
            "pretrain": ["--lr", "0.02", "--momentum", "0.9", "--batch-size", "100", "--epochs", "30"]},
    "resnet8": {"label": "ResNet-8 16-32-64, batch norm", "arch": ["--arch", "resnet8", "--batch-norm"],
                "pretrain": ["--lr", "0.05", "--momentum", "0.9", "--weight-decay", "5e-4", "--batch-size", "100",
                             "--epochs", "15"]},
    "resnet8w": {"label": "ResNet-8 64-128-256, batch norm",
                 "arch": ["--arch", "resnet8", "--channels", "64,128,256", "--batch-norm"],
                 "pretrain": ["--lr", "0.05", "--momentum", "0.9", "--weight-decay", "5e-4", "--batch-size", "100",
                              "--epochs", "15"]},
}
STEPS = (1, 20)
NS = (1, 2, 4, 8, 20)
#: per scale: the data flags (all, public pretraining, private), the architectures' widths and epochs where they
#: differ from ARCHS, and each budget's (restarts, outer steps per restart). ``cifar`` is the map; ``smoke`` runs
#: every piece on 8x8 digits with tiny networks and budgets in seconds (tests/experiments/test_leakage_map.py)
SCALES: dict[str, dict[str, Any]] = {
    "cifar": {"common": ["--dataset", "cifar10", "--task", "all", "--normalisation", "unit", "--loss",
                         "cross-entropy", "--no-bias"],
              "public": ["--n-per-class", "757", "--skip-per-class", "20", "--n-partition-per-class", "0",
                         "--n-heldout-per-class", "67"],
              "private": ["--n-per-class", "2", "--n-heldout-per-class", "4"],
              "archs": {}, "budgets": {"b1500": (1, 1500), "b10k": (4, 10_000),
                                                         "b30k": (1, 30_000)}},
    "smoke": {"common": ["--dataset", "digits", "--task", "all", "--normalisation", "unit", "--loss",
                         "cross-entropy", "--no-bias"],
              "public": ["--n-per-class", "30", "--skip-per-class", "10", "--n-partition-per-class", "0",
                         "--n-heldout-per-class", "5"],
              "private": ["--n-per-class", "2", "--n-heldout-per-class", "4"],
              "archs": {"cnn": ["--arch", "cnn", "--channels", "4,8"],
                        "resnet8": ["--arch", "resnet8", "--channels", "4,8,8", "--batch-norm"],
                        "resnet8w": ["--arch", "resnet8", "--channels", "8,16,16", "--batch-norm"]},
              "epochs": "1", "budgets": {"b1500": (1, 4), "b10k": (2, 6), "b30k": (1, 8)}},
}
ATTACK = ["--known-init", "pretrained", "--known-recipe", "model", "--known-labels", "restored"]
#: the public-data prior's weight in the -pca settings (fixed before any cell ran; module docstring)
PCA_WEIGHT = "10"
#: the attack-setting axis: the cell name's suffix ("" for the rows' gradient-inversion settings) -> flags
SETTINGS: dict[str, list[str]] = {
    "": ["--preset", "gradient-inversion"],
    "simudy": ["--preset", "simudy"],
    "pca": ["--preset", "gradient-inversion", "--pca-weight", PCA_WEIGHT],
    "simudy-pca": ["--preset", "simudy", "--pca-weight", PCA_WEIGHT],
}
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Cell:
    """One target (architecture, fine-tuning steps, n) and one attack budget."""

    arch: str
    steps: int
    n: int
    budget: str
    setting: str = ""

    @property
    def target(self) -> str:
        return f"{self.arch}-s{self.steps}-n{self.n}"

    @property
    def name(self) -> str:
        return f"{self.target}-{self.budget}" + (f"-{self.setting}" if self.setting else "")


def all_cells() -> list[Cell]:
    """Every cell in the order the map runs them (see the module docstring)."""
    order = [(a, s) for s in STEPS for a in ("cnn", "resnet8")]
    tiers = [[Cell(a, s, n, "b1500") for a, s in order for n in NS],
             [Cell("resnet8w", s, n, "b1500") for s in STEPS for n in NS],
             [Cell(a, s, n, "b10k") for a, s in order + [("resnet8w", 1), ("resnet8w", 20)] for n in NS if n <= 4],
             [Cell(a, s, n, "b10k") for a, s in order + [("resnet8w", 1), ("resnet8w", 20)] for n in NS if n > 4],
             [Cell(a, s, n, "b1500", setting) for setting in SETTINGS if setting for a, s in order for n in NS],
             [Cell(a, s, n, "b30k", "simudy") for a, s in order for n in NS if n <= 4]
             + [Cell("resnet8", 20, 20, "b30k", "simudy")]]
    return [c for tier in tiers for c in tier]


def select(patterns: list[str] | None) -> list[Cell]:
    """The cells whose names match any of ``patterns`` (shell globs; none: all), in map order."""
    cells = all_cells()
    if not patterns:
        return cells
    chosen = [c for c in cells if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
    if not chosen:
        refuse(f"no cell matches {' '.join(patterns)}; names look like resnet8-s1-n4-b1500 "
               "(`python benchmarks/leakage_map.py plan` lists them)")
    return chosen


def refuse(message: str) -> None:
    """Bad input: one ``error:`` line, exit 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _dr() -> list[str]:
    """The datarecon command the cells run: ``$DATARECON`` if set, else this interpreter's (not a ``datarecon`` on
    PATH, which a shell without the venv activated, such as ``make test``'s, does not have)."""
    given = os.environ.get("DATARECON")
    return shlex.split(given) if given else [sys.executable, "-m", "datarecon.cli.main"]


def work_scale(work: Path, scale: str | None) -> str:
    """The scale WORK holds (WORK/map.json; written on first use): ``scale`` if it agrees (None: read it)."""
    record = work / "map.json"
    held = json.loads(record.read_text())["scale"] if record.is_file() else None
    if scale is not None and held is not None and held != scale:
        refuse(f"{work} holds the {held} map, not {scale}; pass --scale {held} or another WORK")
    if held is None and scale is not None:
        work.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"scale": scale}) + "\n")
    return held or scale or "cifar"


def budget(name: str, opts: dict[str, Any]) -> tuple[int, int]:
    """(restarts, outer steps per restart) of budget ``name`` at the scale of ``opts``."""
    return SCALES[opts.get("scale") or "cifar"]["budgets"][name]


def _arch_flags(arch: str, opts: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The architecture's flags and its pretraining recipe at the scale of ``opts``."""
    scale = SCALES[opts.get("scale") or "cifar"]
    flags, recipe = scale["archs"].get(arch, ARCHS[arch]["arch"]), list(ARCHS[arch]["pretrain"])
    if "epochs" in scale:
        recipe[recipe.index("--epochs") + 1] = scale["epochs"]
    return flags, recipe


def pretrain_cmd(arch: str, work: Path, opts: dict[str, Any]) -> list[str]:
    scale = SCALES[opts.get("scale") or "cifar"]
    flags, recipe = _arch_flags(arch, opts)
    return [*_dr(), "train", *scale["common"], *scale["public"], *flags, *recipe, *_run_flags(opts),
            "--checkpoint-every", "1", "--log-every", "1", "--no-progress", "--resume", "--out", str(work / f"pre-{arch}")]


def finetune_cmd(cell: Cell, work: Path, opts: dict[str, Any]) -> list[str]:
    scale = SCALES[opts.get("scale") or "cifar"]
    return [*_dr(), "train", *scale["common"], *scale["private"], "--n-train", str(cell.n),
            *_arch_flags(cell.arch, opts)[0], "--pretrained", str(work / f"pre-{cell.arch}"), "--lr", "0.01",
            "--batch-size", str(cell.n), "--epochs", str(cell.steps), *_run_flags(opts), "--log-every", "1",
            "--no-progress", "--overwrite", "--out", str(work / "targets" / cell.target)]


def attack_cmd(cell: Cell, work: Path, opts: dict[str, Any], *, resume: bool) -> list[str]:
    restarts, steps = budget(cell.budget, opts)
    return [*_dr(), "reconstruct", "--model", str(work / "targets" / cell.target), *SETTINGS[cell.setting], *ATTACK,
            "--candidates",
            str(cell.n), "--steps", str(steps), "--runs", str(restarts), *_run_flags(opts), "--no-progress",
            "--resume" if resume else "--overwrite", "--out", str(work / "cells" / cell.name / "attack")]


def _run_flags(opts: dict[str, Any]) -> list[str]:
    return ["--threads", str(opts.get("threads") or 1), *(["--device", opts["device"]] if opts.get("device") else [])]


def run_logged(cmd: list[str], log: Path, *, accept: tuple[int, ...] = (0,)) -> float:
    """Run ``cmd``, its output appended to ``log``; its wall time in seconds.

    Raises:
        RuntimeError: an exit code not in ``accept`` (the log's path named).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("a") as f:
        f.write(f"== {date.today().isoformat()} {shlex.join(cmd)}\n")
        f.flush()
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        wall = time.perf_counter() - start
        f.write(f"== exit {code} after {wall:.0f} s\n")
    if code not in accept:
        raise RuntimeError(f"{shlex.join(cmd[:3])} ... exited {code}; see {log}")
    return wall


def _locked(work: Path, name: str) -> Any:
    """An exclusive lock on WORK/locks/NAME.lock (a prerequisite two cells may need at once)."""
    path = work / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def ensure_pretrained(arch: str, work: Path, opts: dict[str, Any]) -> float | None:
    """Pretrain ARCH into WORK/pre-ARCH unless done; the wall time of this call's training (None: none ran)."""
    with _locked(work, f"pre-{arch}"):
        if (work / f"pre-{arch}" / "model.json").is_file():
            return None
        return run_logged(pretrain_cmd(arch, work, opts), work / f"pre-{arch}.log")


def ensure_target(cell: Cell, work: Path, opts: dict[str, Any]) -> float | None:
    """Fine-tune the cell's target unless done (its pretraining first); the fine-tuning's wall time or None."""
    ensure_pretrained(cell.arch, work, opts)
    with _locked(work, cell.target):
        if (work / "targets" / cell.target / "model.json").is_file():
            return None
        return run_logged(finetune_cmd(cell, work, opts), work / "targets" / f"{cell.target}.log")


def restarts_of(attack: Path) -> dict[str, dict[str, Any]]:
    """Each restart (``run<j>``, or the folder for one) that wrote candidates: its status, steps and final cosine
    (None where the run diverged before a finite one)."""
    out = {}
    for r in sorted(attack.glob("run[0-9]*")) or [attack]:
        if (r / "candidates.safetensors").is_file():
            meta = json.loads((r / "run.json").read_text())
            out[r.name] = {"status": meta.get("status"), "steps_done": meta.get("steps_done"),
                           "final_cosine": ((meta.get("selection") or {}).get("cosine") or {}).get("value")}
    return out


def kept_restart(attack: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The restart with the highest final cosine (a diverged one only when every restart diverged) and all of them.

    Raises:
        RuntimeError: no restart wrote candidates.
    """
    runs = restarts_of(attack)
    if not runs:
        raise RuntimeError(f"no restart wrote candidates in {attack}")
    best = max(runs, key=lambda k: -float("inf") if runs[k]["final_cosine"] is None else runs[k]["final_cosine"])
    return (attack if best == attack.name and not (attack / "run0").is_dir() else attack / best), runs


#: seeded draws of m held-out images for the null's spread (one draw says little at n = 1 or 2)
NULL_DRAWS = 200


def greedy_pairs(sim: Any) -> Any:
    """SimuDy's pairing on an (m, n) SSIM matrix (candidates x training images): the pairs taken by decreasing
    SSIM, each used once; (n,) each training image's paired SSIM (0 when m < n leaves it unpaired)."""
    import torch

    sim = sim.clone()
    best = torch.zeros(sim.shape[1], dtype=torch.float64)
    for _ in range(min(sim.shape)):
        i, j = divmod(int(torch.argmax(sim)), sim.shape[1])
        best[j] = sim[i, j]
        sim[i, :], sim[:, j] = -float("inf"), -float("inf")
    return best


def null_over_draws(run: Path, *, threshold: float | None, draws: int = NULL_DRAWS) -> dict[str, Any]:
    """The held-out null of SimuDy's metric over ``draws`` seeded draws of m held-out images (m = the run's
    candidates) instead of one: its mean, the 2.5 and 97.5 percentiles, and the mean number of training images
    whose paired held-out image passes ``threshold`` (the cell's calibrated threshold, greedy pairing)."""
    import torch

    from bench_dynamics import _images
    from datarecon.evaluation.similarity import ssim_matrix

    cands, train, heldout, _ = _images(run)
    m = cands.shape[0]
    sim = ssim_matrix(heldout.double(), train.double())  # (H, n)
    g = torch.Generator().manual_seed(1)
    pairs = [greedy_pairs(sim[torch.randperm(heldout.shape[0], generator=g)[:m]]) for _ in range(draws)]
    means = torch.tensor([float(p.mean()) for p in pairs], dtype=torch.float64)
    lo, hi = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    above = None if threshold is None else float(sum(int((p > threshold).sum()) for p in pairs)) / draws
    return {"draws": draws, "m": m, "mean": float(means.mean()), "interval95": [lo, hi],
            "mean_count_above_threshold": above}


def fill_cell(cell: Cell, work: Path, opts: dict[str, Any]) -> dict[str, Any]:
    """Fill one cell (its prerequisites first) and write WORK/cells/CELL/cell.json; its record."""
    out = work / "cells" / cell.name
    if (out / "cell.json").is_file():
        return json.loads((out / "cell.json").read_text())
    load_before = os.getloadavg()
    finetune_s = ensure_target(cell, work, opts)
    attack, log = out / "attack", out / "log.txt"
    complete = (attack / "candidates.safetensors").is_file()
    resume = attack.is_dir() and not complete  # cut short: continued from its checkpoints
    # exit 2 with candidates: a restart diverged and kept its last finite state, which is the cell's result
    attack_s = None if complete else run_logged(attack_cmd(cell, work, opts, resume=resume), log, accept=(0, 2))
    kept, restarts = kept_restart(attack)
    diverged = restarts[kept.name]["status"] == "diverged"
    evaluate = [*_dr(), "evaluate", str(kept), *(["--allow-incomplete"] if diverged else [])]
    run_logged(evaluate, log)
    sys.path.insert(0, str(HERE))
    from bench_dynamics import table

    row = table([kept])[0]
    run_meta = json.loads((kept / "run.json").read_text())
    metrics = json.loads((kept / "metrics.json").read_text())
    target = json.loads((work / "targets" / cell.target / "model.json").read_text())
    record = {
        "cell": cell.name, "arch": cell.arch, "arch_label": ARCHS[cell.arch]["label"], "finetune_steps": cell.steps,
        "n": cell.n, "budget": cell.budget, "setting": cell.setting or "gradient-inversion",
        "restarts": budget(cell.budget, opts)[0],
        "outer_steps": budget(cell.budget, opts)[1], "scale": opts.get("scale") or "cifar",
        "command": f"python benchmarks/leakage_map.py cell {cell.name} WORK --threads {opts.get('threads') or 1}"
                   + (f" --scale {opts['scale']}" if opts.get("scale") not in (None, "cifar") else ""),
        "commands": {"pretrain": shlex.join(pretrain_cmd(cell.arch, work, opts)),
                     "finetune": shlex.join(finetune_cmd(cell, work, opts)),
                     "attack": shlex.join(attack_cmd(cell, work, opts, resume=False)), "evaluate": shlex.join(evaluate),
                     "table": f"python benchmarks/bench_dynamics.py table {kept}"},
        "target": {"train_indices": target["data"].get("train_indices"),
                   "train_accuracy": target["metrics"].get("train_accuracy"),
                   "heldout_accuracy": target["metrics"].get("heldout_accuracy"), "finetune_wall_s": finetune_s},
        "attack": {"wall_s": attack_s, "resumed": resume, "kept": kept.name, "restarts": restarts,
                   "diverged": diverged,
                   "run_wall_time_s": run_meta.get("wall_time_s"), "labels": metrics.get("labels")},
        "headline": metrics.get("headline"), "simudy": {k: v for k, v in row.items() if k not in ("run", "selection")},
        "heldout_null_draws": null_over_draws(kept, threshold=(metrics.get("headline") or {}).get("threshold")),
        "date": date.today().isoformat(), "machine": {"cpus": os.cpu_count(), "node": platform.machine(),
                                                       "load_before": load_before, "load_after": os.getloadavg(),
                                                       "threads": opts.get("threads") or 1,
                                                       "device": opts.get("device") or "cpu"},
    }
    tmp = out / "cell.json.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(out / "cell.json")
    return record


def cell_worker(payload: dict[str, Any]) -> dict[str, Any]:
    """Backend task: one phase of one cell (``pretrain`` ARCH, ``target`` or ``attack`` CELL)."""
    work, opts = Path(payload["work"]), payload["opts"]
    cell = Cell(**payload["cell"])
    t0 = time.perf_counter()
    if payload["phase"] == "pretrain":
        ensure_pretrained(cell.arch, work, opts)
    elif payload["phase"] == "target":
        ensure_target(cell, work, opts)
    else:
        fill_cell(cell, work, opts)
    return {"wall_s": time.perf_counter() - t0}


def _too_long(cell: Cell, work: Path, opts: dict[str, Any], max_hours: float | None) -> bool:
    """Whether ``cell``'s attack is extrapolated (from the cells finished so far) to take over ``max_hours``."""
    if max_hours is None:
        return False
    est = estimates(work, opts).get(cell.name, {})
    if est.get("attack_s", 0) <= max_hours * 3600:
        return False
    print(f"{cell.name}: left out, extrapolated {est['attack_s'] / 3600:.1f} h > --max-hours {max_hours:g}", flush=True)
    return True


def run_map(work: Path, cells: list[Cell], *, opts: dict[str, Any], execution: Any, max_hours: float | None) -> int:
    """Fill ``cells`` on a sweep backend in three phases (pretrainings, targets, attacks); 1 if any failed.

    With ``max_hours``, a cell whose attack is extrapolated (:func:`estimates`, from the cells finished when it is
    due) to take longer is left out, and so are its target and pretraining when no other cell needs them."""
    from datarecon.experiments.backends import Task, make_backend

    todo = [c for c in cells if not (work / "cells" / c.name / "cell.json").is_file()]
    todo = [c for c in todo if not _too_long(c, work, opts, max_hours)]
    phases = [("pretrain", list({c.arch: c for c in todo}.values()), lambda c: c.arch),
              ("target", list({c.target: c for c in todo}.values()), lambda c: c.target),
              ("attack", todo, lambda c: c.name)]
    failed: set[str] = set()
    for phase, items, key in phases:
        tasks = [Task(key=key(c), payload={"work": str(work), "opts": opts, "phase": phase, "cell": asdict(c)})
                 for c in items if not {c.arch, c.target} & failed]  # not after its pretraining or target failed
        with make_backend(execution.backend, cell_worker, workers=execution.workers,
                          **execution.backend_options()) as be:
            while tasks or be.in_flight:
                while tasks and be.in_flight < be.capacity:
                    task = tasks.pop(0)
                    if phase == "attack" and _too_long(Cell(**task.payload["cell"]), work, opts, max_hours):
                        todo.remove(Cell(**task.payload["cell"]))  # the cells finished meanwhile say so
                        continue
                    be.submit(task)
                for o in be.wait():
                    ok = "done" if o.ok else f"FAILED {o.error}"
                    print(f"{phase} {o.task.key}: {ok} ({(o.result or {}).get('wall_s', 0):.0f} s)", flush=True)
                    if not o.ok:
                        failed.add(o.task.key)
    filled = sum((work / "cells" / c.name / "cell.json").is_file() for c in todo)
    print(f"{filled} of {len(todo)} cells filled" + (f"; failed: {', '.join(sorted(failed))} (rerun to retry)"
                                                     if failed else ""))
    return 1 if filled < len(todo) else 0


def _per_step(record: dict[str, Any]) -> float | None:
    """Seconds per outer step and restart of a finished cell's attack: its command's wall time when it ran in one
    piece, else (one restart) the run's own wall time, over the outer steps its restarts took (a diverged restart
    stopped early); None when neither is known or no step was taken."""
    attack = record.get("attack") or {}
    wall = attack.get("wall_s") if not attack.get("resumed") else None
    if wall is None and record["restarts"] == 1:
        wall = attack.get("run_wall_time_s")
    restarts = attack.get("restarts")  # older records: every restart ran its steps
    steps = (sum(int(r.get("steps_done") or 0) for r in restarts.values()) if restarts
             else record["outer_steps"] * record["restarts"])
    return None if not wall or not steps else wall / steps


def estimates(work: Path, opts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The attack wall time of each unfinished cell, extrapolated from the finished cells of its architecture and
    fine-tuning steps: seconds per outer step at the same n, else at the nearest n measured scaled by n."""
    done = finished(work)
    out = {}
    for c in all_cells():
        if c.name in done:
            continue
        same = [(r["n"], s) for r in done.values() if r["arch"] == c.arch and r["finetune_steps"] == c.steps
                and (s := _per_step(r)) is not None]
        if not same:
            continue
        n0, s0 = min(same, key=lambda t: (abs(t[0] - c.n), -t[0]))
        restarts, steps = budget(c.budget, opts)
        per = s0 * (c.n / n0 if n0 != c.n else 1.0)
        basis = (f"{s0:.3f} s per outer step measured at n = {n0}" + (f", scaled by n/{n0}" if n0 != c.n else ""))
        out[c.name] = {"attack_s": per * steps * restarts, "basis": basis, "extrapolation": True,
                       "longer_than_an_hour": per * steps * restarts > 3600}
    return out


def finished(work: Path) -> dict[str, dict[str, Any]]:
    """The finished cells' records, in map order."""
    return {c.name: json.loads(p.read_text()) for c in all_cells()
            if (p := work / "cells" / c.name / "cell.json").is_file()}


def _suffix(record: dict[str, Any]) -> str:
    """The cell name's setting suffix of a record ("" for the gradient-inversion preset and older records)."""
    setting = record.get("setting") or "gradient-inversion"
    return "" if setting == "gradient-inversion" else f"-{setting}"


def _series(record: dict[str, Any]) -> tuple[int, str, str]:
    """(fine-tuning steps, budget, setting suffix): one series of the map."""
    return record["finetune_steps"], record["budget"], _suffix(record)


def boundary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per architecture: the largest n with at least half the images above the threshold (over every fine-tuning,
    budget and attack setting measured, and per series ``sSTEPS-BUDGET[-SETTING]``), else the best mean best SSIM reached and its cell."""
    out: dict[str, Any] = {}
    for arch in ARCHS:
        mine = [r for r in records if r["arch"] == arch]
        if not mine:
            continue
        leaks = [r for r in mine if (r.get("headline") or {}).get("count", 0) * 2 >= r["n"]
                 and (r.get("headline") or {}).get("count", 0) > 0]
        settings = sorted({_series(r) for r in mine})
        per = {f"s{s}-{b}{suffix}": max((r["n"] for r in leaks if _series(r) == (s, b, suffix)), default=None)
               for s, b, suffix in settings}
        best = max(mine, key=lambda r: r["simudy"]["mean_best_ssim"])
        out[arch] = {"largest_n_half_recovered": max((r["n"] for r in leaks), default=None), "per_setting": per,
                     "best_mean_best_ssim": best["simudy"]["mean_best_ssim"], "best_cell": best["cell"],
                     "cells_measured": len(mine),
                     "diverged": [r["cell"] for r in mine if (r.get("attack") or {}).get("diverged")]}
    return out


def collect(work: Path, opts: dict[str, Any]) -> dict[str, Any]:
    """The finished cells, the extrapolated cost of the others and the boundary per architecture."""
    done = finished(work)
    est = estimates(work, opts)
    pending = [{"cell": c.name, **est.get(c.name, {"basis": "no cell of this architecture and fine-tuning measured"})}
               for c in all_cells() if c.name not in done]
    return {"benchmark": "leakage_map", "cells": list(done.values()), "pending": pending,
            "boundary": boundary(list(done.values())), "command": " ".join(sys.argv)}


def _fmt(v: Any, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def markdown_rows(results: dict[str, Any]) -> list[str]:
    """One line of docs/RESULTS.md's table per finished cell (the table's header is written there)."""
    lines = []
    for r in results["cells"]:
        s, h, a = r["simudy"], r.get("headline") or {}, r.get("attack") or {}
        kept = (a.get("restarts") or {}).get(a.get("kept"), {})
        cosine = kept.get("final_cosine", (a.get("final_cosine") or {}).get(a.get("kept")))  # older records
        fit = f"diverged at step {kept.get('steps_done')}" if a.get("diverged") else _fmt(cosine)
        null = r.get("heldout_null_draws") or {}
        lo, hi = s["mean_best_ssim_ci95"]
        wall = a.get("wall_s") if a.get("wall_s") is not None else a.get("run_wall_time_s")
        acc = (a.get("labels") or {}).get("accuracy")
        lines.append(
            f"| {r['cell']} | {_fmt(r['target']['train_accuracy'], 2)} / {_fmt(r['target']['heldout_accuracy'], 2)} "
            f"| {fit} | {_fmt(acc, 2)} | {h.get('count')} / {r['n']} ({h.get('heldout')}, {h.get('noise')}; "
            f"{_fmt(h.get('threshold'), 2)}) | {_fmt(s['mean_best_ssim'])} [{_fmt(lo)}, {_fmt(hi)}] "
            f"| {_fmt(s['mean_best_ssim_heldout_null'])}; {_fmt(null.get('mean'))} [{_fmt((null.get('interval95') or [None])[0])}, "
            f"{_fmt((null.get('interval95') or [None, None])[1])}] | {_fmt(s['mean_best_ssim_noise_null'])} "
            f"| {_fmt(wall, 0)} |")
    return lines


def figure(results: dict[str, Any], out: Path) -> None:
    """Mean best SSIM against n, one panel per (fine-tuning steps, architecture), a series per budget with its 95 %
    interval and the count k/n, beside the held-out null over its draws (line: mean, band: 95 % of the draws) and
    the noise null."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    archs = [a for a in ARCHS if any(r["arch"] == a for r in results["cells"])] or list(ARCHS)
    fig, axes = plt.subplots(len(STEPS), len(archs), figsize=(4.2 * len(archs), 3.6 * len(STEPS)), sharey=True,
                             squeeze=False)
    for i, s in enumerate(STEPS):
        for j, a in enumerate(archs):
            _panel(axes[i][j], [r for r in results["cells"] if r["arch"] == a and r["finetune_steps"] == s])
            axes[i][j].set_title(f"{ARCHS[a]['label']}, {s} fine-tuning step{'s' if s > 1 else ''}", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("private images n")
    for row in axes:
        row[0].set_ylabel("mean best SSIM")
    axes[0][0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def _panel(ax: Any, rows: list[dict[str, Any]]) -> None:
    colours = {("b1500", ""): "tab:blue", ("b10k", ""): "tab:red", ("b1500", "-simudy"): "tab:green",
               ("b1500", "-pca"): "tab:purple", ("b1500", "-simudy-pca"): "tab:orange", ("b30k", "-simudy"): "tab:olive"}
    rows = sorted(rows, key=lambda r: r["n"])
    nulls = {r["n"]: r for r in rows if r.get("heldout_null_draws")}
    if nulls:  # the held-out null over its seeded draws: mean and 95 % range
        ns = sorted(nulls)
        draws = [nulls[n]["heldout_null_draws"] for n in ns]
        ax.fill_between(ns, [d["interval95"][0] for d in draws], [d["interval95"][1] for d in draws], color="grey",
                        alpha=0.25, lw=0)
        ax.plot(ns, [d["mean"] for d in draws], color="grey", label="held-out null (mean, 95 % of draws)")
        ax.plot(ns, [nulls[n]["simudy"]["mean_best_ssim_noise_null"] for n in ns], color="grey", ls=":",
                label="noise null")
    for (name, suffix), colour in colours.items():
        mine = [r for r in rows if r["budget"] == name and _suffix(r) == suffix]
        if not mine:
            continue
        x = [r["n"] for r in mine]
        y = [r["simudy"]["mean_best_ssim"] for r in mine]
        err = [[v - r["simudy"]["mean_best_ssim_ci95"][0] for v, r in zip(y, mine)],
               [r["simudy"]["mean_best_ssim_ci95"][1] - v for v, r in zip(y, mine)]]
        label = f"{mine[0]['restarts']} x {mine[0]['outer_steps']} steps" + (f", {suffix[1:]}" if suffix else "")
        ax.errorbar(x, y, yerr=err, color=colour, marker="o", capsize=3, label=label)
        for r, v in zip(mine, y):
            diverged = (r.get("attack") or {}).get("diverged")
            ax.annotate(f"{(r.get('headline') or {}).get('count')}/{r['n']}" + (" diverged" if diverged else ""),
                        (r["n"], v), fontsize=7, textcoords="offset points", xytext=(4, 4), color=colour)
            if diverged:
                ax.plot([r["n"]], [v], "x", color="black", ms=9)
    ax.set_xscale("log")
    ax.set_xticks(list(NS))
    ax.set_xticklabels([str(n) for n in NS])
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--cells", nargs="*")
    c = sub.add_parser("cell")
    c.add_argument("cell")
    r = sub.add_parser("run")
    r.add_argument("--cells", nargs="*")
    r.add_argument("--max-hours", type=float, default=None)
    r.add_argument("--backend", default="local")
    r.add_argument("--workers", type=int, default=None)
    r.add_argument("--ray-address", default=None)
    for q in (c, r):
        q.add_argument("work", type=Path)
        q.add_argument("--threads", type=int, default=1)
        q.add_argument("--device", default=None)
        q.add_argument("--scale", choices=sorted(SCALES), default="cifar")
    t = sub.add_parser("table")
    t.add_argument("work", type=Path)
    t.add_argument("--out", type=Path, default=RESULTS_DIR / "leakage_map.json")
    t.add_argument("--markdown", action="store_true", help="also print a table row per finished cell")
    f = sub.add_parser("figure")
    f.add_argument("--results", type=Path, default=RESULTS_DIR / "leakage_map.json")
    f.add_argument("--out", type=Path, default=RESULTS_DIR / "leakage_map.png")
    args = ap.parse_args(argv)
    if args.mode == "plan":
        for cell in select(args.cells):
            print(f"{cell.name:22s} python benchmarks/leakage_map.py cell {cell.name} WORK --threads 1")
        return 0
    if args.mode == "figure":
        figure(json.loads(args.results.read_text()), args.out)
        return 0
    if args.mode == "table":
        results = collect(args.work, {"scale": work_scale(args.work, None)})
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        if args.markdown:
            print("\n".join(markdown_rows(results)))
        print(f"{len(results['cells'])} cells finished, {len(results['pending'])} pending; wrote {args.out}")
        return 0
    opts = {"threads": args.threads, "device": args.device, "scale": work_scale(args.work, args.scale)}
    if args.mode == "cell":
        cell = next((c for c in all_cells() if c.name == args.cell), None)
        if cell is None:
            refuse(f"{args.cell!r} names no cell; names look like resnet8-s1-n4-b1500 "
                   "(`python benchmarks/leakage_map.py plan` lists them)")
        record = fill_cell(cell, args.work, opts)
        print(f"{cell.name}: {(record.get('headline') or {}).get('count')} of {cell.n} above the threshold, mean best "
              f"SSIM {record['simudy']['mean_best_ssim']:.3f}; wrote {args.work / 'cells' / cell.name / 'cell.json'}")
        return 0
    from datarecon.experiments.execution import Execution

    execution = Execution(backend=args.backend, workers=args.workers, ray_address=args.ray_address,
                          threads=args.threads)
    return run_map(args.work, select(args.cells), opts=opts, execution=execution, max_hours=args.max_hours)


if __name__ == "__main__":
    raise SystemExit(main())
