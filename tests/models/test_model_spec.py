"""Architecture specs: parameter counts and homogeneity."""

from __future__ import annotations

import pytest
import torch

from datarecon.errors import DataReconError
from datarecon.models.spec import ArchSpec, build_model, count_parameters, is_homogeneous

CIFAR = (3, 32, 32)


@pytest.mark.parametrize(("spec", "expected"), [
    pytest.param(ArchSpec(name="one-hidden", input_shape=CIFAR, hidden=(6144,)), 18_886_657, id="one-hidden-6144"),
    pytest.param(ArchSpec(name="mlp", input_shape=CIFAR, hidden=(1000, 1000), bias=False), 4_073_000,
                 id="mlp-1000-1000-nobias"),
    pytest.param(ArchSpec(name="affine", input_shape=CIFAR), 3073, id="affine"),
    pytest.param(ArchSpec(name="mlp", input_shape=CIFAR, num_outputs=10), 4_084_010, id="mlp-decoreco-10"),
])
def test_count_parameters_paper_sizes(spec: ArchSpec, expected: int) -> None:
    assert count_parameters(spec) == expected


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name,hidden", [("affine", None), ("one-hidden", (7,)), ("mlp", (5, 4, 3))],
                         ids=["affine", "one-hidden", "mlp"])
def test_count_matches_built_model(name: str, hidden, bias: bool) -> None:
    spec = ArchSpec(name=name, input_shape=(2, 3, 3), num_outputs=3, hidden=hidden, bias=bias)
    model = build_model(spec, generator=torch.Generator().manual_seed(0))
    assert sum(p.numel() for p in model.parameters()) == count_parameters(spec)
    assert model(torch.zeros(4, 2, 3, 3)).shape == (4, 3)


def test_default_width_of_one_hidden_is_6144() -> None:
    spec = ArchSpec(name="one-hidden", input_shape=CIFAR)
    assert spec.resolved_hidden() == (6144,)
    assert count_parameters(spec) == 18_886_657


def test_bias_free_mlp_is_positively_homogeneous() -> None:
    spec = ArchSpec(name="mlp", input_shape=(1, 4, 4), hidden=(9, 7), bias=False)
    assert is_homogeneous(spec)
    model = build_model(spec, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x = torch.randn(5, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for c in (0.5, 3.0, 1e-3):
        torch.testing.assert_close(model(c * x), c * model(x), rtol=1e-12, atol=1e-15)
    # degree L = 3 in the parameters: Φ(cθ; x) = c^3 Φ(θ; x)
    scaled = build_model(spec, dtype=torch.float64)
    scaled.load_state_dict({k: 2.0 * v for k, v in model.state_dict().items()})
    torch.testing.assert_close(scaled(x), 8.0 * model(x), rtol=1e-12, atol=1e-15)


def test_biased_mlp_is_not_homogeneous() -> None:
    spec = ArchSpec(name="mlp", input_shape=(1, 4, 4), hidden=(9,), bias=True)
    assert not is_homogeneous(spec)
    model = build_model(spec, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x = torch.randn(5, 1, 4, 4, dtype=torch.float64)
    assert not torch.allclose(model(3.0 * x), 3.0 * model(x))


def test_same_seed_same_weights_and_init_scale() -> None:
    spec = ArchSpec(name="mlp", input_shape=(1, 4, 4), hidden=(50,), bias=False, init_scale=1e-4)
    a = build_model(spec, generator=torch.Generator().manual_seed(3))
    b = build_model(spec, generator=torch.Generator().manual_seed(3))
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    first = a[1].weight
    assert 0.5e-4 < float(first.detach().std()) < 2e-4


def test_unknown_architecture_lists_valid_names() -> None:
    with pytest.raises(DataReconError, match=r"unknown architecture 'foo'; valid names: affine, cnn, mlp, one-hidden, resnet18, resnet8"):
        ArchSpec(name="foo")


def test_fixed_depth_architecture_refuses_other_depths() -> None:
    with pytest.raises(DataReconError, match="has 1 hidden layer"):
        build_model(ArchSpec(name="one-hidden", input_shape=(1, 2, 2), hidden=(3, 3)))


# --- the cnn architecture ------------------------------------------------------------------


def test_cnn_parameter_count_hand_computed():
    """3x32x32, channels 32-64, kernel 3, stride 2: 32->16->8; conv 3*32*9 + 32*64*9, read-out 64*8*8."""
    from datarecon.models.spec import count_parameters

    spec = ArchSpec(name="cnn", input_shape=(3, 32, 32), num_outputs=1, hidden=(32, 64), bias=False)
    assert count_parameters(spec) == 3 * 32 * 9 + 32 * 64 * 9 + 64 * 8 * 8 == 23392
    biased = spec.model_copy(update={"bias": True, "num_outputs": 10})
    assert count_parameters(biased) == 3 * 32 * 9 + 32 + 32 * 64 * 9 + 64 + 64 * 8 * 8 * 10 + 10
    # 28 -> 14 -> 7 with kernel 5 (padding 2)
    mnist = ArchSpec(name="cnn", input_shape=(1, 28, 28), hidden=(8,), kernel=5, bias=False)
    assert count_parameters(mnist) == 1 * 8 * 25 + 8 * 14 * 14


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("shape,kernel", [((3, 32, 32), 3), ((1, 28, 28), 5), ((1, 7, 9), 4)], ids=["cifar-k3", "mnist-k5", "odd-k4"])
def test_cnn_parameter_shapes_match_the_built_model(bias, shape, kernel):
    from datarecon.models.spec import count_parameters, parameter_shapes

    spec = ArchSpec(name="cnn", input_shape=shape, num_outputs=3, hidden=(4, 5), bias=bias, kernel=kernel)
    model = build_model(spec, generator=torch.Generator().manual_seed(0))
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == parameter_shapes(spec)
    assert count_parameters(spec) == sum(p.numel() for p in model.parameters())
    assert model(torch.zeros(2, *shape)).shape == (2, 3)


def test_cnn_seeded_init_and_kernel_only_for_cnn():
    from datarecon.errors import DataReconError

    spec = ArchSpec(name="cnn", input_shape=(1, 8, 8), hidden=(4,), bias=False, init_scale=1e-3)
    a, b = (build_model(spec, generator=torch.Generator().manual_seed(1)) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert float(a[0].weight.std()) == pytest.approx(1e-3, rel=0.5)
    with pytest.raises(DataReconError, match="kernel applies to convolutional architectures"):
        build_model(ArchSpec(name="mlp", input_shape=(1, 8, 8), hidden=(4,), kernel=3))
    with pytest.raises(DataReconError, match="needs image inputs"):
        build_model(ArchSpec(name="cnn", input_shape=(64,), hidden=(4,)))


def test_unset_kernel_keeps_training_config_hashes():
    """Adding the kernel field changed no existing config hash (stored models stay valid)."""
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig
    from datarecon.utils.io import config_hash

    cfg = TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=5))
    data = cfg.model_dump(mode="json", exclude={"device", "checkpoint_every", "kkt_score", "margin_ascent", "dp"})
    data["arch"].pop("kernel")
    assert cfg.hash() == config_hash(data)
    assert TrainConfig(data=cfg.data, arch=ArchConfig(name="cnn", kernel=5)).hash() != \
        TrainConfig(data=cfg.data, arch=ArchConfig(name="cnn")).hash()
