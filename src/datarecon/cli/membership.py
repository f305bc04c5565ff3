"""``datarecon membership``: are these images in the model's training set? (subspace membership)

Scores images by their distance to the training subspace of the model's first dense layer
(:mod:`datarecon.experiments.membership`), with a member / non-member call at ``--fpr`` calibrated
on a null the user can see (``--null``, default the model's held-out test images). ``--evaluate``
instead measures the test's power on the model's own training vs held-out images.
"""

from __future__ import annotations

from pathlib import Path

import typer

from datarecon.errors import DataReconError

#: Image rows printed on the terminal (all of them go to --out).
SHOWN = 20


def membership(
    model: Path = typer.Option(..., "--model", help="model directory (from `datarecon train`)"),
    images: Path | None = typer.Option(None, "--images", help="images to score: a folder of PNGs, an .npz or a "
                                       ".safetensors file (values 0-255 or [0, 1])"),
    null: Path | None = typer.Option(None, "--null", help="images known NOT to be training images, to calibrate "
                                     "the threshold on (default: the model's held-out test images)"),
    evaluate: bool = typer.Option(False, "--evaluate", help="measure the test on the model's own training vs "
                                  "held-out and partition images (ROC AUC, TPR at 1% and 0.1% FPR)"),
    known_init: str | None = typer.Option(None, "--known-init", help="the attacker knows θ_init: seed (the model's "
                                          "recorded seed), seed:N or a safetensors file (subtracted from the first "
                                          "layer)"),
    known_n: int | None = typer.Option(None, "--known-n", help="the attacker knows n (the subspace dimension)"),
    fpr: float = typer.Option(0.01, "--fpr", help="false-positive rate of the member call"),
    out: Path | None = typer.Option(None, "--out", help="write the full result as JSON"),
    data_dir: Path | None = typer.Option(None, "--data-dir", envvar="DATARECON_DATA",
                                         help="data folder (the default null and --evaluate)"),
    threads: int | None = typer.Option(None, "--threads", help="torch threads (default: torch's)"),
) -> None:
    """Score images for membership in a model's training set (subspace of the first dense layer)."""
    import torch

    from datarecon.attacks.knowledge import KnowledgeSettings
    from datarecon.config import build_config
    from datarecon.experiments.membership import evaluate_membership, score_images
    from datarecon.utils.io import atomic_write_json

    if (images is None) == (not evaluate):
        raise DataReconError("pass --images PATH (score your images) or --evaluate (measure the test), one of them")
    if threads is not None:
        if threads < 1:
            raise DataReconError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    knowledge = build_config(KnowledgeSettings, {"known_init": known_init, "n": known_n}, where="knowledge")
    if evaluate:
        result = evaluate_membership(model, knowledge=knowledge, data_dir=data_dir)
        typer.echo(result["knowledge"]["summary"])
        sub = result["subspace"]
        typer.echo(f"subspace: layer {sub['layer']} ({sub['matrix']}), k = {sub['k']}, n estimate "
                   f"{sub['rank']['n_hat']} (interval {sub['rank']['interval'][0]}-{sub['rank']['interval'][1]})")
        typer.echo(f"training images vs {result['roc']['n_nonmembers']} held-out and partition images, {result['line']}")
        d = result["distances"]
        typer.echo(f"median distance: training {d['members_median']:.3g}, held-out {d['nonmembers_median']:.3g}")
    else:
        result = score_images(model, images, null=null, knowledge=knowledge, fpr=fpr, data_dir=data_dir)
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
    if out is not None:
        atomic_write_json(out, result)
        typer.echo(f"wrote {out}")


def register(app: typer.Typer) -> None:
    """Add ``membership`` to ``app``."""
    app.command("membership")(membership)
