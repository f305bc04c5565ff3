"""The public-data prior: the principal subspace of the attacker's public images.

An attacker of a fine-tuned model has its public pretrained model and so the public images it was pretrained on
(the pretraining data spec the fine-tuned model records, ``model.json`` ``pretrained.data``). The first k principal
components of those images span most of what natural images of the task look like: the landscape benchmark found
the training images projected on the first 1 024 components of the public CIFAR-10 images keep cosine 0.987 to θ*.
The prior ``pca`` (:data:`~datarecon.attacks.priors.PRIORS`, weight ``pca_weight``, k ``pca_components``) penalises
the part of each candidate outside that subspace:

    P(x) = Σ_i ‖(I − VᵀV)(x_i − μ)‖² / (m·d),      ∂P/∂x_i = 2 (I − VᵀV)(x_i − μ) / (m·d),

with μ (d,) the public images' mean and V (k, d) their first k principal directions (orthonormal rows), x_i a
candidate flattened to d = C·H·W pixels in model input space and m the candidates (per run with a run axis): the
squared residual per pixel, so one weight fits any m and image size (as ``tv_weight`` does).

The subspace is computed attacker-side from the public images only (:func:`public_subspace`), once per public data
set, normalisation and k: it is cached under ``DATARECON_CACHE`` (default ``~/.cache/datarecon``) keyed by what it
was computed from, and its summary (source, k, the variance it explains, its SHA-256) is recorded in run.json.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datarecon.config import build_record
from datarecon.data import DataSpec, Normalisation, load_task
from datarecon.errors import DataReconError
from datarecon.utils.io import load_tensors, save_tensors

__all__ = ["MAX_COMPONENTS", "NO_PUBLIC_DATA", "PublicSubspace", "default_components", "pca_value_and_grad",
           "principal_subspace", "public_subspace"]

#: the most components by default (the landscape benchmark's 1 024 of CIFAR-10's 3 072 pixels)
MAX_COMPONENTS = 1024

#: the refusal where the attacker has no public data
NO_PUBLIC_DATA = ("the public-data prior (pca_weight) reads the public images a fine-tuned model was pretrained on, "
                  "and this model records none (it was not fine-tuned from a pretrained model of `datarecon train "
                  "--pretrained`); set pca_weight to 0")


@dataclass(frozen=True)
class PublicSubspace:
    """The first k principal directions of the public images in model input space.

    Attributes:
        mean: (d,) the public images' mean.
        basis: (k, d) orthonormal rows V, by decreasing variance.
        n_public: the public images it was computed from.
        explained: the fraction of their variance the k directions hold, in [0, 1].
        source: where the public images came from (their data spec, in words).
        cache: the cache file it was read from or written to ("" when not cached).
    """

    mean: torch.Tensor
    basis: torch.Tensor
    n_public: int
    explained: float
    source: str
    cache: str = ""

    @property
    def k(self) -> int:
        return int(self.basis.shape[0])

    def to(self, *, dtype: torch.dtype, device: torch.device | str) -> PublicSubspace:
        """The subspace with its tensors in ``dtype`` on ``device``."""
        return PublicSubspace(self.mean.to(device=device, dtype=dtype), self.basis.to(device=device, dtype=dtype),
                              self.n_public, self.explained, self.source, self.cache)

    def summary(self) -> dict[str, Any]:
        """run.json's record: source, n, k, variance explained, SHA-256 of (mean, basis) in float64, cache file."""
        digest = hashlib.sha256(self.mean.double().cpu().numpy().tobytes()
                                + self.basis.double().cpu().numpy().tobytes()).hexdigest()
        return {"source": self.source, "n_public": self.n_public, "components": self.k, "dims": int(self.mean.numel()),
                "explained_variance": self.explained, "sha256": digest, "cache": self.cache}


def default_components(dims: int) -> int:
    """k when ``pca_components`` is unset: min(1 024, ⌊d/3⌋) (1 024 for 3 × 32 × 32 images, 21 for 8 × 8), >= 1."""
    return max(1, min(MAX_COMPONENTS, dims // 3))


def principal_subspace(images: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(μ (d,), V (k', d), explained fraction) of ``images`` (N, d): the eigenvectors of the scatter matrix
    (x − μ)ᵀ(x − μ) with the k' = min(k, N − 1, d) largest eigenvalues (float64; the N × N Gram matrix's when
    N < d).

    Raises:
        DataReconError: fewer than two images.
    """
    x = images.reshape(images.shape[0], -1).double()
    n, d = x.shape
    if n < 2:
        raise DataReconError(f"the public-data prior needs at least two public images to span a subspace, got {n}")
    mean = x.mean(0)
    c = x - mean
    k = min(k, n - 1, d)
    if d <= n:
        evals, evecs = torch.linalg.eigh(c.T @ c)
        order = torch.argsort(evals, descending=True)[:k]
        basis = evecs[:, order].T
    else:
        evals, u = torch.linalg.eigh(c @ c.T)
        order = torch.argsort(evals, descending=True)[:k]
        basis = (c.T @ u[:, order] / evals[order].clamp_min(1e-300).sqrt()).T
    total = float(c.pow(2).sum())
    explained = float(evals[order].clamp_min(0).sum()) / total if total > 0 else 1.0
    return mean, basis.contiguous(), min(1.0, explained)


def pca_value_and_grad(x: torch.Tensor, subspace: PublicSubspace, *,
                       run_axis: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """P(x) = Σ_i ‖(I − VᵀV)(x_i − μ)‖² / (m·d) and its gradient 2 (I − VᵀV)(x_i − μ) / (m·d) (module docstring).

    Args:
        x: (m, C, H, W) candidates in model input space, or (K, m, C, H, W) with ``run_axis`` (values per run).
        subspace: μ and V in x's dtype and device.

    Returns:
        (value: scalar, or (K,) with ``run_axis``; gradient shaped like x).
    """
    xd = x.detach()
    per_run = xd[0].numel() if run_axis else xd.numel()
    flat = xd.reshape(-1, subspace.mean.numel()) - subspace.mean
    resid = flat - (flat @ subspace.basis.T) @ subspace.basis
    sq = resid.pow(2).reshape(xd.shape[0], -1).sum(1) if run_axis else resid.pow(2).sum()
    return sq / per_run, (resid * (2.0 / per_run)).reshape(xd.shape)


def _cache_dir() -> Path:
    return Path(os.environ.get("DATARECON_CACHE") or Path.home() / ".cache" / "datarecon")


def public_subspace(model_meta: Mapping[str, Any] | None, *, input_mean: torch.Tensor, components: int | None,
                    data_dir: str | os.PathLike | None = None) -> PublicSubspace:
    """The principal subspace of the public images of a fine-tuned model, in its model input space.

    The public images are the pretraining data spec the model records (``pretrained.data``), loaded through the
    data folder and mapped to model space by the model's own normalisation (``input_mean``); k = ``components`` or
    :func:`default_components`. The result is cached (module docstring) by the SHA-256 of the data spec, the mean
    and k.

    Raises:
        DataReconError: the model records no public data (:data:`NO_PUBLIC_DATA`), or the public data cannot be
            loaded (the data loader's one line).
    """
    meta = model_meta or {}
    record = meta.get("pretrained")
    if not isinstance(record, Mapping) or not isinstance(record.get("data"), Mapping):
        raise DataReconError(NO_PUBLIC_DATA)
    where = "public data spec (model.json pretrained.data)"
    spec = build_record(DataSpec, dict(record["data"]), where=where).checked(where)
    norm = Normalisation.from_mean(str(meta.get("normalisation", "unit")), input_mean)
    dims = int(input_mean.numel())
    k = components if components is not None else default_components(dims)
    key = hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()
                         + input_mean.double().cpu().numpy().tobytes() + str(k).encode()).hexdigest()[:20]
    source = f"{spec.dataset} {spec.task}: the pretraining images of {record.get('path')}"
    path = _cache_dir() / f"public-pca-{key}.safetensors"
    if path.is_file():
        t = load_tensors(path)
        return PublicSubspace(t["mean"], t["basis"], int(t["n_public"]), float(t["explained"]), source, str(path))
    x = norm.to_model(load_task(spec, data_dir=data_dir).train.x.double())
    mean, basis, explained = principal_subspace(x.reshape(x.shape[0], -1), k)
    out = PublicSubspace(mean, basis, int(x.shape[0]), explained, source, "")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_tensors(path, {"mean": mean, "basis": basis, "n_public": torch.tensor(out.n_public),
                            "explained": torch.tensor(explained, dtype=torch.float64)})
    except OSError:  # an unwritable cache: computed again next time
        return out
    return PublicSubspace(mean, basis, out.n_public, explained, source, str(path))
