"""The source of a user's own model package, written into a workspace by the bad-input tests
(tests/cli/test_bad_input.py) and the adversarial trials (tests/faults/adversarial_trials.py):
a factory that works (``make``), one that raises (``boom``) and one that exits (``bye``)."""

NETS = """import sys
from torch import nn


def make():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 8, bias=False), nn.ReLU(), nn.Linear(8, 1, bias=False))


def boom():
    raise ValueError("bad width")


def bye():
    sys.exit(3)
"""
