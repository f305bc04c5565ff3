"""The one status vocabulary (datarecon.kernel.status) and its reading of the legacy training words."""

from __future__ import annotations

import pytest

from datarecon.errors import DataReconError
from datarecon.kernel.status import EVALUABLE, FINISHED, Status


@pytest.mark.parametrize("word,status", [
    ("complete", Status.COMPLETE), ("completed", Status.COMPLETE), ("stopped", Status.STOPPED_EARLY),
    ("stopped-early", Status.STOPPED_EARLY), ("interrupted", Status.RUNNING), ("diverged", Status.DIVERGED),
], ids=lambda v: str(v))
def test_parse_reads_current_and_legacy_words(word, status):
    assert Status.parse(word) is status


def test_unknown_status_is_a_one_line_error_listing_the_valid_ones():
    with pytest.raises(DataReconError, match="unknown status 'done'; valid: running, complete, stopped-early, diverged"):
        Status.parse("done")


def test_groups_and_file_values():
    assert EVALUABLE == ("complete", "stopped-early")
    assert FINISHED == ("complete", "stopped-early", "diverged")
    assert f"{Status.STOPPED_EARLY}" == "stopped-early" and Status.COMPLETE == "complete"
