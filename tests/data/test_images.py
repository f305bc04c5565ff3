"""A user's own images: folders of PNGs, .npz and .safetensors files, and every way they can be wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from datarecon.data.images import load_images
from datarecon.errors import DataReconError


def _png_folder(path, arrays, mode):
    from PIL import Image

    path.mkdir()
    for i, a in enumerate(arrays):
        Image.fromarray(a, mode=mode).save(path / f"img{i:02d}.png")
    return path


def test_png_folder_rgb_and_grey(tmp_path):
    rgb = [np.full((8, 8, 3), 10 * i, dtype=np.uint8) for i in range(3)]
    x, names = load_images(_png_folder(tmp_path / "rgb", rgb, "RGB"), input_shape=(3, 8, 8))
    assert x.shape == (3, 3, 8, 8) and names == ["img00.png", "img01.png", "img02.png"]
    assert float(x[2, 0, 0, 0]) == pytest.approx(20 / 255)
    grey = [np.full((8, 8), 255, dtype=np.uint8)]
    x, _ = load_images(_png_folder(tmp_path / "grey", grey, "L"), input_shape=(1, 8, 8))
    assert x.shape == (1, 1, 8, 8) and float(x.max()) == 1.0
    with pytest.raises(DataReconError, match="greyscale; the model takes 3-channel"):
        load_images(tmp_path / "grey", input_shape=(3, 8, 8))
    with pytest.raises(DataReconError, match="wrong size"):
        load_images(tmp_path / "rgb", input_shape=(3, 16, 16))


def test_npz_and_safetensors_layouts(tmp_path):
    from safetensors.torch import save_file

    a = np.random.default_rng(0).random((4, 3, 8, 8))
    np.savez(tmp_path / "nchw.npz", x=a)
    np.savez(tmp_path / "nhwc.npz", images=a.transpose(0, 2, 3, 1))
    save_file({"x": torch.from_numpy(a).float()}, str(tmp_path / "x.safetensors"))
    for name in ("nchw.npz", "nhwc.npz", "x.safetensors"):
        x, names = load_images(tmp_path / name, input_shape=(3, 8, 8))
        assert torch.allclose(x, torch.from_numpy(a), atol=1e-6) and names[1] == f"{name}[1]"
    np.savez(tmp_path / "u8.npz", (a * 255).astype(np.uint8))
    x, _ = load_images(tmp_path / "u8.npz", input_shape=(3, 8, 8))
    assert float(x.max()) <= 1.0


@pytest.mark.parametrize("case, match", [
    ("range", r"values in \[0, 2\]; pass display-space images in \[0, 1\]"),
    ("channels", "wrong channels"),
    ("rank", r"pass images as \(N, 3, 8, 8\)"),
    ("nan", "NaN or infinite"),
    ("keys", "name the images x"),
    ("pickle", "without pickles"),
    ("suffix", "unknown image file type"),
    ("missing", "not found"),
    ("empty-folder", "holds no"),
])
def test_bad_images_are_one_line_errors(tmp_path, case, match):
    shape = (3, 8, 8)
    path = tmp_path / "f.npz"
    if case == "range":
        np.savez(path, x=np.full((2, 3, 8, 8), 2.0))
    elif case == "channels":
        np.savez(path, x=np.zeros((2, 1, 8, 8)))
    elif case == "rank":
        np.savez(path, x=np.zeros((8, 8)))
    elif case == "nan":
        np.savez(path, x=np.full((2, 3, 8, 8), np.nan))
    elif case == "keys":
        np.savez(path, a=np.zeros((2, 3, 8, 8)), b=np.zeros((2, 3, 8, 8)))
    elif case == "pickle":
        np.savez(path, x=np.array([{"a": 1}], dtype=object))
    elif case == "suffix":
        path = tmp_path / "f.txt"
        path.write_text("x")
    elif case == "missing":
        path = tmp_path / "absent.npz"
    else:
        path = tmp_path / "empty"
        path.mkdir()
    with pytest.raises(DataReconError, match=match) as exc:
        load_images(path, input_shape=shape)
    assert "\n" not in str(exc.value)
