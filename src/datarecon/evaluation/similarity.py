"""Image similarity in display space: SSIM, L2, NCC, and helpers.

All functions are pure: they never modify or reorder their inputs. Images are
float tensors of shape ``(N, C, H, W)`` in display space (values in ``[0, 1]``,
see ``docs/dev/CONTRACTS.md``).

SSIM follows Wang et al. (2004) exactly as scikit-image computes it with
``structural_similarity(a, b, gaussian_weights=True, sigma=1.5,
use_sample_covariance=False, data_range=1, channel_axis=0)``: local statistics
under a separable window, *valid* filtering (the border of half a window is
cropped, as scikit-image does), the SSIM map averaged over the cropped area and
then over channels. Other implementations (torchmetrics, kornia) pad and
average over the whole image, which changes values by ~0.1 on 32x32 images
(METHODS.md section 7), so always state the window.

Windows live in :data:`WINDOWS` (a :class:`~datarecon.registry.Registry`):

* ``"gaussian"`` (default): Gaussian, sigma 1.5, 11x11 (scikit-image's
  ``truncate=3.5``). **Small images:** if the image side is smaller than 11
  (e.g. 8x8 digits), the window shrinks to the largest odd size not above the
  smaller side, keeping sigma 1.5 and renormalising (this equals scikit-image
  with ``truncate=((size - 1) / 2) / 1.5``; scikit-image itself refuses).
* ``"box3"``: uniform 3x3 window, the reference code's choice (equals
  scikit-image with ``gaussian_weights=False, win_size=3,
  use_sample_covariance=False``). It gives much higher values on small images.
* ``"box7"``: uniform 7x7 (scikit-image's default size).

References:
    Wang, Bovik, Sheikh, Simoncelli (2004), "Image quality assessment: from
    error visibility to structural similarity", eq. 13; Haim et al. (2022),
    evaluation protocol (NCC on 2x-downsampled images, min-max rescale).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from datarecon.errors import DataReconError
from datarecon.kernel.engine import track
from datarecon.registry import Registry

__all__ = [
    "WINDOWS",
    "Window",
    "effective_window_size",
    "window_kernel",
    "ssim_pairs",
    "ssim_matrix",
    "l2_matrix",
    "ncc_matrix",
    "local_ncc_matrix",
    "local_standardise",
    "standardise",
    "downsample2x",
    "minmax_rescale",
    "check_images",
]

#: Default number of image pairs processed at once by the SSIM routines
#: (each pair holds ~5 float images of C*H*W values; 2048 CIFAR pairs ~ 120 MB).
DEFAULT_CHUNK = 2048

K1 = 0.01
K2 = 0.03


@dataclass(frozen=True)
class Window:
    """A separable SSIM window.

    Attributes:
        kind: ``"gaussian"`` or ``"uniform"``.
        size: Nominal odd side length.
        sigma: Standard deviation for Gaussian windows (ignored for uniform).
    """

    kind: str
    size: int
    sigma: float = 1.5


WINDOWS: Registry[Window] = Registry("SSIM window")
WINDOWS.register("gaussian", Window("gaussian", 11, 1.5))
WINDOWS.register("box3", Window("uniform", 3))
WINDOWS.register("box7", Window("uniform", 7))


def _resolve_window(window: str | Window) -> Window:
    return WINDOWS.get(window) if isinstance(window, str) else window


def effective_window_size(window: str | Window, height: int, width: int) -> int:
    """Side of the window actually used for ``height x width`` images.

    The nominal size, or, for images smaller than it, the largest odd size not
    above ``min(height, width)``.

    Raises:
        DataReconError: images smaller than 1 pixel on a side.
    """
    w = _resolve_window(window)
    side = min(height, width)
    if side < 1:
        raise DataReconError(f"images of size {height}x{width} are too small for SSIM")
    size = w.size
    if side < size:
        size = side if side % 2 == 1 else side - 1
    return size


def window_kernel(window: str | Window, height: int, width: int,
                  *, dtype: torch.dtype = torch.float64) -> Tensor:
    """The 1-D window (its outer product is the 2-D window), summing to one.

    Args:
        window: Registry name or :class:`Window`.
        height, width: Image size (selects the small-image fallback).
        dtype: Output dtype.

    Returns:
        Tensor ``(k,)`` with ``k = effective_window_size(window, height, width)``.
    """
    w = _resolve_window(window)
    size = effective_window_size(w, height, width)
    if w.kind == "uniform":
        return torch.full((size,), 1.0 / size, dtype=dtype)
    if w.kind == "gaussian":
        coords = torch.arange(size, dtype=torch.float64) - (size // 2)
        g = torch.exp(-0.5 * coords**2 / w.sigma**2)
        return (g / g.sum()).to(dtype)
    raise DataReconError(f"unknown window kind {w.kind!r}; use 'gaussian' or 'uniform'")


def _band(n: int, k: Tensor) -> Tensor:
    """Matrix ``(n - len(k) + 1, n)`` applying ``k`` as a valid correlation."""
    ks = k.shape[0]
    out = n - ks + 1
    m = torch.zeros(out, n, dtype=k.dtype)
    for i in range(out):
        m[i, i:i + ks] = k
    return m


class _Filter:
    """Valid separable filtering by two banded matrix products."""

    def __init__(self, window: str | Window, height: int, width: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        k = window_kernel(window, height, width, dtype=torch.float64)
        self.size = k.shape[0]
        self.kh = _band(height, k).to(device=device, dtype=dtype)  # (H', H)
        self.kw = _band(width, k).t().contiguous().to(device=device, dtype=dtype)  # (W, W')

    def __call__(self, x: Tensor) -> Tensor:
        return torch.matmul(torch.matmul(self.kh, x), self.kw)


def check_images(x: Tensor, name: str = "images") -> Tensor:
    """Validate an image batch ``(N, C, H, W)`` and return it as a float tensor.

    Raises:
        DataReconError: wrong rank, or non-finite values.
    """
    if not isinstance(x, Tensor):
        raise DataReconError(f"{name} must be a torch.Tensor of shape (N, C, H, W), got {type(x).__name__}")
    if x.ndim != 4:
        raise DataReconError(f"{name} must have shape (N, C, H, W), got {tuple(x.shape)}")
    if not x.is_floating_point():
        x = x.to(torch.float32)
    if not bool(torch.isfinite(x).all()):
        raise DataReconError(f"{name} contain NaN or inf; clean or clamp them before evaluating")
    return x


def check_image_pair(a: Tensor, b: Tensor, names: tuple[str, str]) -> tuple[Tensor, Tensor]:
    """Two image batches checked (:func:`check_images`, ``names`` in the messages) and made comparable.

    Returns:
        ``a`` and ``b`` detached, in their promoted floating dtype.

    Raises:
        DataReconError: either batch is invalid, or their image shapes ``(C, H, W)`` differ.
    """
    a = check_images(a, names[0])
    b = check_images(b, names[1])
    if a.shape[1:] != b.shape[1:]:
        raise DataReconError(
            f"{names[0]} {tuple(a.shape[1:])} and {names[1]} {tuple(b.shape[1:])} have different image shapes"
        )
    dtype = torch.promote_types(a.dtype, b.dtype)
    return a.detach().to(dtype), b.detach().to(b.device, dtype)


def _ssim_from_stats(mu_x: Tensor, mu_y: Tensor, exx: Tensor, eyy: Tensor, exy: Tensor,
                     data_range: float) -> Tensor:
    """Mean SSIM per image from filtered first and second moments (..., C, h, w) -> (...)."""
    c1 = (K1 * data_range) ** 2
    c2 = (K2 * data_range) ** 2
    mxy = mu_x * mu_y
    mxx = mu_x * mu_x
    myy = mu_y * mu_y
    vx = exx - mxx
    vy = eyy - myy
    cxy = exy - mxy
    s = ((2 * mxy + c1) * (2 * cxy + c2)) / ((mxx + myy + c1) * (vx + vy + c2))
    return s.flatten(-3).mean(-1)  # mean over C, h, w == mean of per-channel means


def _stats(x: Tensor, filt: _Filter) -> tuple[Tensor, Tensor]:
    return filt(x), filt(x * x)


def ssim_index_pairs(a: Tensor, b: Tensor, pairs: tuple[Tensor, Tensor], *, window: str | Window,
                     data_range: float, chunk: int, progress: bool = False,
                     desc: str = "SSIM") -> Tensor:
    """SSIM of pairs ``(a[ia[t]], b[ib[t]])`` for t in range(len(ia)), in chunks; ``pairs = (ia, ib)``, two
    ``(T,)`` int64 index tensors into ``a`` and ``b``."""
    ia, ib = pairs
    _, _, h, w = a.shape
    filt = _Filter(window, h, w, a.dtype, a.device)
    mu_a, e_a = _stats(a, filt)
    mu_b, e_b = _stats(b, filt)
    n = ia.shape[0]
    out = torch.empty(n, dtype=a.dtype, device=a.device)

    for s in track(range(0, n, max(1, chunk)), desc=desc, unit="chunk", mode=progress):
        ja = ia[s:s + chunk]
        jb = ib[s:s + chunk]
        exy = filt(a[ja] * b[jb])
        out[s:s + chunk] = _ssim_from_stats(mu_a[ja], mu_b[jb], e_a[ja], e_b[jb], exy, data_range)
    return out


def ssim_pairs(a: Tensor, b: Tensor, *, window: str | Window = "gaussian", data_range: float = 1.0,
               chunk: int = DEFAULT_CHUNK) -> Tensor:
    """SSIM between ``a[i]`` and ``b[i]`` for every ``i``.

    Args:
        a, b: Images ``(N, C, H, W)`` in display space ``[0, 1]`` (same shape).
        window: Window name in :data:`WINDOWS` or a :class:`Window`.
        data_range: Dynamic range of the values (1 for display space).
        chunk: Pairs processed at once (bounds memory).

    Returns:
        Tensor ``(N,)`` in ``[-1, 1]`` (1 = identical), dtype of the inputs
        (float32 for integer inputs). Matches scikit-image to ~1e-6 in
        float32 and ~1e-12 in float64.
    """
    a, b = check_image_pair(a, b, ("a", "b"))
    if a.shape[0] != b.shape[0]:
        raise DataReconError(f"ssim_pairs needs equal batch sizes, got {a.shape[0]} and {b.shape[0]}")
    idx = torch.arange(a.shape[0], device=a.device)
    return ssim_index_pairs(a, b, (idx, idx), window=window, data_range=data_range, chunk=chunk)


def ssim_matrix(cands: Tensor, refs: Tensor, *, window: str | Window = "gaussian",
                data_range: float = 1.0, chunk: int = DEFAULT_CHUNK,
                progress: bool = False) -> Tensor:
    """All-pairs SSIM, computed in chunks of ``chunk`` pairs so memory stays bounded.

    Per-image filtered means and second moments are computed once; only the
    cross moment is filtered per pair. Cost is ``M * R`` filtered images (for
    large sets see docs/PERFORMANCE.md §4): prefer
    :func:`datarecon.evaluation.nearest_neighbours` with a prefilter.

    Args:
        cands: ``(M, C, H, W)`` in ``[0, 1]``.
        refs: ``(R, C, H, W)`` in ``[0, 1]``.
        window, data_range, chunk: See :func:`ssim_pairs`.
        progress: Show a tqdm progress bar.

    Returns:
        Tensor ``(M, R)``: ``out[i, j] = SSIM(cands[i], refs[j])``.
    """
    cands, refs = check_image_pair(cands, refs, ("candidates", "references"))
    m, r = cands.shape[0], refs.shape[0]
    if m == 0 or r == 0:
        return torch.empty(m, r, dtype=cands.dtype)
    flat = torch.arange(m * r, device=cands.device)
    ia = torch.div(flat, r, rounding_mode="floor")
    ib = flat - ia * r
    out = ssim_index_pairs(cands, refs, (ia, ib), window=window, data_range=data_range,
                           chunk=chunk, progress=progress, desc="all-pairs SSIM")
    return out.view(m, r)


def l2_matrix(cands: Tensor, refs: Tensor, *, dtype: torch.dtype = torch.float64) -> Tensor:
    """Euclidean distances between flattened images (``torch.cdist``).

    Computed in ``dtype`` (float64 by default, so identical images give ~0
    and not the ~1e-2 that float32 cancellation can produce).

    Args:
        cands: ``(M, C, H, W)``; refs: ``(R, C, H, W)``.

    Returns:
        Tensor ``(M, R)`` of distances >= 0 (lower = more similar).
    """
    cands, refs = check_image_pair(cands, refs, ("candidates", "references"))
    return torch.cdist(cands.flatten(1).to(dtype), refs.flatten(1).to(dtype))


def standardise(x: Tensor, *, eps: float = 1e-12) -> Tensor:
    """Per-image, per-channel standardisation: zero mean, unit (population) std.

    Constant channels become zeros. Returns a new tensor ``(N, C, H, W)``.
    """
    x = check_images(x)
    mu = x.mean(dim=(2, 3), keepdim=True)
    xc = x - mu
    sd = xc.pow(2).mean(dim=(2, 3), keepdim=True).sqrt()
    return torch.where(sd > eps, xc / sd.clamp_min(eps), torch.zeros_like(xc))


def ncc_matrix(cands: Tensor, refs: Tensor, *, dtype: torch.dtype = torch.float64) -> Tensor:
    """Normalised cross-correlation of all pairs by one matrix product.

    Each image is standardised per channel (:func:`standardise`); the NCC is
    the mean over ``C * H * W`` of the products, so identical images give 1
    and the value lies in ``[-1, 1]``.

    Args:
        cands: ``(M, C, H, W)``; refs: ``(R, C, H, W)``.

    Returns:
        Tensor ``(M, R)`` (higher = more similar).

    References:
        Haim et al. (2022), evaluation: NCC on 2x-downsampled images.
    """
    cands, refs = check_image_pair(cands, refs, ("candidates", "references"))
    d = cands[0].numel() if cands.shape[0] else refs[0].numel()
    za = standardise(cands.to(dtype)).flatten(1)
    zb = standardise(refs.to(dtype)).flatten(1)
    return (za @ zb.t()) / d


def local_standardise(x: Tensor, *, size: int = 7, c: float = 0.03**2) -> Tensor:
    """Standardise each pixel by its local mean and std (uniform ``size`` window, per channel).

    ``z = (x - μ_local) / sqrt(σ²_local + c)`` with replicate padding; ``c``
    is SSIM's contrast constant, so flat regions give ~0 instead of noise.
    Returns a new tensor ``(N, C, H, W)``.
    """
    x = check_images(x)
    k = min(size, effective_window_size(Window("uniform", size), x.shape[-2], x.shape[-1]))
    p = k // 2
    xp = F.pad(x, (p, p, p, p), mode="replicate") if p else x
    mu = F.avg_pool2d(xp, k, stride=1)
    var = (F.avg_pool2d(xp * xp, k, stride=1) - mu * mu).clamp_min(0)
    return (x - mu) / torch.sqrt(var + c)


def local_ncc_matrix(cands: Tensor, refs: Tensor, *, size: int = 7,
                     dtype: torch.dtype = torch.float64) -> Tensor:
    """Mean product of locally standardised images, all pairs by one matrix product.

    A cheap proxy of SSIM's contrast-structure term (SSIM compares local,
    not global, statistics), used as the default nearest-neighbour
    prefilter: on structured 32x32 images its top-32 shortlist contained the
    exact SSIM best match more often than L2's or global NCC's
    (``benchmarks/bench_evaluation.py``).

    Args:
        cands: ``(M, C, H, W)``; refs: ``(R, C, H, W)``.
        size: Side of the local window.

    Returns:
        Tensor ``(M, R)`` (higher = more similar).
    """
    cands, refs = check_image_pair(cands, refs, ("candidates", "references"))
    d = cands[0].numel() if cands.shape[0] else refs[0].numel()
    za = local_standardise(cands.to(dtype), size=size).flatten(1)
    zb = local_standardise(refs.to(dtype), size=size).flatten(1)
    return (za @ zb.t()) / d


def downsample2x(x: Tensor) -> Tensor:
    """Average-pool 2x2 (stride 2): ``(N, C, H, W) -> (N, C, H // 2, W // 2)``.

    An odd last row/column is dropped. Images smaller than 2 pixels are
    returned unchanged (a copy).
    """
    x = check_images(x)
    if x.shape[-1] < 2 or x.shape[-2] < 2:
        return x.clone()
    return F.avg_pool2d(x, kernel_size=2, stride=2)


def minmax_rescale(x: Tensor, *, eps: float = 1e-12) -> Tensor:
    """Rescale each image (over all channels and pixels) to ``[0, 1]``.

    ``(x - min) / (max - min)`` per image; a constant image becomes zeros.

    Returns:
        New tensor ``(N, C, H, W)`` in ``[0, 1]``.

    References:
        Haim et al. (2022), evaluation: reconstructions are min-max rescaled
        before SSIM.
    """
    x = check_images(x)
    flat = x.flatten(1)
    lo = flat.min(dim=1).values.view(-1, 1, 1, 1)
    hi = flat.max(dim=1).values.view(-1, 1, 1, 1)
    rng = hi - lo
    return torch.where(rng > eps, (x - lo) / rng.clamp_min(eps), torch.zeros_like(x))
