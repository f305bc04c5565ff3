"""The one dtype map (datarecon.utils.dtypes)."""

from __future__ import annotations

import pytest
import torch

from datarecon.errors import DataReconError
from datarecon.utils.dtypes import DTYPES, torch_dtype


def test_names_map_to_torch_dtypes():
    assert torch_dtype("float32") is torch.float32 and torch_dtype("float64") is torch.float64
    assert list(DTYPES) == ["float32", "float64"]


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(DataReconError, match="unknown dtype 'float16'; valid names: float32, float64"):
        torch_dtype("float16")


def test_no_other_module_keeps_its_own_dtype_map():
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "datarecon"
    copies = [p.relative_to(src).as_posix() for p in src.rglob("*.py")
              if '"float64": torch.float64' in p.read_text(encoding="utf-8")]
    assert copies == ["utils/dtypes.py"]
