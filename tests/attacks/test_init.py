"""Initialisations: shapes, ranges, the mixing formula, determinism, misuse errors."""

from __future__ import annotations

import pytest
import torch

from datarecon.attacks.init import CandidateSpec, INITS, InitSources, init_labels, make_init, mix_formula
from datarecon.errors import DataReconError

SHAPE = (1, 4, 4)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _sources(n=6):
    g = _gen(99)
    return InitSources(ground_truth=torch.rand(n, *SHAPE, generator=g, dtype=torch.float64) - 0.5,
                       ground_truth_labels=torch.tensor([1.0, 1, 1, -1, -1, -1][:n]),
                       partition=torch.rand(n, *SHAPE, generator=g, dtype=torch.float64) - 0.5,
                       partition_labels=torch.tensor([1.0, 1, 1, -1, -1, -1][:n]))


def test_registry_names():
    assert INITS.names() == ["gaussian", "ground-truth", "mix", "partition", "uniform", "unmix"]


def test_uniform_is_display_space_minus_mean():
    mean = torch.full(SHAPE, 0.3)
    x = make_init("uniform", CandidateSpec(m=200, input_shape=SHAPE, mean=mean), generator=_gen())
    assert x.shape == (200, *SHAPE) and x.dtype == torch.float64
    disp = x + mean.double()
    assert disp.min() >= 0 and disp.max() <= 1 and 0.4 < disp.mean() < 0.6


def test_gaussian_scale_in_model_space():
    x = make_init("gaussian", CandidateSpec(m=500, input_shape=SHAPE, mean=torch.full(SHAPE, 0.3)),
                  generator=_gen(), scale=1e-3)
    assert abs(x.mean().item()) < 1e-4 and x.std().item() == pytest.approx(1e-3, rel=0.05)


@pytest.mark.parametrize("name", ["uniform", "gaussian", "mix"])
def test_deterministic_by_seed(name):
    spec, s = CandidateSpec(m=6, input_shape=SHAPE, mean=0.2), _sources()
    a = make_init(name, spec, generator=_gen(5), sources=s)
    b = make_init(name, spec, generator=_gen(5), sources=s)
    c = make_init(name, spec, generator=_gen(6), sources=s)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_ground_truth_and_partition_copy_sources():
    s = _sources()
    x = make_init("ground-truth", CandidateSpec(m=6, input_shape=SHAPE), generator=_gen(), sources=s)
    assert torch.equal(x, s.ground_truth) and x.data_ptr() != s.ground_truth.data_ptr()
    assert torch.equal(make_init("partition", CandidateSpec(m=6, input_shape=SHAPE),
                                 generator=_gen(), sources=s), s.partition)


@pytest.mark.parametrize("l1,l2", [(0.0, 0.0), (1.0, 1.0), (0.25, 0.75), (0.5, 0.5), (0.0, 1.0), (1.0, 0.25)])
def test_mix_formula(l1, l2):
    s = _sources()
    mean = 0.1
    x = make_init("mix", CandidateSpec(m=6, input_shape=SHAPE, mean=mean), generator=_gen(3), sources=s, l1=l1, l2=l2)
    rnd = make_init("uniform", CandidateSpec(m=6, input_shape=SHAPE, mean=mean), generator=_gen(3))
    ref = l2 * (l1 * s.ground_truth + (1 - l1) * s.partition) + (1 - l2) * rnd
    torch.testing.assert_close(x, ref, rtol=0, atol=1e-15)
    torch.testing.assert_close(mix_formula(s.ground_truth, s.partition, rnd, l1=l1, l2=l2), ref)


def test_mix_pure_noise_needs_no_sources():
    x = make_init("mix", CandidateSpec(m=3, input_shape=SHAPE), generator=_gen(), l1=0.5, l2=0.0)
    assert x.shape == (3, *SHAPE)


def test_count_policy():
    s = _sources(6)
    with pytest.raises(DataReconError, match="4 candidates but 6 ground-truth images"):
        make_init("ground-truth", CandidateSpec(m=4, input_shape=SHAPE), generator=_gen(), sources=s)
    x = make_init("ground-truth", CandidateSpec(m=8, input_shape=SHAPE), generator=_gen(), sources=s, count="cycle")
    assert torch.equal(x[6], s.ground_truth[0])
    lab = init_labels("ground-truth", m=8, sources=s, count="cycle")
    assert lab.tolist() == [1, 1, 1, -1, -1, -1, 1, 1]


def test_labels_follow_the_images_used():
    s = _sources()
    assert init_labels("uniform", m=6, sources=s) is None
    assert torch.equal(init_labels("partition", m=6, sources=s), s.partition_labels)
    assert init_labels("mix", m=6, sources=s, l1=0.5, l2=0.0) is None


def test_misuse_errors():
    with pytest.raises(DataReconError, match="unknown initialisation 'zeros'; valid names: gaussian, ground-truth"):
        make_init("zeros", CandidateSpec(m=2, input_shape=SHAPE), generator=_gen())
    with pytest.raises(DataReconError, match="candidate count must be at least 1"):
        make_init("uniform", CandidateSpec(m=0, input_shape=SHAPE), generator=_gen())
    with pytest.raises(DataReconError, match="needs ground-truth images"):
        make_init("ground-truth", CandidateSpec(m=2, input_shape=SHAPE), generator=_gen())
    with pytest.raises(DataReconError, match="invalid parameters of init 'gaussian': sigma"):
        make_init("gaussian", CandidateSpec(m=2, input_shape=SHAPE), generator=_gen(), sigma=2.0)
    with pytest.raises(DataReconError, match="l1"):
        make_init("mix", CandidateSpec(m=2, input_shape=SHAPE), generator=_gen(), l1=1.5)
    bad = InitSources(ground_truth=torch.zeros(2, 3, 4, 4))
    with pytest.raises(DataReconError, match="the model takes"):
        make_init("ground-truth", CandidateSpec(m=2, input_shape=SHAPE), generator=_gen(), sources=bad)
    s = _sources()
    swapped = InitSources(ground_truth=s.ground_truth, ground_truth_labels=s.ground_truth_labels,
                          partition=s.partition, partition_labels=-s.partition_labels)
    with pytest.raises(DataReconError, match="different labels"):
        make_init("mix", CandidateSpec(m=6, input_shape=SHAPE), generator=_gen(), sources=swapped, l1=0.5, l2=0.5)
