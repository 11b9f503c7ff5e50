"""The reproduction benches' verdict: our order beside a paper's, with SLT's one-point tie rule."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from reproduction import compare  # noqa: E402

PAPER = ["a", "b", "c"]


def rows(**finals):
    return {k: {"final": v} for k, v in finals.items()}


@pytest.mark.parametrize("finals, ours, verdict", [
    ({"a": 0.80, "b": 0.70, "c": 0.60}, ["a", "b", "c"], True),
    ({"a": 0.80, "b": 0.795, "c": 0.60}, ["a", "b", "c"], "up to ties"),    # b within a point of a
    ({"a": 0.795, "b": 0.80, "c": 0.60}, ["b", "a", "c"], "up to ties"),    # swapped, but within a point
    ({"a": 0.70, "b": 0.80, "c": 0.60}, ["b", "a", "c"], False),            # swapped by ten points
    ({"a": 0.80, "b": 0.70, "c": 0.795}, ["a", "c", "b"], False),           # c beats b by 9.5 points
])
def test_verdict(finals, ours, verdict):
    result = compare(rows(**finals), PAPER)
    assert result["our_order"] == ours
    assert result["matches_paper_order"] == verdict
    assert result["paper_order"] == PAPER


def test_ties_are_named_and_a_missing_method_gives_no_verdict():
    result = compare(rows(a=0.80, b=0.795, c=0.60), PAPER)
    assert result["ties"] == [["a", "b"]]
    partial = compare({"a": {"final": 0.8}, "b": {"final": None}, "c": {"final": 0.6}}, PAPER)
    assert partial["our_order"] == ["a", "c"] and partial["matches_paper_order"] is None
