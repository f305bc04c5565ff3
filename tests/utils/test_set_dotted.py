"""config.set_dotted: the one dotted-key setter of run layers and sweep expansion."""

from __future__ import annotations

from datarecon.config import set_dotted


def test_set_dotted_creates_and_copies_the_nested_mappings():
    shared = {"scale": 1.0}
    data = {"init": shared, "seed": 0}
    set_dotted(data, "init.scale", 0.05)
    set_dotted(data, "checkpoint.every", 5)
    set_dotted(data, "seed", 3)
    assert data == {"init": {"scale": 0.05}, "seed": 3, "checkpoint": {"every": 5}}
    assert shared == {"scale": 1.0}  # a mapping shared with another spec is not changed
    data = {"init": "gaussian"}
    set_dotted(data, "init.scale", 0.1)  # a value where a mapping belongs is replaced by one
    assert data == {"init": {"scale": 0.1}}
