"""suggest.py: the closest known name, and none when nothing is close or there are too many."""

from __future__ import annotations

import pytest

from services.common.dra.limits import MAX_SUGGESTION_CANDIDATES
from services.common.dra.suggest import did_you_mean

CLASSES = ["gpu.nvidia.com", "mig.nvidia.com"]
ATTRIBUTES = ["uuid", "productName", "brand"]
NODES = [f"gpu-node-{i:04d}" for i in range(MAX_SUGGESTION_CANDIDATES)]


@pytest.mark.parametrize(
    ("word", "candidates", "hint"),
    [
        pytest.param(
            "gpu.nvida.com", CLASSES, ' (did you mean "gpu.nvidia.com"?)', id="class-typo"
        ),
        pytest.param(
            "productNme", ATTRIBUTES, ' (did you mean "productName"?)', id="attribute-typo"
        ),
        pytest.param("zzz", ["gpu.nvidia.com"], "", id="nothing-close"),
        pytest.param("gpu.nvidia.com", ["gpu.nvidia.com"], "", id="the-name-itself"),
        pytest.param("", ["a"], "", id="empty-word"),
        pytest.param("x", [], "", id="no-candidates"),
        pytest.param("gpu-nod-0042", NODES, ' (did you mean "gpu-node-0042"?)', id="at-the-limit"),
        pytest.param("gpu-nod-0042", [*NODES, "one-more"], "", id="past-the-limit"),
    ],
)
def test_did_you_mean(word: str, candidates: list[str], hint: str) -> None:
    assert did_you_mean(word, candidates) == hint
