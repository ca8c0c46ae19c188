"""ClusterView: coalesced rebuilds, resets, waiting for generations; StaticFeed."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from services.allocator.app.cluster_view import ClusterView
from services.allocator.app.inventory_feed import CLUSTER_KEY, InventoryUpdate, StaticFeed
from services.common.dra.model import Node, ResourceSlice
from services.common.errors import Unavailable
from services.common.manifests import load_manifests

CLUSTER = Path(__file__).resolve().parents[3] / "examples" / "cluster"


def _slices(name: str) -> tuple[ResourceSlice, ...]:
    return tuple(o for o in load_manifests([str(CLUSTER / name)]) if isinstance(o, ResourceSlice))


H100 = _slices("h100-node-1.yaml")
L40S = _slices("l40s-node.yaml")


@pytest.fixture
def view():
    made = ClusterView(min_interval=0.05)
    yield made
    made.close()


def _names(view: ClusterView) -> list[str]:
    current = view.flush()
    return [v.name for v in current.snapshot.views() if v.name and v.device_count]


def test_a_thousand_updates_cause_few_rebuilds_and_the_last_one_wins(view):
    view.apply(InventoryUpdate(1, True, {"h100-node-1": H100}))
    view.flush()
    started = time.monotonic()
    for generation in range(2, 1002):
        relabeled = {"h100-node-1": H100, "l40s-node-1": L40S if generation % 2 else ()}
        view.apply(InventoryUpdate(generation, False, relabeled))
    assert time.monotonic() - started < 1.0  # filing an update is cheap
    current = view.flush()
    assert current.generation == 1001
    assert _names(view) == ["h100-node-1", "l40s-node-1"]  # 1001 is odd: L40S present
    assert view.builds < 60


@pytest.mark.parametrize(
    ("updates", "nodes"),
    [
        pytest.param(
            [InventoryUpdate(1, True, {"h100-node-1": H100, "l40s-node-1": L40S})],
            ["h100-node-1", "l40s-node-1"],
            id="reset-with-two-nodes",
        ),
        pytest.param(
            [
                InventoryUpdate(1, True, {"h100-node-1": H100, "l40s-node-1": L40S}),
                InventoryUpdate(2, False, {"l40s-node-1": ()}),
            ],
            ["h100-node-1"],
            id="delta-deletes-a-key",
        ),
        pytest.param(
            [
                InventoryUpdate(5, True, {"h100-node-1": H100}),
                InventoryUpdate(1, True, {"l40s-node-1": L40S}),
            ],
            ["l40s-node-1"],
            id="reset-replaces-everything-even-at-a-lower-generation",
        ),
    ],
)
def test_updates_shape_the_view(view, updates, nodes):
    for update in updates:
        view.apply(update)
    assert _names(view) == nodes
    assert view.flush().generation == updates[-1].generation


def test_nodes_carry_labels_and_deletes(view):
    labeled = Node("h100-node-1", {"zone": "a"})
    view.apply(InventoryUpdate(1, True, {"h100-node-1": H100}, {"h100-node-1": labeled}))
    assert view.flush().snapshot.view("h100-node-1").node == labeled
    view.apply(InventoryUpdate(2, False, {}, {"h100-node-1": None}))
    assert view.flush().snapshot.view("h100-node-1").node == Node("h100-node-1")


def test_cluster_scoped_slices_are_filed_under_the_cluster_key():
    shared = dataclasses.replace(H100[0], name="shared", node_name=None, all_nodes=True)
    update = StaticFeed([shared, *L40S]).update()
    assert update.reset and set(update.slices) == {CLUSTER_KEY, "l40s-node-1"}


def test_waiting_for_a_generation_times_out_with_unavailable(view):
    with pytest.raises(Unavailable, match="no inventory snapshot yet"):
        view.require(0, timeout=0.05)
    view.apply(InventoryUpdate(3, True, {"h100-node-1": H100}))
    assert view.require(3, timeout=5).generation == 3
    started = time.monotonic()
    with pytest.raises(Unavailable, match="generation 4 not reached"):
        view.require(4, timeout=0.1)
    assert time.monotonic() - started < 1.0


def test_a_bad_update_keeps_the_last_view(view):
    view.apply(InventoryUpdate(1, True, {"h100-node-1": H100}))
    view.flush()
    broken = dataclasses.replace(H100[0], devices=None)  # type: ignore[arg-type]
    view.apply(InventoryUpdate(2, False, {"h100-node-1": (broken,)}))
    assert view.flush().generation == 1


def test_static_feed_reads_slices_and_nodes_from_files():
    feed = StaticFeed.from_paths([str(CLUSTER)])
    received: list[InventoryUpdate] = []
    feed.follow(received.append).close()
    [update] = received
    assert update.reset and update.generation == 1
    assert sorted(update.slices) == ["a100-node-1", "h100-node-1", "h100-node-2", "l40s-node-1"]
    labeled = update.nodes["h100-node-1"]
    assert labeled is not None and labeled.labels["nvidia.com/gpu.count"] == "8"
