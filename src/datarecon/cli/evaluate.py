"""``datarecon evaluate``: compare a run's candidates with the ground truth (evaluation only)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from datarecon.cli.options import Common, Flag, common_options, config_options, flags, option_group
from datarecon.config import build_config
from datarecon.errors import DataReconError
from datarecon.evaluation import run_metrics
from datarecon.evaluation.membership import EXPECTED_GAIN
from datarecon.evaluation.privacy import signal_verdict
from datarecon.evaluation.run_eval import RunEvaluationSettings, check_reference_sets, check_run, run_convergence
from datarecon.experiments.identifiability import attach_identifiability
from datarecon.experiments.membership.evaluate import attach_membership
from datarecon.experiments.membership.folder import read_membership_folder
from datarecon.experiments.sweep import pool_candidates
from datarecon.report.text import strongest_lines
from datarecon.utils.io import load_tensors


def _images(path: Path | None, option: str):
    """Tensor ``x`` of a safetensors file (never a pickle), or None."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise DataReconError(f"{option} file {path} not found; pass a safetensors file with the images as 'x'")
    tensors = load_tensors(path)
    if "x" not in tensors:
        raise DataReconError(f"{path} has no tensor 'x'; {option} takes a safetensors file with the images as 'x' "
                             "(N, C, H, W) in the model's input space")
    return tensors["x"]


def _reference_sets(text: str) -> tuple[str, ...]:
    """``--against train,noise`` → ``("train", "noise")``.

    Raises:
        DataReconError: an unknown name, one given twice, or none at all.
    """
    try:
        return check_reference_sets(tuple(s.strip() for s in text.split(",") if s.strip()))
    except ValueError as exc:
        raise DataReconError(f"--against {text}: {exc}") from None


def _flags() -> tuple[Flag, ...]:
    """One flag per option of :class:`~datarecon.evaluation.run_eval.RunEvaluationSettings` but
    ``prefilter``, ``thresholds`` and ``grid_max``, which keep their defaults."""
    return flags(RunEvaluationSettings, skip=("prefilter", "thresholds", "grid_max"),
                 parse={"against": _reference_sets})


def _evaluate(run: Path, settings: RunEvaluationSettings, *, data_dir: Path | None, progress: bool,
              train: Path | None = None, heldout: Path | None = None) -> dict:
    return run_metrics(run, settings, data_dir=data_dir, progress=progress,
                        train=_images(train, "--train"), heldout=_images(heldout, "--heldout"))


@dataclass(frozen=True)
class Inputs:
    """What an evaluation reads besides the run: a user's own model's examples and a membership folder.

    Attributes:
        train: runs of your own model (``--model package.module:factory``): its training inputs (tensor ``x``).
        heldout: runs of your own model: held-out inputs, the null (tensor ``x``).
        membership: a membership folder of the run's model (``datarecon membership --evaluate --out DIR``): its
            result, reference attacks included, becomes the run's membership section.
    """

    train: Path | None
    heldout: Path | None
    membership: Path | None


INPUTS = {
    "train": (Path | None, None, typer.Option("--train", help="Runs of your own model (--model package.module:factory):"
                                              " its training inputs, safetensors tensor 'x'.")),
    "heldout": (Path | None, None, typer.Option("--heldout", help="Runs of your own model: held-out inputs (the null), "
                                                "safetensors tensor 'x'.")),
    "membership": (Path | None, None, typer.Option("--membership", help="A membership folder of the run's model "
                                                   "(datarecon membership --evaluate --out DIR): its result, reference "
                                                   "attacks included, in the run's membership card.")),
}


def register(app: typer.Typer) -> None:
    """Add ``evaluate`` to ``app``."""

    @app.command("evaluate")
    @config_options(_flags())
    @option_group("inputs", Inputs, INPUTS)
    @common_options()
    def evaluate_cmd(
        runs: Annotated[list[Path] | None, typer.Argument(help="Run directories to evaluate.")] = None,
        sweep: Annotated[Path | None, typer.Option(help="Evaluate the pooled candidates of a sweep directory.")] = None,
        top: Annotated[int, typer.Option(help="With --sweep: pool the K best runs (attacker-side criterion).")] = 5,
        data_dir: Annotated[Path | None, typer.Option(envvar="DATARECON_DATA", help="Data folder.")] = None,
        *,
        inputs: Inputs,
        common: Common,
        overrides: dict[str, Any],
    ) -> None:
        """Write RUN/metrics.json and RUN/candidates.csv (nearest neighbours, Haim protocol, baselines, privacy ROC,
        and membership of the attacked model: every signal but the reference attacks, or with --membership DIR the
        result of a membership folder, reference attacks included)."""
        train, heldout = inputs.train, inputs.heldout
        settings = build_config(RunEvaluationSettings, overrides, where="evaluation settings")
        targets = list(runs or [])
        if sweep is not None:
            targets.append(pool_candidates(sweep, top=top))
        if not targets:
            raise DataReconError("nothing to evaluate; pass RUN directories or --sweep DIR")
        check_runs(targets, settings)
        if inputs.membership is not None:  # every run's membership folder checked before the first run's metrics
            for run in targets:
                read_membership_folder(run, inputs.membership)
        for run in targets:
            summary = _evaluate(Path(run), settings, data_dir=data_dir, progress=common.progress, train=train,
                                heldout=heldout)
            typer.echo(f"{run}: wrote metrics.json and candidates.csv")
            for line in _headline(summary):
                typer.echo(line)
            _membership(Path(run), data_dir, inputs.membership)
            for line in convergence_lines(Path(run)):
                typer.echo(line)


def _membership(run: Path, data_dir: Path | None, folder: Path | None) -> None:
    """Add the membership and identifiability sections to the run's metrics (a run of a model directory) and print
    their leads."""
    section = attach_membership(run, data_dir=data_dir, folder=folder)
    if section is not None and section["strongest"]["name"]:
        for line in strongest_lines(section):
            typer.echo(f"membership: {line}")
        if not (section.get("references") or {}).get("count"):
            typer.echo(f"membership: the reference attacks (LiRA, RMIA) were not run: {EXPECTED_GAIN}; `datarecon "
                       "membership --model M --evaluate --out DIR` runs them, `--membership DIR` shows them here")
    identifiability = attach_identifiability(run, data_dir=data_dir)
    if identifiability is not None:
        typer.echo(identifiability_lead(identifiability))


def identifiability_lead(result: dict[str, Any]) -> str:
    """One line: how many of the measured objectives the training set fits better than every fake, and which."""
    measured = [k for k, v in result["objectives"].items() if "sets" in v]
    found = [k for k in measured if result["objectives"][k].get("identifies")]
    which = f" ({', '.join(found)})" if found else ""
    return (f"identifiability: the training set fits {len(found)} of the {len(measured)} objectives measured better "
            f"than every fake{which}; details: datarecon identifiability MODEL")


def check_runs(runs: list[Path], settings: RunEvaluationSettings) -> None:
    """Every run checked before the first is evaluated (a bad run anywhere in the list refuses the
    command before any run's metrics are rewritten), and none named twice.

    Raises:
        DataReconError, CheckpointError: one line naming the first bad run.
    """
    seen: dict[Path, Path] = {}
    for run in runs:
        key = Path(run).resolve()
        if key in seen:
            raise DataReconError(f"run {run} is given twice (as {seen[key]} and {run}); name each run once")
        seen[key] = Path(run)
        check_run(run, settings)


def convergence_lines(run: Path) -> list[str]:
    """``attack: converged: ...`` or ``attack: NOT converged: ...``, the verdict the report's attack card
    shows (for a pool: how many of its runs converged, and the first that did not)."""
    verdicts = run_convergence(run)
    if not verdicts:
        return []
    if len(verdicts) == 1 and verdicts[0][0] == run.name:
        verdict = verdicts[0][1]
        return [("attack: converged: " if verdict.converged else "attack: NOT converged: ") + verdict.reason]
    bad = [(name, verdict) for name, verdict in verdicts if not verdict.converged]
    if not bad:
        return [f"attack: converged: all {len(verdicts)} pooled runs ({verdicts[0][1].reason} for {verdicts[0][0]})"]
    return [f"attack: NOT converged: {len(bad)} of {len(verdicts)} pooled runs ({bad[0][0]}: {bad[0][1].reason})"]


def _headline(summary: dict) -> list[str]:
    """What is worth printing, in the report's words: the headline count beside its nulls (and its
    rule), the parameter distance, and what the privacy measurement says about each signal."""
    # lazy: datarecon.report loads matplotlib, which would slow the start of every command
    from datarecon.report.text import headline_lines

    lines = headline_lines(summary.get("headline") or {})
    if summary.get("param_distance") is not None:
        lines.append(f"parameter distance ||theta* - theta||^2: {summary['param_distance']:.4g}")
    labels = summary.get("labels")
    if labels is not None:
        lines.append(f"labels restored from theta* - theta_init: {labels['accuracy']:.0%} of the training labels "
                     f"(counts {labels['counts']}, true {labels['true_counts']})")
    verdict = signal_verdict(summary.get("privacy") or {})
    lines.append("privacy: " + verdict.lead + (f" ({verdict.measured})" if verdict.measured else ""))
    if verdict.needs:
        lines.append("privacy: " + verdict.needs)
    return lines
