"""The source of a user's own model package, written into a workspace by the bad-input tests
(tests/cli/test_bad_input.py) and the adversarial trials (tests/faults/adversarial_trials.py):
a factory that works (``make``), one that raises (``boom``) and one that exits (``bye``); and two training
functions for reference models that return what no training should: NaN weights (``nan_recipe``) and another
architecture (``other_recipe``)."""

NETS = """import sys
from torch import nn


def make():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 8, bias=False), nn.ReLU(), nn.Linear(8, 1, bias=False))


def boom():
    raise ValueError("bad width")


def bye():
    sys.exit(3)


def nan_recipe(x, y, seed):
    net = make().to(x.dtype)
    for p in net.parameters():
        p.data.fill_(float("nan"))
    return net


def other_recipe(x, y, seed):
    return nn.Linear(64, 1)
"""
