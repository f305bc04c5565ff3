"""SSIM / L2 / NCC against independent references (scikit-image, scipy, naive loops)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.ndimage import correlate1d

from datarecon.errors import DataReconError
from datarecon.evaluation import (
    WINDOWS,
    downsample2x,
    effective_window_size,
    l2_matrix,
    minmax_rescale,
    ncc_matrix,
    ssim_matrix,
    ssim_pairs,
    window_kernel,
)

skm = pytest.importorskip("skimage.metrics")


def _smooth(n, c, h, w, seed):
    """Structured images: blurred noise plus a gradient, in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, c, h, w, generator=g, dtype=torch.float64)
    k = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0], dtype=torch.float64)
    k = (k / k.sum())
    x = torch.nn.functional.conv2d(x.reshape(-1, 1, h, w), (k[:, None] * k[None, :])[None, None], padding=2)
    x = x.reshape(n, c, h, w) + torch.linspace(0, 0.5, w, dtype=torch.float64)
    lo = x.flatten(1).min(1).values.view(-1, 1, 1, 1)
    hi = x.flatten(1).max(1).values.view(-1, 1, 1, 1)
    return (x - lo) / (hi - lo)


def _sk(a, b, window):
    if window == "gaussian":
        return skm.structural_similarity(a.numpy(), b.numpy(), gaussian_weights=True, sigma=1.5,
                                         use_sample_covariance=False, data_range=1, channel_axis=0)
    return skm.structural_similarity(a.numpy(), b.numpy(), gaussian_weights=False, win_size=3,
                                     use_sample_covariance=False, data_range=1, channel_axis=0)


def _naive_ssim(a: np.ndarray, b: np.ndarray, k: np.ndarray) -> float:
    """Independent valid-window SSIM with a given 1-D kernel (scipy correlate + crop)."""
    pad = (len(k) - 1) // 2

    def f(x):
        y = correlate1d(correlate1d(x, k, axis=-1, mode="reflect"), k, axis=-2, mode="reflect")
        return y[..., pad:x.shape[-2] - pad, pad:x.shape[-1] - pad]

    mx, my = f(a), f(b)
    vx, vy, cxy = f(a * a) - mx**2, f(b * b) - my**2, f(a * b) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    s = (2 * mx * my + c1) * (2 * cxy + c2) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return float(s.mean(axis=(-1, -2)).mean())


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 28, 28)], ids=["cifar", "mnist"])
@pytest.mark.parametrize("window", ["gaussian", "box3"])
@pytest.mark.parametrize("kind", ["random", "structured"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_ssim_matches_skimage(shape, window, kind, dtype):
    n = 6
    if kind == "random":
        g = torch.Generator().manual_seed(1)
        a = torch.rand(n, *shape, generator=g, dtype=torch.float64)
        b = (a + 0.4 * torch.rand(n, *shape, generator=g, dtype=torch.float64)).clamp(0, 1)
    else:
        a = _smooth(n, *shape, seed=2)
        b = (0.7 * a + 0.3 * _smooth(n, *shape, seed=3))
    ours = ssim_pairs(a.to(dtype), b.to(dtype), window=window)
    assert ours.dtype == dtype and ours.shape == (n,)
    ref = np.array([_sk(a[i], b[i], window) for i in range(n)])
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    np.testing.assert_allclose(ours.double().numpy(), ref, atol=tol)


def test_ssim_small_images_fallback_window():
    """8x8 digits: the Gaussian window shrinks to 7x7 (sigma 1.5), checked against scipy."""
    assert effective_window_size("gaussian", 8, 8) == 7
    assert effective_window_size("gaussian", 6, 9) == 5
    assert effective_window_size("gaussian", 32, 32) == 11
    a = _smooth(4, 1, 8, 8, seed=5)
    b = _smooth(4, 1, 8, 8, seed=6)
    k = window_kernel("gaussian", 8, 8).numpy()
    assert k.shape == (7,) and abs(k.sum() - 1) < 1e-12
    ours = ssim_pairs(a, b)
    ref = [_naive_ssim(a[i].numpy(), b[i].numpy(), k) for i in range(4)]
    np.testing.assert_allclose(ours.numpy(), ref, atol=1e-12)


def test_identical_images_give_one_and_inputs_untouched():
    a = _smooth(3, 3, 32, 32, seed=0).float()
    before = a.clone()
    s = ssim_pairs(a, a)
    torch.testing.assert_close(s, torch.ones(3), atol=1e-5, rtol=0)
    assert torch.equal(a, before)


def test_ssim_matrix_equals_pairs_and_chunking():
    c = _smooth(7, 3, 16, 16, seed=1)
    r = _smooth(5, 3, 16, 16, seed=2)
    full = ssim_matrix(c, r, chunk=3)
    assert full.shape == (7, 5)
    for i in range(7):
        torch.testing.assert_close(full[i], ssim_pairs(c[i:i + 1].expand(5, -1, -1, -1), r))
    torch.testing.assert_close(full, ssim_matrix(c, r, chunk=10_000))


def test_l2_and_ncc_match_naive():
    c = _smooth(4, 3, 8, 8, seed=1)
    r = _smooth(3, 3, 8, 8, seed=2)
    l2 = l2_matrix(c, r)
    ncc = ncc_matrix(c, r)
    for i in range(4):
        for j in range(3):
            assert abs(float(l2[i, j]) - float((c[i] - r[j]).norm())) < 1e-10
            za = (c[i] - c[i].mean((1, 2), keepdim=True)) / c[i].std((1, 2), unbiased=False, keepdim=True)
            zb = (r[j] - r[j].mean((1, 2), keepdim=True)) / r[j].std((1, 2), unbiased=False, keepdim=True)
            assert abs(float(ncc[i, j]) - float((za * zb).mean())) < 1e-10
    torch.testing.assert_close(torch.diagonal(ncc_matrix(c, c)), torch.ones(4, dtype=torch.float64))
    assert float(l2_matrix(c.float(), c.float()).diagonal().abs().max()) < 1e-6


def test_downsample_and_minmax():
    x = torch.arange(16.0).view(1, 1, 4, 4) / 15
    d = downsample2x(x)
    assert d.shape == (1, 1, 2, 2)
    assert abs(float(d[0, 0, 0, 0]) - float(x[0, 0, :2, :2].mean())) < 1e-7
    y = torch.stack([torch.full((1, 2, 2), 0.3), torch.tensor([[[2.0, -1.0], [0.5, 0.0]]])])
    z = minmax_rescale(y)
    assert torch.equal(z[0], torch.zeros(1, 2, 2))
    assert float(z[1].min()) == 0.0 and float(z[1].max()) == 1.0


def test_window_registry_and_errors():
    assert {"gaussian", "box3"} <= set(WINDOWS.names())
    with pytest.raises(DataReconError, match="valid names: box3, box7, gaussian"):
        ssim_pairs(torch.rand(1, 1, 8, 8), torch.rand(1, 1, 8, 8), window="nope")
    with pytest.raises(DataReconError, match="different image shapes"):
        ssim_matrix(torch.rand(1, 1, 8, 8), torch.rand(1, 3, 8, 8))
    with pytest.raises(DataReconError, match=r"\(N, C, H, W\)"):
        ssim_pairs(torch.rand(8, 8), torch.rand(8, 8))
    with pytest.raises(DataReconError, match="NaN"):
        l2_matrix(torch.full((1, 1, 2, 2), float("nan")), torch.rand(1, 1, 2, 2))


def test_local_ncc_matches_scipy():
    from scipy.ndimage import uniform_filter

    from datarecon.evaluation import local_ncc_matrix, local_standardise

    a = _smooth(3, 2, 12, 12, seed=7)
    b = _smooth(4, 2, 12, 12, seed=8)
    z = local_standardise(a, size=5).numpy()
    x = a.numpy()
    mu = uniform_filter(x, size=(1, 1, 5, 5), mode="nearest")
    var = np.clip(uniform_filter(x * x, size=(1, 1, 5, 5), mode="nearest") - mu**2, 0, None)
    np.testing.assert_allclose(z, (x - mu) / np.sqrt(var + 0.03**2), atol=1e-10)
    mat = local_ncc_matrix(a, b, size=5)
    zb = local_standardise(b, size=5)
    for i in range(3):
        for j in range(4):
            assert abs(float(mat[i, j]) - float((local_standardise(a, size=5)[i] * zb[j]).mean())) < 1e-10
    assert local_ncc_matrix(torch.rand(2, 1, 3, 3), torch.rand(2, 1, 3, 3)).shape == (2, 2)
