"""The HTML report is self-contained: every <img> is a data: URI holding a valid PNG."""

from __future__ import annotations

import re

import base64
import dataclasses
import io
import json
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image as mpimg
import pytest
import torch

from datarecon.errors import DataReconError
from datarecon.evaluation import RunRecord, evaluation_against, noise_images, write_evaluation
from datarecon.report import FigureItem, Section, Table, figure_png, render_report, sorted_ssim_curve, write_report
from datarecon.utils.io import atomic_write_json


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs: list[str] = []
        self.external: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        for key in ("src", "href"):
            v = a.get(key)
            if v and not v.startswith("data:") and not v.startswith("#"):
                self.external.append(v)
        if tag in ("script", "link", "iframe"):
            self.external.append(tag)


def _check_html(path: Path) -> _Collect:
    text = path.read_text(encoding="utf-8")
    p = _Collect()
    p.feed(text)
    assert not p.external, p.external
    assert "http://" not in text and "https://" not in text and "@import" not in text
    for src in p.imgs:
        assert src.startswith("data:image/png;base64,")
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert mpimg.imread(io.BytesIO(data), format="png").ndim == 3
    return p


def _smooth(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, 16, 16, generator=g)
    x = torch.nn.functional.avg_pool2d(x, 3, stride=1, padding=1)
    lo = x.flatten(1).min(1).values.view(-1, 1, 1, 1)
    hi = x.flatten(1).max(1).values.view(-1, 1, 1, 1)
    return (x - lo) / (hi - lo)


def _fake_run(root: Path, name: str, lam: tuple[float, float] | None, seed: int, *, min_class_size: int = 1) -> Path:
    train, held, part = _smooth(12, 1), _smooth(12, 2), _smooth(12, 3)
    cands = torch.cat([train[:3] * 0.9 + 0.05, noise_images(5, (3, 16, 16), generator=torch.Generator().manual_seed(seed))])
    refs = {"train": train, "heldout": held, "partition": part, "noise": noise_images(12, (3, 16, 16))}
    ev = evaluation_against(cands, references=refs,
                             record=RunRecord(labels=torch.ones(8), margins=torch.linspace(0, 1, 12), scores={
                                 "lambda": torch.rand(8, generator=torch.Generator().manual_seed(seed))}),
                             config={"top_k": 12, "n_floor_noise": 50, "min_class_size": min_class_size})
    run = root / name
    run.mkdir()
    config = {"attack": {"name": "bilevel"}}
    if lam is not None:
        config["init"] = {"kind": "mixture", "lambda1": lam[0], "lambda2": lam[1]}
    atomic_write_json(run / "run.json", {"model_dir": "m", "method": "bilevel", "status": "complete", "config": config})
    write_evaluation(run, dataclasses.replace(ev, summary=dict(ev.summary, param_distance=1e-3)))
    return run


def _visible(html_text: str) -> str:
    """The words a reader sees: no tags, no embedded images, no collapsed configuration."""
    text = re.sub(r"<pre>.*?</pre>", " ", html_text, flags=re.S)
    text = re.sub(r"<img[^>]*>", " ", text)
    return re.sub(r"<[^>]+>", " ", text)


def test_write_report_sections(tmp_path):
    png = figure_png(sorted_ssim_curve({"real": [0.9, 0.5]}))
    out = write_report([Section("A <b>", text=["x & y"], tables=[Table("t", ["a", "b"], [[1.0, None], ["s", float("nan")]])],
                                figures=[FigureItem("f", png)], code='{"a": 1}', notes=["careful"])],
                       out=tmp_path / "r.html", title="T")
    p = _check_html(out)
    assert len(p.imgs) == 1 and "A &lt;b&gt;" in out.read_text()
    with pytest.raises(DataReconError, match="not PNG"):
        write_report([Section("x", figures=[FigureItem("bad", b"GIF89a")])], out=tmp_path / "bad.html")


@pytest.mark.slow
def test_render_report_from_runs(tmp_path):
    runs = [_fake_run(tmp_path, f"r{i}", lam, i) for i, lam in enumerate([(0.0, 1.0), (1.0, 1.0), (1.0, 0.0), (0.5, 0.5)])]
    runs.append(_fake_run(tmp_path, "plain", None, 9))
    out = render_report(runs, out=tmp_path / "report.html")
    p = _check_html(out)
    text = out.read_text()
    # per run: curve, margin scatter, grid, and the ROC where it is measurable (both classes, at least
    # min_class_size each; no history.jsonl here: no convergence curve); plus landscape heatmaps and
    # interpolation curves
    priv = [json.loads((r / "metrics.json").read_text())["privacy"] for r in runs]
    with_roc = sum(bool(pr["roc"]) for pr in priv)
    assert with_roc == sum(1 for pr in priv if pr["n_real"] and pr["n_fake"])  # min_class_size=1 here
    assert 0 < with_roc < 5
    assert len(p.imgs) == 5 * 3 + with_roc + 2
    assert text.count("not measurable: an AUC needs at least 1 candidates of each class") == 5 - with_roc
    assert "Landscape" in text and "ROC AUC" in text and "Rule: a candidate is a positive iff" in text
    assert not re.search(r"\breal\b|\bfakes?\b", _visible(text), flags=re.I)  # issue 25: labels say what was measured
    # fractions are shown as counts of a total, not as bare numbers that read like counts
    assert re.search(r"near-duplicate pairs \(l2 threshold [0-9.]+\) +\d+ of 28 \(\d+%\)", _visible(text))
    assert re.search(r"candidates with a near-duplicate +\d+ of 8 \(\d+%\)", _visible(text))
    with pytest.raises(DataReconError, match="no metrics.json"):
        render_report([tmp_path / "missing"], out=tmp_path / "x.html")
    with pytest.raises(DataReconError, match="no run directories"):
        render_report([], out=tmp_path / "x.html")


@pytest.mark.parametrize("undefined", [None, "nan"], ids=["null", "old-nan-string"])
def test_report_survives_undefined_auc(tmp_path, undefined):
    """An undefined AUC (one class empty) is shown as n/a, whether written as null or, by older
    versions, as the string "nan" (which used to crash the ROC legend)."""
    run = _fake_run(tmp_path, "r", None, 0)
    m = json.loads((run / "metrics.json").read_text())
    for v in m["privacy"]["scores"].values():
        v["auc"], v["auc_ci_95"] = undefined, None
    (run / "metrics.json").write_text(json.dumps(m))
    out = render_report([run], out=tmp_path / "report.html")
    _check_html(out)
    assert "n/a" in out.read_text()


def test_report_says_too_few_of_a_class_is_not_measurable(tmp_path):
    """Both classes present but below min_class_size: no ROC figure, no AUC claimed, the card says why."""
    run = _fake_run(tmp_path, "r", None, 0, min_class_size=10)
    priv = json.loads((run / "metrics.json").read_text())["privacy"]
    assert priv["n_real"] and priv["n_fake"] and priv["roc"] == {}  # 8 candidates: fewer than 10 of each
    text = render_report([run], out=tmp_path / "report.html").read_text()
    assert "not measurable: an AUC needs at least 10 candidates of each class" in text
    assert "separates them" not in text and "ROC of each attacker-side score" not in text


def test_render_report_accepts_an_in_memory_evaluation(tmp_path):
    """A user's own model has no run directory: the report takes evaluation_of()'s result directly."""
    from datarecon.evaluation import evaluation_of

    train, held = _smooth(12, 1), _smooth(12, 2)
    cands = torch.cat([train[:3] * 0.9 + 0.05, noise_images(5, (3, 16, 16), generator=torch.Generator().manual_seed(0))])
    ev = evaluation_of(cands, train=train, heldout=held, noise=12, record=RunRecord(scores={"lambda": torch.arange(8.0)}),
                  config={"top_k": 12, "n_floor_noise": 50, "min_class_size": 1})
    out = render_report([ev], out=tmp_path / "own.html")
    p = _check_html(out)
    text = out.read_text()
    assert "evaluation 1" in text and "evaluated in memory" in text and "ROC AUC" in text
    assert not re.search(r"\? /|: \?|\? ", _visible(text.split("<body>")[1]).replace("image? ", ""))  # no "? / ?"
    assert len(p.imgs) == 3  # sorted-SSIM curve, neighbour grid, ROC (no history, no margins)


def test_no_internals_leak_into_headings_and_cards():
    """Issue 25 item 4: "affine None" (an unset hidden list) and "Run run (kkt)" (the run folder's generic
    name) were shown to readers."""
    from datarecon.report.html import arch_text, display_name

    assert arch_text({"name": "affine", "hidden": None, "input_shape": [3, 32, 32], "num_outputs": 1,
                      "bias": True}) == "affine 3072→1, bias"
    assert arch_text({"name": "mlp", "hidden": [200], "input_shape": [1, 8, 8], "num_outputs": 1,
                      "bias": False}) == "MLP 64-200-1, no biases"
    assert "None" not in arch_text({"name": "cnn", "hidden": [32, 64], "kernel": None, "input_shape": [1, 8, 8],
                                    "num_outputs": 1, "bias": False})
    assert display_name(Path("/x/demo/run"), "r") == "demo" and display_name(Path("/x/kkt"), "r") == "kkt"
    assert display_name(None, "evaluation 1") == "evaluation 1"


def test_the_montage_says_how_many_of_how_many_it_shows_and_in_what_order(tmp_path):
    import torch

    from datarecon.report.figures import neighbour_grid

    x = torch.rand(30, 1, 8, 8)
    fig = neighbour_grid(x, {"train": x}, max_items=24, total=200, sorted_by="SSIM to their nearest training image")
    assert fig._suptitle.get_text().startswith("24 of 200 candidates shown, sorted by SSIM to their nearest training image")


def test_threat_model_card_and_scree_plot(tmp_path):
    """A run's report opens with what the attacker had, and shows the first layer's spectrum it analysed."""
    import numpy as np

    from datarecon.attacks.subspace import DenseLayer, RankEstimate, Spectrum, SubspaceAnalysis, save_analysis

    run = _fake_run(tmp_path, "known", None, 3)
    meta = json.loads((run / "run.json").read_text())
    meta["knowledge"] = {"weights": True, "known_init": {"source": "seed:0", "sha256": "ab" * 32}, "n": 12,
                         "used": ["weights", "known_init", "n"], "requires": [],
                         "summary": "attacker knows: weights θ*, architecture, loss, input range, label set; "
                                    "initialisation θ_init (seed:0); n = 12"}
    meta["subspace"] = {"layer": "1", "weight": "1.weight", "shape": [40, 768], "on_input": True,
                        "matrix": "W - a*W_init", "coefficient": 1.0, "k": 12, "n_known": 12, "method": "randomized",
                        "rank": {"n_hat": 12, "interval": [12, 12], "above_noise": None, "searched": 28}}
    atomic_write_json(run / "run.json", meta)
    values = torch.tensor(np.r_[np.geomspace(3, 0.1, 12), np.full(16, 1e-7)])
    save_analysis(run / "subspace.safetensors", SubspaceAnalysis(
        DenseLayer("1", "1.weight", 768, 40, True), Spectrum(values, torch.eye(28, dtype=torch.float64), (40, 768),
                                                             "randomized"),
        RankEstimate(12, 12, 12, None, 28), 12, True, 1.0, 12))
    plain = _fake_run(tmp_path, "plain", None, 4)
    out = render_report([run, plain], out=tmp_path / "report.html")
    text = _visible(out.read_text())
    first = text.index("Threat model: what the attacker had")
    assert first < text.index("Target") and "known (seed:0, sha256 abababababab)" in text
    assert "initialisation θ_init (seed:0); n = 12" in text and "k = 12" in text
    assert "Singular values of the first dense layer (W - a*W_init)" in text
    assert "weights-only attacker (weights, architecture" in text  # the run without a record says so
    assert text.count("Singular values of the first dense layer") == 1


def test_the_threat_card_checks_the_n_estimate_against_the_true_n(tmp_path):
    """Where the evaluation knows n, the card shows it beside the estimate and flags an estimate whose
    range misses it (a demo card showed "n estimated 12 (interval 11-12)" beside n = 20 unflagged);
    it also says what k is."""
    from datarecon.report.html import _threat_card

    sub = {"layer": "1", "weight": "1.weight", "shape": [40, 768], "on_input": True, "matrix": "W",
           "coefficient": None, "k": 64, "n_known": None, "method": "randomized",
           "rank": {"n_hat": 12, "interval": [11, 12], "above_noise": 19, "searched": 64}}
    run = {"knowledge": {"summary": "weights only", "used": ["weights"]}, "subspace": sub}
    card = _threat_card(run, 20)
    rows = dict(card.rows)
    assert card.status == "bad"
    assert rows["true n (from the evaluation, not known to the attacker)"].startswith(
        "20: OUTSIDE the estimated range; the estimate missed it")
    assert rows["training subspace used"].startswith("k = 64 directions: the subspace of the first layer's inputs")
    assert "n expected in 11–12" in rows["n estimated from it"]
    inside = _threat_card({**run, "subspace": {**sub, "rank": {**sub["rank"], "interval": [11, 64]}}}, 20)
    assert inside.status != "bad" and dict(inside.rows)[
        "true n (from the evaluation, not known to the attacker)"] == "20: inside the estimated range, 12 off by 8"
    assert "true n (from the evaluation, not known to the attacker)" not in dict(_threat_card(run).rows)
