"""``datarecon membership``: are these images in the model's training set? (subspace membership)

Scores images by their distance to the training subspace of the model's first dense layer
(:mod:`datarecon.experiments.membership`), with a member / non-member call at ``--fpr`` calibrated
on a null the user can see (``--null``, default the model's held-out test images). ``--evaluate``
instead measures the test's power on the model's own training vs held-out images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel, ConfigDict

from datarecon.cli._common import ThreadsOption, set_threads
from datarecon.cli.options import Flag, OutFile, config_options, flags, out_file_options
from datarecon.errors import DataReconError

#: Image rows printed on the terminal (all of them go to --out).
SHOWN = 20


class Calibration(BaseModel):
    """Where the member call's threshold comes from (``--images`` only): the null and the false-positive rate.

    Attributes:
        null: images known NOT to be training images, to calibrate the threshold on (default: the
            model's held-out test images)
        fpr: false-positive rate of the member call
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    null: Path | None = None
    fpr: float = 0.01


def _flags() -> tuple[tuple[Flag, ...], tuple[Flag, ...]]:
    """The flags of the attacker's knowledge (``--known-init``, ``--known-n``; the recipe is not used
    here) and of the calibration (``--null``, ``--fpr``)."""
    from datarecon.attacks.knowledge import KnowledgeSettings

    knowledge = flags(KnowledgeSettings, rename={"known_init": "--known-init", "n": "--known-n"},
                      skip=("recipe.source", "recipe.unknown"))
    return knowledge, flags(Calibration, parse={"null": Path})


KNOWLEDGE_FLAGS, CALIBRATION_FLAGS = _flags()


@config_options(KNOWLEDGE_FLAGS, into="knowledge")
@config_options(CALIBRATION_FLAGS, into="calibration")
@out_file_options(out="write the full result as JSON")
def membership(
    model: Path = typer.Option(..., "--model", help="model directory (from `datarecon train`)"),
    images: Path | None = typer.Option(None, "--images", help="images to score: a folder of PNGs, an .npz or a "
                                       ".safetensors file (values 0-255 or [0, 1])"),
    evaluate: bool = typer.Option(False, "--evaluate", help="measure the test on the model's own training vs "
                                  "held-out and partition images (ROC AUC, TPR at 1% and 0.1% FPR)"),
    data_dir: Path | None = typer.Option(None, "--data-dir", envvar="DATARECON_DATA",
                                         help="data folder (the default null and --evaluate)"),
    threads: ThreadsOption = 0,
    *,
    knowledge: dict[str, Any],
    calibration: dict[str, Any],
    output: OutFile,
) -> None:
    """Score images for membership in a model's training set (subspace of the first dense layer)."""
    from datarecon.attacks.knowledge import KnowledgeSettings
    from datarecon.config import build_config
    from datarecon.experiments.membership import evaluate_membership, score_images
    from datarecon.utils.io import atomic_write_json

    if (images is None) == (not evaluate):
        raise DataReconError("pass --images PATH (score your images) or --evaluate (measure the test), one of them")
    out = output.check(ours=_is_result, what="membership result")  # before any work
    if evaluate and calibration:
        raise DataReconError("--null and --fpr set the member call of --images; --evaluate measures the whole ROC: "
                             "drop them")
    set_threads(threads)
    known = build_config(KnowledgeSettings, knowledge, where="knowledge")
    if evaluate:
        result = evaluate_membership(model, knowledge=known, data_dir=data_dir)
        _print_evaluation(result)
    else:
        cal = build_config(Calibration, calibration, where="calibration")
        result = score_images(model, images, null=cal.null, knowledge=known, fpr=cal.fpr, data_dir=data_dir)
        _print_scores(result, cal.fpr)
    if out is not None:
        atomic_write_json(out, result)
        typer.echo(f"wrote {out}")


def _is_result(path: Path) -> bool:
    """Whether ``path`` is a membership result this command wrote (a JSON object with its sections)."""
    from datarecon.errors import CheckpointError
    from datarecon.utils.io import read_json

    try:
        result = read_json(path)
    except CheckpointError:
        return False
    return isinstance(result, dict) and {"knowledge", "subspace"} <= set(result)


def _print_evaluation(result: dict[str, Any]) -> None:
    """What ``--evaluate`` prints: the knowledge, the subspace, the ROC line and the median distances."""
    typer.echo(result["knowledge"]["summary"])
    sub = result["subspace"]
    typer.echo(f"subspace: layer {sub['layer']} ({sub['matrix']}), k = {sub['k']}, n estimate "
               f"{sub['rank']['n_hat']} (interval {sub['rank']['interval'][0]}-{sub['rank']['interval'][1]})")
    typer.echo(f"training images vs {result['roc']['n_nonmembers']} held-out and partition images, {result['line']}")
    d = result["distances"]
    typer.echo(f"median distance: training {d['members_median']:.3g}, held-out {d['nonmembers_median']:.3g}")


def _print_scores(result: dict[str, Any], fpr: float) -> None:
    """What ``--images`` prints: the knowledge, the null, the first :data:`SHOWN` images' calls and notes."""
    typer.echo(result["knowledge"]["summary"])
    typer.echo(f"null: {result['null']['count']} images from {result['null']['source']}; threshold: distance "
               f"<= {result['threshold_distance']:.4g} (at most {fpr:.1%} of the null pass)")
    for row in result["images"][:SHOWN]:
        typer.echo(f"  {row['name']:<32} distance {row['distance']:.4f}  p {row['p_value']:.4f}  "
                   f"{'MEMBER' if row['member'] else 'non-member'}")
    if result["n_images"] > SHOWN:
        typer.echo(f"  ... {result['n_images'] - SHOWN} more (all in --out)")
    typer.echo(f"{result['members']} of {result['n_images']} images called members at {fpr:.1%} FPR")
    for note in result["notes"]:
        typer.echo(f"note: {note}")


def register(app: typer.Typer) -> None:
    """Add ``membership`` to ``app``."""
    app.command("membership")(membership)
