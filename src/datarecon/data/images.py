"""A user's own images, read into display space for scoring against a model.

Three forms (no pickles, no code executed):

* a folder of ``.png`` / ``.jpg`` / ``.jpeg`` files (sorted by name; greyscale for a one-channel
  model, RGB for three), 8-bit values divided by 255;
* an ``.npz`` file with one array, or an array named ``x`` (or ``images``);
* a ``.safetensors`` file with a tensor named ``x`` (or a single tensor).

Arrays may be (N, C, H, W), channels-last (N, H, W, C) or, for one channel, (N, H, W); uint8
values are divided by 255, floats must already lie in [0, 1] (display space).
:func:`load_images` returns (N, C, H, W) float64 and one name per image; every problem is a
one-line :class:`~datarecon.errors.DataReconError` naming the file and the fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from datarecon.errors import DataReconError
from datarecon.kernel.files import CANDIDATES, RUN_JSON
from datarecon.utils.io import load_tensors

__all__ = ["IMAGE_SUFFIXES", "load_images", "to_display_array"]

#: Image file suffixes read from a folder.
IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg")


def to_display_array(arr: np.ndarray, *, input_shape: tuple[int, ...], where: str) -> np.ndarray:
    """(N, C, H, W) float64 in [0, 1] from an array of images (layouts and dtypes as in the module docstring).

    Raises:
        DataReconError: wrong rank, channels or size; floats outside [0, 1]; non-numeric or
            non-finite values.
    """
    c, h, w = (tuple(input_shape) + (1, 1, 1))[:3] if len(input_shape) == 3 else (None, None, None)
    if c is None:
        raise DataReconError(f"the model's input shape {tuple(input_shape)} is not (C, H, W); images cannot be read")
    if arr.dtype.kind not in "uif":
        raise DataReconError(f"{where} holds {arr.dtype} values; pass numbers (uint8 0-255 or floats in [0, 1])")
    if arr.ndim == 3 and c == 1:
        arr = arr[:, None]
    if arr.ndim != 4:
        raise DataReconError(f"{where} has shape {arr.shape}; pass images as (N, {c}, {h}, {w}) or (N, {h}, {w}, {c})")
    if arr.shape[1:] != (c, h, w) and arr.shape[1:] == (h, w, c):
        arr = arr.transpose(0, 3, 1, 2)
    if arr.shape[1:] != (c, h, w):
        got = arr.shape[1:]
        what = "channels" if got[0] != c and got[-1] != c else "size"
        raise DataReconError(f"{where}: images of shape {got} do not fit the model's input {c}x{h}x{w} "
                             f"(wrong {what}); resize or convert them to {c} channel(s) of {h}x{w}")
    if arr.dtype == np.uint8:
        out = arr.astype(np.float64) / 255.0
    else:
        out = arr.astype(np.float64)
        if not np.isfinite(out).all():
            raise DataReconError(f"{where} holds NaN or infinite values; pass finite pixel values")
        lo, hi = float(out.min(initial=0.0)), float(out.max(initial=0.0))
        if arr.dtype.kind in "ui" and hi > 1:
            raise DataReconError(f"{where} holds integers up to {hi:g}; pass uint8 0-255 or floats in [0, 1]")
        if lo < -1e-6 or hi > 1 + 1e-6:
            raise DataReconError(f"{where} has values in [{lo:.3g}, {hi:.3g}]; pass display-space images in [0, 1] "
                                 "(divide 8-bit values by 255)")
        out = out.clip(0.0, 1.0)
    return out


def _read_folder(folder: Path, input_shape: tuple[int, ...]) -> tuple[np.ndarray, list[str]]:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise DataReconError(f"{folder} holds no {'/'.join(IMAGE_SUFFIXES)} files; pass a folder of images, "
                             "an .npz or a .safetensors file")
    mode = "L" if input_shape[0] == 1 else "RGB"
    arrays = []
    for f in files:
        try:
            with Image.open(f) as im:
                bands = len(im.getbands())
                if input_shape[0] == 3 and bands == 1:
                    raise DataReconError(f"{f} is greyscale; the model takes 3-channel (RGB) images")
                arr = np.asarray(im.convert(mode), dtype=np.uint8)
        except (UnidentifiedImageError, OSError) as exc:
            raise DataReconError(f"{f} is not a readable image ({type(exc).__name__}); remove or replace it") from None
        arrays.append(arr if arr.ndim == 3 else arr[:, :, None])
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise DataReconError(f"{folder} mixes image sizes {sorted(shapes)}; resize them to one size")
    return np.stack(arrays), [f.name for f in files]


def load_images(path: str | Path, *, input_shape: tuple[int, ...]) -> tuple[torch.Tensor, list[str]]:
    """Read images for a model with ``input_shape`` (C, H, W).

    Returns:
        ((N, C, H, W) float64 in [0, 1], names: file names or ``<file>[i]``).

    Raises:
        DataReconError: a missing path, an unknown file type, a pickle, or images that do not fit
            (see :func:`to_display_array`).
    """
    path = Path(path)
    if not path.exists():
        raise DataReconError(f"{path} not found; pass a folder of PNG images, an .npz or a .safetensors file")
    if path.is_dir():
        arr, names = _read_folder(path, tuple(input_shape))
    elif path.suffix.lower() == ".npz":
        _check_zip(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                keys = list(data.keys())
                key = next((k for k in ("x", "images") if k in keys), keys[0] if len(keys) == 1 else None)
                if key is None:
                    raise DataReconError(f"{path} holds arrays {keys}; name the images x (or store only one array)")
                arr = data[key]
        except ValueError as exc:  # object arrays need pickles: refused
            raise DataReconError(f"{path} cannot be read without pickles ({exc}); save plain numeric arrays") from None
        except (OSError, EOFError) as exc:
            raise DataReconError(f"{path} is not a readable .npz file ({type(exc).__name__})") from None
        names = [f"{path.name}[{i}]" for i in range(arr.shape[0] if arr.ndim else 0)]
    elif path.suffix.lower() == ".safetensors":
        if path.name == CANDIDATES and (path.parent / RUN_JSON).is_file():
            raise DataReconError(f"{path} is a run's candidates file: its x are in the model's input space (the image "
                                 "minus the model's input_mean, unclipped), not display images in [0, 1]; add the "
                                 "input_mean of the model's extras.safetensors back, clip to [0, 1] and save them as x")
        tensors = load_tensors(path)
        key = "x" if "x" in tensors else (next(iter(tensors)) if len(tensors) == 1 else None)
        if key is None:
            raise DataReconError(f"{path} holds tensors {sorted(tensors)}; name the images x (or store only one)")
        t = tensors[key]
        arr = t.numpy() if t.dtype != torch.bfloat16 else t.float().numpy()
        names = [f"{path.name}[{i}]" for i in range(arr.shape[0] if arr.ndim else 0)]
    else:
        raise DataReconError(f"{path}: unknown image file type {path.suffix!r}; pass a folder of PNG images, "
                             "an .npz or a .safetensors file")
    if arr.ndim == 0 or arr.shape[0] == 0:
        raise DataReconError(f"{path} holds no images")
    out = to_display_array(np.asarray(arr), input_shape=tuple(input_shape), where=str(path))
    return torch.from_numpy(np.ascontiguousarray(out)), names


#: the first bytes of every .npz file (a zip archive of .npy arrays)
_ZIP_MAGIC = b"PK\x03\x04"


def _check_zip(path: Path) -> None:
    """Refuse a file named .npz that is no zip archive before numpy reads it (numpy would try it as a pickle and
    call any junk "pickled data")."""
    with open(path, "rb") as fh:
        head = fh.read(len(_ZIP_MAGIC))
    if head != _ZIP_MAGIC:
        raise DataReconError(f"{path} is not an .npz file (no zip archive of arrays: {len(head)} first bytes "
                             f"{head!r}); save the images with numpy.savez(path, x=images)")


def load_labels(path: str | Path, *, count: int) -> np.ndarray | None:
    """The labels stored beside the images of an .npz (array ``y`` or ``labels``) or a .safetensors file
    (tensor ``y``), one per image; None when the file has none (a folder of PNGs never has).

    Raises:
        DataReconError: labels that are not one number per image.
    """
    path = Path(path)
    arr = None
    if path.is_file() and path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as data:
            for key in ("y", "labels"):
                if key in data.files:
                    arr = np.asarray(data[key])
                    break
    elif path.is_file() and path.suffix.lower() == ".safetensors":
        t = load_tensors(path).get("y")
        arr = None if t is None else t.numpy()
    if arr is None:
        return None
    if arr.shape != (count,) or arr.dtype.kind not in "uif" or not np.isfinite(arr.astype(np.float64)).all():
        raise DataReconError(f"{path}: labels y of shape {arr.shape} ({arr.dtype}); pass one finite number per image "
                             f"({count})")
    return arr
