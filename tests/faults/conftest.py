"""Fixtures of the fault trials (helpers: ``faultlib.py``)."""

from __future__ import annotations

import random
import zlib

import pytest

from faultlib import SESSION_SEED


@pytest.fixture
def rng(request) -> random.Random:
    """A generator for kill points: the session seed mixed with the test's name (printed: replay a failure
    with ``DATARECON_FAULT_SEED``)."""
    seed = SESSION_SEED ^ zlib.crc32(request.node.nodeid.encode())
    print(f"fault seed: DATARECON_FAULT_SEED={SESSION_SEED} (trial seed {seed})")
    return random.Random(seed)
