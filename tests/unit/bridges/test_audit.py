"""The one-view audit on the example cluster's A100 MIG counters and H100 GPUs."""

from __future__ import annotations

import pytest

from services.bridges.audit import audit, system_of
from services.client.results import Reservation, ReservationState
from services.common.dra.model import DeviceID
from tests.unit.bridges.support import example_nodes

NODES = example_nodes()


def held(owner: str, node: str, *devices: str, rid: str = "") -> Reservation:
    return Reservation(
        id=rid or f"res-{owner.replace('/', '-')}-{devices[0]}",
        owner=owner,
        node_name=node,
        state=ReservationState.COMMITTED,
        devices=tuple(DeviceID("gpu.nvidia.com", node, d) for d in devices),
    )


@pytest.mark.parametrize(
    ("reservations", "double", "overdrawn"),
    [
        pytest.param(
            [
                held("slurm/job/1", "h100-node-1", "gpu-0", "gpu-1"),
                held("kueue/team-a/w", "h100-node-1", "gpu-2"),
            ],
            0,
            0,
            id="disjoint-gpus",
        ),
        pytest.param(
            [
                held("slurm/job/1", "h100-node-1", "gpu-0"),
                held("kueue/team-a/w", "h100-node-1", "gpu-0"),
            ],
            1,
            0,
            id="one-gpu-twice",
        ),
        pytest.param(
            [
                held("slurm/job/1", "a100-node-1", "gpu-0-mig-1g10gb-15-0"),
                held("kueue/team-a/w", "a100-node-1", "gpu-0-mig-1g10gb-15-2"),
            ],
            0,
            0,
            id="mig-placements-side-by-side",
        ),
        pytest.param(
            [
                held("slurm/job/1", "a100-node-1", "gpu-0"),
                held("kueue/team-a/w", "a100-node-1", "gpu-0-mig-1g10gb-15-2"),
            ],
            0,
            1,
            id="whole-gpu-and-a-mig-slice-of-it",
        ),
        pytest.param(
            [
                held("slurm/job/1", "a100-node-1", "gpu-0-mig-2g10gb-14-0"),
                held("kueue/team-a/w", "a100-node-1", "gpu-0-mig-1g5gb-19-1"),
            ],
            0,
            1,
            id="overlapping-mig-placements",
        ),
    ],
)
def test_audit_finds_what_is_held_twice(reservations, double, overdrawn):
    report = audit(reservations, NODES)
    assert len(report.double_held) == double
    assert (len(report.overdrawn) > 0) == (overdrawn > 0)
    assert report.clean is (double == 0 and overdrawn == 0)


def test_overdrawn_counters_are_named():
    report = audit(
        [
            held("slurm/job/1", "a100-node-1", "gpu-0"),
            held("kueue/team-a/w", "a100-node-1", "gpu-0-mig-1g10gb-15-2"),
        ],
        NODES,
    )
    assert (
        "gpu.nvidia.com/a100-node-1/gpu-0-counter-set/memory-slice-2: 2 used of 1"
        in report.overdrawn
    )
    assert any(line.startswith("OVERDRAWN") for line in report.lines())


def test_holdings_grouped_by_system():
    report = audit(
        [
            held("slurm/job/1", "h100-node-1", "gpu-0", "gpu-1"),
            held("kueue/team-a/w", "l40s-node-1", "gpu-3"),
            held("slurm/job/2", "h100-node-2", "gpu-0"),
        ],
        NODES,
    )
    assert {s: len(d) for s, d in report.by_system.items()} == {"slurm": 3, "kueue": 1}
    assert report.lines()[0] == "3 reservations hold 4 devices (kueue 1, slurm 3)"


def test_unknown_devices_are_reported():
    report = audit([held("slurm/job/1", "h100-node-1", "gpu-9")], NODES)
    assert report.unknown_devices == (DeviceID("gpu.nvidia.com", "h100-node-1", "gpu-9"),)
    assert not report.clean


@pytest.mark.parametrize(
    ("owner", "system"),
    [
        pytest.param("slurm/job/17", "slurm", id="slurm"),
        pytest.param("kueue/team-a/job-x", "kueue", id="kueue"),
        pytest.param("anonymous", "anonymous", id="other"),
    ],
)
def test_system_of_owner(owner, system):
    assert system_of(owner) == system
