"""ClusterSnapshot (pool gathering per node, node access, interning, speed) and node selectors."""

from __future__ import annotations

from fractions import Fraction

import pytest

from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Policy,
    SelectorCache,
    solve,
)
from services.allocator.core.nodeselect import (
    InvalidNodeSelector,
    NodeAccess,
    allocation_node_selector,
    check_node_selector,
    node_selector_matches,
)
from services.common.dra.model import NodeSelector
from services.common.errors import FailedPrecondition, NotFound
from tests.builders import (
    DRIVER,
    claim,
    classes,
    cls,
    device,
    node,
    node_selector,
    req,
    slice_,
    snapshot,
)


def pools(snap: ClusterSnapshot, node_name: str) -> list[tuple[str, int, bool, bool, list[str]]]:
    return [
        (
            p.pool.id,
            p.pool.generation,
            p.pool.incomplete,
            p.pool.invalid,
            [e.id.device for e in p.devices],
        )
        for p in snap.view(node_name).pools
    ]


def test_newest_generation_wins_and_incomplete_pools_are_flagged() -> None:
    snap = snapshot(
        slice_("old", device("gpu-old")).pool("node-1", generation=1),
        slice_("new-b", device("gpu-b")).pool("node-1", generation=2, count=3),
        slice_("new-a", device("gpu-a")).pool("node-1", generation=2, count=3),
    )
    assert pools(snap, "node-1") == [(f"{DRIVER}/node-1", 2, True, False, ["gpu-a", "gpu-b"])]


def test_duplicate_device_names_make_the_pool_invalid() -> None:
    snap = snapshot(
        slice_("a", device("gpu-0")).pool("node-1", count=2),
        slice_("b", device("gpu-0")).pool("node-1", count=2),
    )
    (pool,) = snap.view("node-1").pools
    assert pool.pool.invalid_reason == "duplicate device name gpu-0"


def test_pools_are_sorted_by_driver_then_name() -> None:
    snap = snapshot(
        slice_("z", device("n")).driver("b.example.com").pool("a"),
        slice_("y", device("g")).pool("b"),
        slice_("x", device("g")).pool("a"),
    )
    assert [p[0] for p in pools(snap, "node-1")] == [
        "b.example.com/a",
        f"{DRIVER}/a",
        f"{DRIVER}/b",
    ]


def test_node_access_decides_what_each_node_sees() -> None:
    snap = snapshot(
        slice_("local", device("gpu-0")).node("node-1"),
        slice_("everywhere", device("fabric-0")).all_nodes().pool("fabric"),
        slice_("rack-a", device("nic-0"))
        .nodes(node_selector(req("rack", "In", "a")))
        .pool("rack-a"),
        slice_("per-device", device("p-1").on_node("node-2"), device("p-2").on_all_nodes())
        .per_device()
        .pool("pd"),
        slice_("nowhere", device("x")).unreachable().pool("nowhere"),
        nodes=[node("node-1", rack="a"), node("node-2", rack="b")],
    )
    seen = {name: sorted(str(e.id) for e in snap.view(name).devices()) for name in snap.node_names}
    assert seen == {
        "node-1": [
            f"{DRIVER}/fabric/fabric-0",
            f"{DRIVER}/node-1/gpu-0",
            f"{DRIVER}/pd/p-2",
            f"{DRIVER}/rack-a/nic-0",
        ],
        "node-2": [f"{DRIVER}/fabric/fabric-0", f"{DRIVER}/pd/p-1", f"{DRIVER}/pd/p-2"],
    }
    assert sorted(str(e.id) for e in snap.nil_view.devices()) == [
        f"{DRIVER}/fabric/fabric-0",
        f"{DRIVER}/pd/p-2",
    ]


def test_nodes_named_by_slices_exist_without_labels() -> None:
    snap = snapshot(slice_("s", device("gpu-0")).node("node-9"))
    assert snap.node_names == ("node-9",)
    assert snap.view("node-9").node is not None
    with pytest.raises(NotFound, match="node node-1 not found"):
        snap.view("node-1")


def test_same_content_shares_one_cel_projection() -> None:
    snap = snapshot(
        slice_(
            "s",
            device("a").attr("model", "H100"),
            device("b").attr("model", "H100"),
            device("c").attr("model", "A100"),
        )
    )
    a, b, c = snap.view("node-1").devices()
    assert a.cel is b.cel and a.profile == b.profile
    assert a.cel is not c.cel


def test_invalid_node_selector_is_ignored_with_a_warning() -> None:
    bad = NodeSelector(node_selector(req("gen", "Gt", "x")).node_selector_terms)
    snap = snapshot(
        slice_("s", device("gpu-0")).nodes(bad).pool("p"), nodes=[node("node-1", gen="3")]
    )
    assert list(snap.view("node-1").devices()) == []
    assert snap.warnings == (
        "slice s: invalid node selector, ignored: "
        "nodeSelectorTerms[0].matchExpressions[0]: values: must be an integer",
    )


def test_counter_consumption_is_resolved_in_the_devices_own_slice() -> None:
    snap = snapshot(
        slice_(
            "s",
            device("mig")
            .consumes("gpu-0", memory="10Gi", unknown="1")
            .consumes("gone", memory="1"),
        ).counter_set("gpu-0", memory="80Gi")
    )
    (entry,) = snap.view("node-1").devices()
    assert [(str(c), a) for c, a in entry.counters] == [
        (f"{DRIVER}/node-1/gpu-0/memory", Fraction(10 * 2**30))
    ]


# --- node selectors -------------------------------------------------------------------------

LABELS = node("n1", zone="z1", gen="4")


@pytest.mark.parametrize(
    ("selector", "want"),
    [
        pytest.param(node_selector(req("zone", "In", "z1", "z2")), True, id="in"),
        pytest.param(node_selector(req("zone", "NotIn", "z1")), False, id="not-in"),
        pytest.param(node_selector(req("rack", "NotIn", "r1")), True, id="not-in-missing-label"),
        pytest.param(node_selector(req("zone", "Exists")), True, id="exists"),
        pytest.param(node_selector(req("zone", "DoesNotExist")), False, id="does-not-exist"),
        pytest.param(node_selector(req("gen", "Gt", "3")), True, id="gt"),
        pytest.param(node_selector(req("gen", "Lt", "4")), False, id="lt"),
        pytest.param(
            node_selector(fields=[req("metadata.name", "In", "n1")]), True, id="field-name"
        ),
        pytest.param(
            node_selector(fields=[req("metadata.name", "NotIn", "n1")]), False, id="field-not-in"
        ),
        pytest.param(
            node_selector(req("zone", "In", "z1"), req("gen", "Lt", "2")),
            False,
            id="and-within-term",
        ),
        pytest.param(
            NodeSelector(
                node_selector(req("zone", "In", "z9")).node_selector_terms
                + node_selector(req("gen", "Gt", "1")).node_selector_terms
            ),
            True,
            id="or-across-terms",
        ),
        pytest.param(node_selector(), False, id="empty-term-matches-nothing"),
    ],
)
def test_node_selector_matches(selector: NodeSelector, want: bool) -> None:
    check_node_selector(selector)
    assert node_selector_matches(selector, LABELS) is want
    assert node_selector_matches(selector, None) is False


@pytest.mark.parametrize(
    "selector",
    [
        pytest.param(node_selector(req("zone", "In")), id="in-without-values"),
        pytest.param(node_selector(req("zone", "Exists", "x")), id="exists-with-values"),
        pytest.param(node_selector(req("gen", "Gt", "1", "2")), id="gt-two-values"),
        pytest.param(node_selector(req("zone", "Near", "x")), id="unknown-operator"),
        pytest.param(node_selector(fields=[req("metadata.name", "Exists")]), id="field-exists"),
        pytest.param(
            node_selector(fields=[req("metadata.name", "In", "a", "b")]), id="field-two-values"
        ),
    ],
)
def test_invalid_node_selectors_are_refused(selector: NodeSelector) -> None:
    with pytest.raises(InvalidNodeSelector):
        check_node_selector(selector)


def test_allocation_node_selector_merges_terms_and_pins_node_local_devices() -> None:
    east = NodeAccess(node_selector=node_selector(req("region", "In", "east", "west")))
    same = NodeAccess(node_selector=node_selector(req("region", "In", "west", "east")))
    rack = NodeAccess(node_selector=node_selector(req("rack", "Exists")))
    assert allocation_node_selector(
        [east, same, rack, NodeAccess(all_nodes=True)], "n1"
    ) == node_selector(req("region", "In", "east", "west"), req("rack", "Exists"))
    assert allocation_node_selector([east, NodeAccess(node_name="n1")], "n1") == node_selector(
        fields=[req("metadata.name", "In", "n1")]
    )
    assert allocation_node_selector([NodeAccess(all_nodes=True)], "n1") is None
    two_terms = NodeSelector(node_selector(req("a", "Exists")).node_selector_terms * 2)
    with pytest.raises(
        FailedPrecondition, match="unsupported ResourceSlice.NodeSelector with 2 terms"
    ):
        allocation_node_selector([NodeAccess(node_selector=two_terms)], "n1")


# --- scale ----------------------------------------------------------------------------------


def test_ten_thousand_gpus_share_one_cel_profile() -> None:
    """1,250 nodes x 8 GPUs with per-GPU attributes (uuid, index) as the NVIDIA driver
    publishes them: selectors that do not read uuid/index evaluate once for all of them.
    (How fast this is belongs to `make bench`, not to a unit test.)"""
    slices = [
        slice_(
            f"node-{n:04d}-gpus",
            *(
                device(f"gpu-{i}")
                .attr("productName", "NVIDIA H100 80GB HBM3")
                .attr("uuid", f"GPU-{n:04d}-{i}")
                .attr("index", i)
                .version("driverVersion", "550.54.15")
                .capacity("memory", "80Gi")
                for i in range(8)
            ),
        )
        .node(f"node-{n:04d}")
        .build()
        for n in range(1250)
    ]
    snap = ClusterSnapshot.build(slices)
    assert len(snap.node_names) == 1250
    gpu = classes(cls("gpu", f'device.driver == "{DRIVER}"'))
    claims = [
        claim("c")
        .request(
            "g", "gpu", 4, f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA H100")'
        )
        .build()
    ]
    selectors = SelectorCache()
    solve(snap, AllocatedState(snap), gpu, claims, selectors=selectors)  # warm the CEL compiler
    outcome = solve(
        snap, AllocatedState(snap), gpu, claims, selectors=selectors, policy=Policy.BINPACK
    )
    assert isinstance(outcome, Allocated) and outcome.node == "node-0000"
    assert outcome.stats.cel_evaluations == 0  # one evaluation per profile, done in the warm-up
