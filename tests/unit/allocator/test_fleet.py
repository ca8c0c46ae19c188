"""fleet.py: the web view's picture of the example cluster — GPUs, MIG slices where they sit,
holders as a viewer may see them, fragmentation per node."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.allocator.adapters.web.page import fleet_fragment
from services.allocator.adapters.web.server import WEB_VIEWER
from services.allocator.app.cluster_view import ClusterView, ViewSnapshot
from services.allocator.app.fleet_view import PENDING_OWNER, Fleet, FleetGpu, fleet_of
from services.allocator.core import AllocatedState, ClusterSnapshot
from services.allocator.reservations.model import Hold, Reservation, ReservationState
from services.common.dra.model import AllocationResult, DeviceRequestAllocationResult
from services.common.security.principal import development_principal
from tests.builders import with_taint
from tests.e2e.allocator_harness import cluster_feed


@pytest.fixture(scope="module")
def view() -> ViewSnapshot:
    cluster = ClusterView(min_interval=0)
    cluster_feed().follow(cluster.apply)
    snapshot = cluster.flush()
    cluster.close()
    return snapshot


def allocation(pool: str, *devices: str) -> AllocationResult:
    return AllocationResult(
        results=tuple(
            DeviceRequestAllocationResult("r", "gpu.nvidia.com", pool, d) for d in devices
        )
    )


def reservation(rid: str, owner: str, pool: str, *devices: str) -> Reservation:
    return Reservation(
        id=rid,
        owner=owner,
        node=pool,
        claim_names=("default/job",),
        allocations=(allocation(pool, *devices),),
        hold=Hold(devices=tuple(f"gpu.nvidia.com/{pool}/{d}" for d in devices)),
        state=ReservationState.RESERVED,
        fencing_token=7,
        created_at=1_000.0,
        expires_at=1_120.0,
    )


def drawn(view: ViewSnapshot, *held: Reservation, pending: tuple[str, str] | None = None) -> Fleet:
    state = AllocatedState(view.snapshot)
    for r in held:
        state = state.with_allocation(r.allocations[0], r.id)
    if pending is not None:
        state = state.with_allocation(allocation(*pending), "pending:1")
    return fleet_of(view, state, {r.id: r for r in held}, development_principal())


def gpu(fleet: Fleet, node: str, name: str) -> FleetGpu:
    found = next(n for n in fleet.nodes if n.name == node)
    return next(g for g in found.gpus if g.name == name)


def test_the_free_example_fleet_is_every_node_and_gpu_unfragmented(view):
    fleet = drawn(view)
    shape = {
        n.name: (len(n.gpus), {g.columns for g in n.gpus}, n.fragmentation) for n in fleet.nodes
    }
    assert shape == {
        "a100-node-1": (4, {8}, 0.0),  # MIG-partitionable: 8 memory slices each
        "h100-node-1": (8, {1}, 0.0),
        "h100-node-2": (8, {1}, 0.0),
        "l40s-node-1": (4, {1}, 0.0),
    }
    assert [g.name for g in fleet.nodes[0].gpus] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert fleet.holders() == {}


@dataclass(frozen=True)
class Drawn:
    devices: tuple[str, ...]  # held on a100-node-1 by one reservation
    gpu: str
    placements: tuple[tuple[str, str, int, int], ...]  # device, profile, start, width


DRAWN = {
    "a-1g-slice-at-memory-slices-2-and-3": Drawn(
        ("gpu-0-mig-1g10gb-15-2",), "gpu-0", (("gpu-0-mig-1g10gb-15-2", "1g.10gb", 2, 2),)
    ),
    "a-1g5gb-slice-at-memory-slice-6": Drawn(
        ("gpu-1-mig-1g5gb-19-6",), "gpu-1", (("gpu-1-mig-1g5gb-19-6", "1g.5gb", 6, 1),)
    ),
    "a-whole-gpu-spans-every-column": Drawn(("gpu-2",), "gpu-2", (("gpu-2", "", 0, 8),)),
    "two-slices-side-by-side": Drawn(
        ("gpu-3-mig-1g5gb-19-0", "gpu-3-mig-2g10gb-14-4"),
        "gpu-3",
        (("gpu-3-mig-1g5gb-19-0", "1g.5gb", 0, 1), ("gpu-3-mig-2g10gb-14-4", "2g.10gb", 4, 2)),
    ),
}


@pytest.mark.parametrize("case", DRAWN.values(), ids=DRAWN.keys())
def test_held_mig_devices_are_drawn_at_the_memory_slices_they_take(view, case):
    held = reservation("res-1", "alice", "a100-node-1", *case.devices)
    found = gpu(drawn(view, held), "a100-node-1", case.gpu)
    assert tuple((p.device, p.profile, p.start, p.width) for p in found.placements) == (
        case.placements
    )
    assert {p.holders[0].owner for p in found.placements} == {"alice"}


FRAGMENTATION = {
    "three-of-eight-h100s-free": (5, 0.5),  # 1- and 2-GPU jobs can use them, 4 and 8 cannot
    "four-of-eight-h100s-free": (4, 0.25),  # only the 8-GPU job cannot
    "every-h100-held-is-not-fragmented": (8, 0.0),  # nothing free, nothing stranded
    "one-h100-held": (1, 0.25),  # the 8-GPU job cannot use the 7 left
}


@pytest.mark.parametrize("held, expected", FRAGMENTATION.values(), ids=FRAGMENTATION.keys())
def test_fragmentation_is_the_share_of_free_capacity_the_mix_cannot_use(view, held, expected):
    devices = [f"gpu-{i}" for i in range(held)]
    fleet = drawn(view, reservation("res-1", "alice", "h100-node-1", *devices))
    node = next(n for n in fleet.nodes if n.name == "h100-node-1")
    assert node.free_gpus == 8 - held
    assert node.fragmentation == pytest.approx(expected)


def test_a_tainted_gpu_is_neither_free_nor_held(view):
    """As `get devices` and explain say: an unhealthy GPU nothing holds is `tainted`, not free,
    in the node's counts, its free capacity and the page."""
    update = cluster_feed().update()
    slices = [
        with_taint(s, {"h100-node-1/gpu-3"}) for found in update.slices.values() for s in found
    ]
    nodes = [n for n in update.nodes.values() if n is not None]
    snapshot = ClusterSnapshot.build(slices, nodes)
    tainted = ViewSnapshot(view.generation, snapshot, view.devices, 0.0)
    fleet = fleet_of(tainted, AllocatedState(snapshot), {}, development_principal())
    node = next(n for n in fleet.nodes if n.name == "h100-node-1")
    assert (node.free_gpus, node.tainted_gpus, node.free_capacity) == (7, 1, 7.0)
    assert gpu(fleet, "h100-node-1", "gpu-3").state == "tainted"
    page = fleet_fragment(fleet)
    assert "7 of 8 GPUs free, 1 tainted," in page
    assert "23 free, 1 tainted;" in page
    assert page.count('class="gpu tainted"') == 1


def test_a_slice_taken_from_a_free_mig_node_fragments_it_more_than_a_whole_gpu(view):
    """A 1g slice breaks a whole GPU and leaves partial capacity: worse than a whole GPU gone."""
    slice_node = drawn(view, reservation("r", "a", "a100-node-1", "gpu-0-mig-1g10gb-15-0"))
    whole_node = drawn(view, reservation("r", "a", "a100-node-1", "gpu-0"))
    by_slice = next(n for n in slice_node.nodes if n.name == "a100-node-1")
    by_whole = next(n for n in whole_node.nodes if n.name == "a100-node-1")
    assert 0 < by_whole.fragmentation < by_slice.fragmentation < 1


VIEWERS = {
    "development-mode-sees-owner-and-id": (
        development_principal(),
        ("team-a/alice", "res-1", False),
    ),
    "the-web-viewer-under-a-policy-sees-the-tenant-only": (WEB_VIEWER, ("team-a", "", True)),
}


@pytest.mark.parametrize("viewer, expected", VIEWERS.values(), ids=VIEWERS.keys())
def test_holders_are_shown_as_the_viewer_may_see_them(view, viewer, expected):
    held = reservation("res-1", "team-a/alice", "l40s-node-1", "gpu-1")
    state = AllocatedState(view.snapshot).with_allocation(held.allocations[0], held.id)
    fleet = fleet_of(view, state, {held.id: held}, viewer)
    (holder,) = gpu(fleet, "l40s-node-1", "gpu-1").placements[0].holders
    assert (holder.owner, holder.reservation_id, holder.redacted) == expected
    assert (holder.state, holder.expires_at) == ("RESERVED", 1_120.0)
    assert fleet.holders() == {expected[0]: 1}


def test_a_placement_being_reserved_shows_as_reserving(view):
    fleet = drawn(view, pending=("l40s-node-1", "gpu-3"))
    (holder,) = gpu(fleet, "l40s-node-1", "gpu-3").placements[0].holders
    assert (holder.owner, holder.state, holder.reservation_id) == (PENDING_OWNER, "PENDING", "")
