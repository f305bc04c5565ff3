"""Bring your own model: Target.from_module's checks, measured homogeneity, safe weight loading."""

from __future__ import annotations

from dataclasses import replace

import warnings

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from datarecon.attacks.base import Target
from datarecon.errors import CheckpointError, DataReconError
from datarecon.models.byom import check_loss, load_factory, load_weights, measure_homogeneity
from datarecon.models.spec import ARCHITECTURES, ArchSpec, build_model, is_homogeneous


def _params(net: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in net.named_parameters()}


def _naive_ratio(net: nn.Module, c: float, shape: tuple[int, ...]) -> tuple[float, int]:
    """Independent reference: Φ(x; cθ) vs c^L Φ(x; θ) with the weights scaled in place on a float64 copy
    (the same random inputs as ``measure_homogeneity``'s defaults: 4 uniform images, seed 0)."""
    import copy

    x = torch.rand(4, *shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = copy.deepcopy(net).double().eval()
    b = copy.deepcopy(a)
    with torch.no_grad():
        for p in b.parameters():
            p.mul_(c)
    degree = sum(1 for m in a.modules() if not list(m.children()) and list(m.parameters(recurse=False)))
    with torch.no_grad():
        return float(((b(x) - c ** degree * a(x)).norm() / (c ** degree * a(x)).norm())), degree


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64, bias=False)
        self.b = nn.Linear(64, 1, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.b(self.relu(self.a(x)) + x)


def _trained_bn() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                        nn.Linear(4 * 6 * 6, 1, bias=False))
    net(torch.randn(16, 1, 8, 8) * 3 + 1)  # running statistics away from (0, 1)
    with torch.no_grad():
        net[1].bias.normal_()
    return net


CASES = {
    "mlp-no-bias": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 8, bias=False), nn.ReLU(),
                                          nn.Linear(8, 1, bias=False)), None),
    "cnn-no-bias": (lambda: build_model(ArchSpec(name="cnn", input_shape=(1, 8, 8), hidden=(4, 4), bias=False)), None),
    "leaky-relu": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 8, bias=False), nn.LeakyReLU(0.1),
                                         nn.Linear(8, 1, bias=False)), None),
    "mlp-bias": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 1)),
                 r"^3 \(Linear\): it has a bias"),
    "tanh": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 8, bias=False), nn.Tanh(), nn.Linear(8, 1, bias=False)),
             r"^2 \(Tanh\): this activation is not positively homogeneous"),
    "batchnorm": (_trained_bn, r"^1 \(BatchNorm2d\): a normalisation layer"),
    "residual": (_Residual, r"^b \(Linear\): its output does not scale"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_homogeneity_is_measured_and_names_the_first_break(case):
    make, pattern = CASES[case]
    torch.manual_seed(1)
    net = make()
    h = measure_homogeneity(net, _params(net), (1, 8, 8))
    ratio, degree = _naive_ratio(net, 2.0, (1, 8, 8))
    assert h.degree == degree
    assert h.rel_error == pytest.approx(ratio, rel=1e-6, abs=1e-12)  # agrees with the naive reference
    assert h.homogeneous is (pattern is None)
    if pattern is None:
        assert ratio < 1e-10 and h.first_break is None
    else:
        assert ratio > 1e-3
        import re

        assert re.search(pattern, h.first_break), h.first_break


@pytest.mark.parametrize("name", ARCHITECTURES.names())
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_spec_homogeneity_claim_matches_the_measurement(name, bias):
    """is_homogeneous(spec) (trusted for model directories) agrees with the measurement, the affine model
    with a bias included: Wx + b is homogeneous of degree 1 in θ = (W, b), the property the KKT
    derivation needs."""
    hidden = {"affine": (), "one-hidden": (6,)}.get(name, (4, 4))
    spec = ArchSpec(name=name, input_shape=(1, 8, 8), hidden=hidden, bias=bias)
    net = build_model(spec, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for p in net.parameters():
            if p.ndim == 1:
                p.normal_()  # nonzero biases
    measured = measure_homogeneity(net, _params(net), (1, 8, 8)).homogeneous
    assert measured is is_homogeneous(spec)


def test_from_module_builds_a_checked_target_without_touching_the_module():
    net = _trained_bn()
    net.train()
    with pytest.warns(UserWarning) as record:
        t = Target.from_module(net, loss="logistic", input_shape=(1, 8, 8), value_range=(-0.5, 0.5))
    messages = " | ".join(str(w.message) for w in record)
    assert "BatchNorm layers (1)" in messages and "first break: 1 (BatchNorm2d)" in messages
    assert net.training and not t.model.training  # the user's module is unchanged; the target's copy is in eval
    assert t.num_outputs == 1 and t.value_range == (-0.5, 0.5) and not t.homogeneous
    prior = t.prior(6)
    assert prior.lower == -0.5 and prior.upper == 0.5 and prior.labels.tolist() == [1, 1, 1, -1, -1, -1]


def test_functional_relu_warning_kept():
    class F(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(64, 8, bias=False), nn.Linear(8, 1, bias=False)

        def forward(self, x):
            return self.b(torch.relu(self.a(x.flatten(1))))

    with pytest.warns(UserWarning, match="applies ReLU as a function"):
        t = Target.from_module(F(), loss="logistic", input_shape=(1, 8, 8))
    assert t.homogeneous


def _flat() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 1, bias=False), nn.Flatten(0))


class _IntParam(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(64, 1, dtype=torch.int64), requires_grad=False)

    def forward(self, x):
        return x.flatten(1) @ self.w.to(x.dtype)


class _Tuple(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 1, bias=False)

    def forward(self, x):
        return self.lin(x.flatten(1)), 0


@pytest.mark.parametrize(("make", "kwargs", "message"), [
    (_flat, {}, "returns shape (m,) = (2,) for m = 2 inputs; attacks need (m, 1)"),
    (lambda: nn.Sequential(nn.Linear(8, 3, bias=False)), {}, "returns shape (2, 1, 8, 3) for 2 inputs"),
    (_IntParam, {}, "parameter 'w' has dtype int64"),
    (_Tuple, {}, "returns tuple, not a tensor"),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 1)), {"input_shape": (1, 9, 9)}, "forward fails on inputs"),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), {}, "loss 'logistic' does not fit a model with 3 output(s)"),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), {"loss": "cross-entropy", "labels": 4},
     "4 labels do not fit a model with 3 output(s)"),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 1)), {"loss": "nope"}, "unknown loss"),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 1)), {"value_range": (1.0, 0.0)}, "lower < upper"),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 1)), {"loss": lambda out: out.sum()}, "must take two arguments"),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 1)), {"loss": lambda out, y: out * y[:, None]},
     "(take the mean over samples)"),
], ids=["flat-output", "extra-dims", "int-param", "tuple-output", "wrong-input-shape", "loss-misfit", "labels-misfit",
        "unknown-loss", "bad-range", "loss-one-arg", "loss-not-scalar"])
def test_from_module_bad_input_one_line(make, kwargs, message):
    args = {"loss": "logistic", "input_shape": (1, 8, 8), **kwargs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DataReconError) as info:
            Target.from_module(make(), **args)
    text = str(info.value)
    assert message in text and "\n" not in text


def test_callable_loss_matches_the_named_loss_in_gradnorm():
    """gradnorm with the user's callable equals gradnorm with the registered loss it implements."""
    from datarecon.attacks.base import ATTACK_LOOP, ATTACKS, AttackSetup
    from datarecon.attacks.runner import run_attack
    from datarecon.experiments.reconstruct import method_config

    def logistic(out, y):
        return nn.functional.softplus(-y.to(out.dtype) * out[:, 0]).mean()

    torch.manual_seed(0)
    net = build_model(ArchSpec(name="cnn", input_shape=(1, 8, 8), hidden=(3,), bias=False)).double()
    check_loss(logistic, 1)
    runs = []
    for loss in ("logistic", logistic):
        t = Target.from_module(net, loss=loss, input_shape=(1, 8, 8))
        attack = ATTACKS.get("gradnorm").from_config(method_config("gradnorm", {"steps": 3, "dtype": "float64"}))
        x0 = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        setup = AttackSetup(t, t.prior(4), x0, torch.Generator().manual_seed(2))
        runs.append(run_attack(attack, setup, loop=replace(ATTACK_LOOP, progress=False)))
    assert torch.equal(runs[0].x, runs[1].x)
    assert runs[0].history[-1]["residual"] == runs[1].history[-1]["residual"]


def test_load_weights_names_the_first_mismatch(tmp_path):
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 8, bias=False), nn.ReLU(), nn.Linear(8, 1, bias=False))
    good = {k: v.clone() for k, v in net.state_dict().items()}
    save_file(good, str(tmp_path / "ok.safetensors"))
    params = load_weights(net, tmp_path / "ok.safetensors")
    assert set(params) == {"1.weight", "3.weight"}
    save_file({**good, "3.weight": torch.zeros(2, 8)}, str(tmp_path / "shape.safetensors"))
    with pytest.raises(DataReconError, match=r"tensor '3.weight' has shape \(2, 8\), the model expects \(1, 8\)"):
        load_weights(net, tmp_path / "shape.safetensors")
    save_file({**good, "extra": torch.zeros(1)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(DataReconError, match="unexpected tensor 'extra'"):
        load_weights(net, tmp_path / "extra.safetensors")
    save_file({**good, "1.weight": torch.zeros(8, 64, dtype=torch.int32)}, str(tmp_path / "int.safetensors"))
    with pytest.raises(DataReconError, match="expects floats"):
        load_weights(net, tmp_path / "int.safetensors")
    torch.save(good, tmp_path / "w.pt")
    with pytest.raises(CheckpointError, match="pickle"):
        load_weights(net, tmp_path / "w.pt")


def test_load_factory_errors():
    assert load_factory("torch.nn:Identity") is nn.Identity
    for spec, message in (("torch.nn", "neither a model directory nor"), ("no_such_mod:f", "cannot import module"),
                          ("torch.nn:Nope", "has no 'Nope'")):
        with pytest.raises(DataReconError, match=message):
            load_factory(spec)
