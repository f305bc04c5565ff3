"""``datarecon evaluate``: compare a run's candidates with the ground truth (evaluation only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from datarecon.cli.options import Common, common_options
from datarecon.errors import DataReconError
from datarecon.evaluation.neighbours import EXACT_UP_TO


def _images(path: Path | None, option: str):
    """Tensor ``x`` of a safetensors file (never a pickle), or None."""
    if path is None:
        return None
    from datarecon.utils.io import load_tensors

    if not Path(path).is_file():
        raise DataReconError(f"{option} file {path} not found; pass a safetensors file with the images as 'x'")
    tensors = load_tensors(path)
    if "x" not in tensors:
        raise DataReconError(f"{path} has no tensor 'x'; {option} takes a safetensors file with the images as 'x' "
                             "(N, C, H, W) in the model's input space")
    return tensors["x"]


def _evaluate(run: Path, *, against: str, data_dir: Path | None, metric: str, window: str,
              assignment: str, top_k: int, exact_up_to: int, seed: int, allow_incomplete: bool,
              progress: bool, train: Path | None = None, heldout: Path | None = None) -> dict:
    from datarecon.evaluation import evaluate_run

    sets = tuple(s.strip() for s in against.split(",") if s.strip())
    valid = {"train", "partition", "noise", "heldout"}
    bad = [s for s in sets if s not in valid]
    if bad or not sets:
        raise DataReconError(f"unknown reference set(s) {bad or against!r} in --against; valid names: "
                             f"{', '.join(sorted(valid))}")
    return evaluate_run(run, against=sets, data_dir=data_dir, metric=metric, window=window,
                        assignment=assignment, top_k=top_k, exact_up_to=exact_up_to, seed=seed,
                        allow_incomplete=allow_incomplete, progress=progress,
                        train=_images(train, "--train"), heldout=_images(heldout, "--heldout"))


def register(app: typer.Typer) -> None:
    """Add ``evaluate`` to ``app``."""

    @app.command("evaluate")
    @common_options()
    def evaluate_cmd(
        runs: Annotated[list[Path] | None, typer.Argument(help="Run directories to evaluate.")] = None,
        sweep: Annotated[Path | None, typer.Option(help="Evaluate the pooled candidates of a sweep directory.")] = None,
        top: Annotated[int, typer.Option(help="With --sweep: pool the K best runs (attacker-side criterion).")] = 5,
        against: Annotated[str, typer.Option(help="Reference sets, comma-separated.")] = "train,partition,noise,heldout",
        data_dir: Annotated[Path | None, typer.Option(envvar="DATARECON_DATA", help="Data folder.")] = None,
        metric: Annotated[str, typer.Option(help="Nearest-neighbour metric: ssim, l2, ncc, lncc.")] = "ssim",
        window: Annotated[str, typer.Option(help="SSIM window: gaussian (sigma 1.5, like scikit-image) or box3.")] = "gaussian",
        assignment: Annotated[str, typer.Option(help="Haim protocol matching: greedy, hungarian, independent.")] = "greedy",
        top_k: Annotated[int, typer.Option(help="Prefilter shortlist size before exact SSIM (searches of more "
                                                "than --exact-up-to pairs only; labelled approximate).")] = 32,
        exact_up_to: Annotated[int, typer.Option(help="Compare every candidate with every reference (exact) up to "
                                                      "this many pairs per search.")] = EXACT_UP_TO,
        seed: Annotated[int, typer.Option(help="Seed of the noise reference set and baselines.")] = 0,
        allow_incomplete: Annotated[bool, typer.Option(help="Evaluate runs that did not finish.")] = False,
        train: Annotated[Path | None, typer.Option(help="Runs of your own model (--model package.module:factory): "
                                                       "its training inputs, safetensors tensor 'x'.")] = None,
        heldout: Annotated[Path | None, typer.Option(help="Runs of your own model: held-out inputs (the null), "
                                                         "safetensors tensor 'x'.")] = None,
        *,
        common: Common,
    ) -> None:
        """Write RUN/metrics.json and RUN/candidates.csv (nearest neighbours, Haim protocol, baselines, privacy ROC)."""
        targets = list(runs or [])
        if sweep is not None:
            from datarecon.experiments.sweep import pool_candidates

            targets.append(pool_candidates(sweep, top=top))
        if not targets:
            raise DataReconError("nothing to evaluate; pass RUN directories or --sweep DIR")
        for run in targets:
            summary = _evaluate(Path(run), against=against, data_dir=data_dir, metric=metric, window=window,
                                assignment=assignment, top_k=top_k, exact_up_to=exact_up_to, seed=seed,
                                allow_incomplete=allow_incomplete, progress=common.progress,
                                train=train, heldout=heldout)
            typer.echo(f"{run}: wrote metrics.json and candidates.csv")
            for line in _headline(summary):
                typer.echo(line)


def _headline(summary: dict) -> list[str]:
    """What is worth printing, in the report's words: the headline count beside its nulls (and its
    rule), the parameter distance, and what the privacy measurement says about each signal."""
    from datarecon.evaluation.privacy import signal_verdict
    from datarecon.report.text import headline_lines

    lines = headline_lines(summary.get("headline") or {})
    if summary.get("param_distance") is not None:
        lines.append(f"parameter distance ||theta* - theta||^2: {summary['param_distance']:.4g}")
    priv = summary.get("privacy") or {}
    verdict = signal_verdict(priv)
    lines.append("privacy: " + verdict.lead + (f" ({verdict.measured})" if verdict.measured else ""))
    if verdict.needs:
        lines.append("privacy: " + verdict.needs)
    return lines
