"""Label selectors as kubectl's `-l` reads them (services/client/selectors.py)."""

from __future__ import annotations

import pytest

from services.client.selectors import parse_selector
from services.common.errors import InvalidArgument

LABELS = {"zone": "zone-a", "gpualloc.dev/rack": "rack-a1", "spot": "true"}

MATCHES = {
    "empty-selects-all": ("", True),
    "equality": ("zone=zone-a", True),
    "double-equals": ("zone==zone-a", True),
    "equality-other-value": ("zone=zone-b", False),
    "inequality": ("zone!=zone-b", True),
    "inequality-of-an-absent-key": ("colour!=red", True),
    "prefixed-key": ("gpualloc.dev/rack=rack-a1", True),
    "in-set": ("zone in (zone-b, zone-a)", True),
    "not-in-set": ("zone notin (zone-a)", False),
    "notin-of-an-absent-key": ("colour notin (red)", True),
    "exists": ("spot", True),
    "not-exists": ("!spot", False),
    "all-must-hold": ("zone=zone-a,!spot", False),
    "commas-inside-a-set": ("zone in (x,zone-a),spot", True),
}


@pytest.mark.parametrize(("text", "expected"), MATCHES.values(), ids=MATCHES.keys())
def test_matches(text: str, expected: bool) -> None:
    assert parse_selector(text).matches(LABELS) is expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("zone in (", id="open-set"),
        pytest.param("zone in ()", id="empty-set"),
        pytest.param("zone=a b", id="space-in-a-value"),
        pytest.param("=x", id="no-key"),
        pytest.param("zone>3", id="unknown-operator"),
    ],
)
def test_bad_selectors_name_the_flag(text: str) -> None:
    with pytest.raises(InvalidArgument, match="--selector"):
        parse_selector(text)
