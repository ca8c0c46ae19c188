"""loadtest/profile_service.py on a small inventory: the modes run and report their parts."""

from __future__ import annotations

import json

import pytest

from loadtest.profile_service import main

pytestmark = pytest.mark.redis  # it starts its own redis-server, as the service bench does


@pytest.mark.parametrize(
    ("mode", "claims"),
    [
        pytest.param("allocate-reserve-batch-64", 2 * 64, id="reserving-batch"),
        pytest.param("allocate-reserve", 2, id="unary-reserve"),
        pytest.param("allocate-any-node", 2, id="unary-allocate"),
    ],
)
def test_a_mode_reports_cpu_per_claim_and_its_parts(
    mode: str, claims: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["--mode", mode, "--scale", "0.02", "--calls", "2", "--threads", "2", "--parts"]) == 0
    )
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["mode"] == mode and result["claims"] == claims
    assert result["cpu_us_per_claim"] > 0
    parts = result["parts_cpu_us_per_claim"]
    if mode != "allocate-reserve-batch-64":
        assert parts["the answer (_answered)"] > 0
    else:  # a batch's items are answered one by one, their reply parsed once
        assert parts["the answer (a batch item's)"] > 0
        assert parts["the batch reply joined (BatchReply.serialized)"] > 0  # not parsed
        assert parts["solve (core solve_many)"] > 0 and parts["the run's write (_write_run)"] > 0
        # hold_in_place and hold_whole_in_place (an item that took the last node again)
        assert parts["  the batch's holds (hold_in_place)"] > 0
        # a run's one-allocation placements: Holdings.hold_in_run and settle_run
        assert parts["hold_pending"] > 0 and parts["settle_all (a run's placements settled)"] > 0
