"""The one map from dtype names (as they appear in configs and files) to torch dtypes.

Every config that chooses a floating-point precision spells it ``float32`` or ``float64``
(:data:`DtypeName`); :func:`torch_dtype` turns the name into a ``torch.dtype`` with a one-line
error naming the valid names (taken from :data:`DTYPES`, never from a hand-kept list).
"""

from __future__ import annotations

from typing import Literal

import torch

from datarecon.errors import DataReconError

DtypeName = Literal["float32", "float64"]
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` / ``"float64"`` → the torch dtype.

    Raises:
        DataReconError: an unknown name (the message lists the valid ones).
    """
    try:
        return DTYPES[name]
    except KeyError:
        raise DataReconError(f"unknown dtype {name!r}; valid names: {', '.join(DTYPES)}") from None
