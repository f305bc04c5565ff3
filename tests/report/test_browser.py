"""Reports as a reader sees them: the demo, a single run and a reproduction in headless Chromium.

Each page must show its headline numbers, load every image, keep its tables within the page at
1400 px, log no console error and request nothing from the network. Screenshots are written to
``$DATARECON_SCREENSHOTS`` when set (to look at them), else to the test's temporary folder.

Without Chromium the tests are skipped with a message (``make test`` on a machine without a
browser); in CI (``CI`` set) a missing browser is a failure, since ``.ci/run`` installs it.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from cdp import Rendered, find_chromium, render

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = find_chromium()


@pytest.fixture(scope="module", autouse=True)
def _need_browser():
    if CHROMIUM is None:
        msg = "no Chromium (apt-get install chromium): reports not checked in a browser"
        if os.environ.get("CI"):
            pytest.fail(msg + " — .ci/run installs it")
        pytest.skip(msg)
    pytest.importorskip("websocket", reason="websocket-client (test extra) is needed to drive Chromium")


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    env = os.environ.get("DATARECON_SCREENSHOTS")
    d = Path(env) if env else tmp_path_factory.mktemp("screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from datarecon.experiments.demo import DemoConfig, run_demo

    out = tmp_path_factory.mktemp("demo")
    cfg = DemoConfig(n_per_class=10, hidden=100, train_epochs=1500, attack_steps=600)
    return run_demo(cfg, out=out, progress=False)


def _check_page(r: Rendered, name: str, shots: Path) -> None:
    (shots / f"{name}.png").write_bytes(r.screenshot)
    assert r.screenshot[:8] == b"\x89PNG\r\n\x1a\n"
    assert not r.console_errors, r.console_errors
    assert not r.requests, f"the report asked the network for {r.requests}"
    assert r.images > 0 and r.images_loaded == r.images, f"{r.images_loaded} of {r.images} images loaded"
    assert r.page_width <= r.view_width, f"page is {r.page_width} px wide in a {r.view_width} px window"
    wide = [t for t in r.tables if not t["fits"]]
    assert not wide, f"tables wider than the page: {[(t['caption'][:60], t['width'], t['room']) for t in wide]}"


def test_demo_report(demo, shots) -> None:
    r = render(demo.report)
    _check_page(r, "demo", shots)
    cal = demo.headline["calibrated"]
    n = demo.headline["n_train"]
    text = r.text
    assert f"{cal['count']} of {n} training images reconstructed at SSIM > {cal['threshold']:.3f}" in text
    assert f"{cal['heldout']} of {n}" in text  # the held-out null beside it
    assert "converged: relative residual" in text
    assert "digits / odd-even" in text and "Target (what was attacked)" in text
    # the configuration is collapsed at the end, not a wall of JSON at the top
    assert text.index("Configuration (run.json") > text.index("Tables")
    assert '"lr_x"' not in text


def test_unconverged_single_run_report(demo, tmp_path, shots) -> None:
    from datarecon.cli.main import main

    run = tmp_path / "one-step"
    assert main(["reconstruct", "--model", str(demo.model_dir), "--out", str(run), "--steps", "1",
                 "--no-progress"]) == 0
    assert main(["evaluate", str(run), "--no-progress"]) == 0
    assert main(["report", str(run), "--out", str(tmp_path / "one-step.html")]) == 0
    r = render(tmp_path / "one-step.html")
    _check_page(r, "single-run", shots)
    assert "NOT converged" in r.text
    assert "training images reconstructed at SSIM >" in r.text


def test_reproduction_report(haim_smoke, shots) -> None:
    out, _ = haim_smoke
    r = render(out / "report.html")
    _check_page(r, "haim2022-smoke", shots)
    with open(out / "tables" / "haim.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert "SSIM > 0.4: held-out (null)" in r.text  # readable headers, not snake_case
    assert "count_heldout_gt_0.4" not in r.text
    for row in rows:
        assert row["dataset"] in r.text
    with open(out / "tables" / "privacy.csv", encoding="utf-8") as fh:
        priv = list(csv.DictReader(fh))
    if any(p["n_fake"] in ("0", "") or p["n_real"] in ("0", "") for p in priv):
        assert "not measurable: an AUC needs at least" in r.text  # and says what would make it measurable
    assert "(held-out null " in r.text  # the headline count beside its null
    assert "sorted_ssim.png" not in r.text  # captions say what a figure shows, not its file name


def test_own_model_report(tmp_path, shots) -> None:
    """A user's own model evaluated from tensors (the README's bring-your-own-model form): the cards say
    what is not recorded instead of "? / ?", the headline stands beside its null."""
    import torch
    from torch import nn

    from datarecon.attacks.base import Target
    from datarecon.data import DataSpec, load_task
    from datarecon.evaluation import RunRecord, evaluation_of
    from datarecon.experiments.reconstruct import RunOptions, reconstruct
    from datarecon.report import render_report

    task = load_task(DataSpec(dataset="digits", task="odd-even", n_per_class=5))
    x, y = task.train.x.double(), task.train.y.double()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32, bias=False), nn.ReLU(), nn.Linear(32, 1, bias=False)).double()
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    for _ in range(200):
        opt.zero_grad()
        nn.functional.softplus(-y * net(x)[:, 0]).mean().backward()
        opt.step()
    target = Target.from_module(net, loss="logistic", input_shape=(1, 8, 8), value_range=(0.0, 1.0))
    run = {"attack": {"method": "kkt", "steps": 100, "lr_x": 0.01, "lr_lambda": 0.01, "lambda_min": 0.2},
           "init": {"name": "gaussian", "scale": 0.05}, "candidates": 20}
    rec = reconstruct(target, run, tmp_path / "own", RunOptions(progress=False))
    ev = evaluation_of(rec.x, train=task.train.x, heldout=task.heldout.x, noise=10, record=RunRecord(scores=rec.scores))
    out = render_report([ev], out=tmp_path / "own.html")
    r = render(out)
    _check_page(r, "own-model", shots)
    assert "evaluated from tensors" in r.text and "? / ?" not in r.text and "None" not in r.text
    assert "(held-out null " in r.text and "Can the attacker tell which candidates match a training image?" in r.text


def test_membership_report(tmp_path, shots) -> None:
    """A membership folder as an audit report: the headline beside the loss threshold, the epsilon bound, the log-log
    ROC, the score histograms and the most exposed training images load, and every figure names its split."""
    from datarecon.cli.main import main

    model, folder = tmp_path / "model", tmp_path / "m"
    assert main(["train", "--dataset", "digits", "--task", "all", "--n-per-class", "3", "--n-heldout-per-class", "6",
                 "--hidden", "64", "--loss", "cross-entropy", "--lr", "0.5", "--epochs", "200", "--dtype", "float64",
                 "--no-progress", "--out", str(model)]) == 0
    assert main(["membership", "--model", str(model), "--evaluate", "--nonmembers", "300", "--population", "100",
                 "--references", "8", "--no-progress", "--out", str(folder)]) == 0
    assert main(["report", str(folder), "--out", str(tmp_path / "membership.html")]) == 0
    r = render(tmp_path / "membership.html")
    _check_page(r, "membership", shots)
    assert r.images == 3
    text = r.text
    assert "Membership: the strongest signal beside the loss threshold" in text and "Empirical epsilon" in text
    assert "ROC of every signal on log-log axes" in text and "Score of the members and of the non-members" in text
    assert "the half-in pool (30 members, 30 non-members)" in text and "scores highest" in text
