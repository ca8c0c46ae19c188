"""Node topologies and topology constraints: NVLink cliques, PCIe roots, NUMA nodes, NICs.

Tables of scenarios on small nodes whose wiring is spelled out next to them (an NVSwitch board,
GPUs bridged in pairs, a PCIe-only box), then the annotation format, then a property: every
required constraint holds in every allocation returned, and the solver finds a placement
whenever an exhaustive search over device subsets does.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Policy,
    SelectorCache,
    Unsatisfiable,
    solve,
)
from services.allocator.core.explain import (
    ReasonCode,
    TopologyProblem,
    TopologyProblemKind,
    detail_text,
    topology_problem_text,
)
from services.allocator.core.topology import GpuPlace, NicInfo, NodeTopology, PcieRelation
from services.allocator.core.topology_constraints import (
    ANNOTATION,
    RequestRef,
    TopologyConstraint,
    TopologyKind,
    TopologyState,
    constraints_from_annotations,
    format_annotation,
    parse_annotation,
)
from services.common.dra.model import AllocationResult, DeviceID, ResourceClaim
from services.common.dra.parse import decode_object
from services.common.dra.serialize import to_dict
from services.common.errors import InvalidArgument
from tests.builders import DRIVER, allocation, claim, classes, cls, device, result, slice_

GPU = classes(cls("gpu", f'device.driver == "{DRIVER}"'))
NVLINK = TopologyKind.NVLINK_CONNECTED


def gpus(node: str, count: int, *, mig: Sequence[str] = ()) -> object:
    """`count` whole GPUs `gpu-<i>` (plus MIG devices named the driver's way)."""
    devices = [device(f"gpu-{i}") for i in range(count)]
    devices += [device(name) for name in mig]
    return slice_(f"{node}-gpus", *devices).node(node).build()


def nvswitch(node: str, count: int = 8) -> NodeTopology:
    """All pairs NV18; GPUs 0..count/2-1 on NUMA node 0; a switch (and a NIC) per pair."""
    names = [f"gpu-{i}" for i in range(count)]
    return NodeTopology.build(
        driver=DRIVER,
        pool=node,
        nvlinks={(a, b): 18 for a, b in itertools.combinations(names, 2)},
        numa={n: i * 2 // count for i, n in enumerate(names)},
        pcie_roots={n: f"root-{i // 2}" for i, n in enumerate(names)},
        pcie_switches={n: f"switch-{i // 2}" for i, n in enumerate(names)},
        nics=[
            NicInfo(f"nic-{k}", f"switch-{k}", f"root-{k}", k * 4 // count)
            for k in range(count // 2)
        ],
    )


def pairs(node: str, count: int = 4, across: int = 0) -> NodeTopology:
    """GPUs bridged in pairs (NV12 within 2k, 2k+1), `across` links between pairs; one NIC on
    the first pair's switch; NUMA node = pair number // 1 (each pair its own root and NUMA)."""
    names = [f"gpu-{i}" for i in range(count)]
    links = {(names[i], names[i + 1]): 12 for i in range(0, count, 2)}
    if across:
        for a, b in itertools.combinations(range(count), 2):
            if a // 2 != b // 2:
                links[(names[a], names[b])] = across
    return NodeTopology.build(
        driver=DRIVER,
        pool=node,
        nvlinks=links,
        numa={n: i // 2 for i, n in enumerate(names)},
        pcie_roots={n: f"root-{i // 2}" for i, n in enumerate(names)},
        pcie_switches={n: f"switch-{i // 2}" for i, n in enumerate(names)},
        nics=[NicInfo("nic-0", "switch-0", "root-0", 0)],
    )


def held_on(node: str, *devices: str) -> tuple[str, AllocationResult]:
    return (f"default/held-{node}", allocation(*(result("x", d, pool=node) for d in devices)))


@dataclass
class Case:
    slices: list[object]
    topologies: dict[str, NodeTopology]
    claims: list[ResourceClaim]
    constraints: list[TopologyConstraint]
    node: str | None = "node-1"
    held: list[tuple[str, AllocationResult]] = field(default_factory=list)
    policy: Policy = Policy.BINPACK
    want: dict[str, list[str]] | None = None  # node -> devices, None: unsatisfiable
    reason: str = ""  # in the explanation of an unsatisfiable case
    preferred_missed: int = 0


def two(name: str = "c", count: int = 2) -> ResourceClaim:
    return claim(name).request("g", "gpu", count).build()


CASES = {
    "nvlink-on-pairs-takes-the-free-bridged-pair": Case(
        [gpus("node-1", 4)],
        {"node-1": pairs("node-1")},
        [two()],
        [TopologyConstraint(NVLINK)],
        held=[held_on("node-1", "gpu-0")],
        want={"node-1": ["gpu-2", "gpu-3"]},
    ),
    "nvlink-on-pairs-cannot-give-three": Case(
        [gpus("node-1", 4)],
        {"node-1": pairs("node-1")},
        [two(count=3)],
        [TopologyConstraint(NVLINK)],
        reason="largest free NVLink-connected set is 2",
    ),
    "nvlink-min-links-rules-out-the-weak-cross-links": Case(
        [gpus("node-1", 4)],
        {"node-1": pairs("node-1", across=4)},
        [two(count=3)],
        [TopologyConstraint(NVLINK, min_nvlinks=12)],
        reason="largest free NVLink-connected set is 2",
    ),
    "nvlink-with-few-links-accepts-the-partial-mesh": Case(
        [gpus("node-1", 4)],
        {"node-1": pairs("node-1", across=4)},
        [two(count=4)],
        [TopologyConstraint(NVLINK, min_nvlinks=4)],
        want={"node-1": ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]},
    ),
    "nvswitch-is-one-clique": Case(
        [gpus("node-1", 8)],
        {"node-1": nvswitch("node-1")},
        [two(count=4)],
        [TopologyConstraint(NVLINK, min_nvlinks=18)],
        held=[held_on("node-1", "gpu-0", "gpu-2", "gpu-4", "gpu-6")],
        want={"node-1": ["gpu-1", "gpu-3", "gpu-5", "gpu-7"]},
    ),
    "a-mig-device-is-not-nvlink-connected": Case(
        [gpus("node-1", 2, mig=["gpu-0-mig-1g5gb-19-0", "gpu-1-mig-1g5gb-19-0"])],
        {"node-1": pairs("node-1", count=2)},
        [two()],
        [TopologyConstraint(NVLINK)],
        held=[held_on("node-1", "gpu-0")],
        reason="largest free NVLink-connected set is 1",
    ),
    "same-numa-node-counts-mig-devices-where-their-gpu-is": Case(
        [gpus("node-1", 2, mig=["gpu-0-mig-1g5gb-19-0", "gpu-1-mig-1g5gb-19-0"])],
        {"node-1": pairs("node-1", count=2)},
        [two()],
        [TopologyConstraint(TopologyKind.SAME_NUMA_NODE)],
        held=[held_on("node-1", "gpu-1")],
        want={"node-1": ["gpu-0", "gpu-0-mig-1g5gb-19-0"]},
    ),
    "same-pcie-root-skips-gpus-of-other-roots": Case(
        [gpus("node-1", 4)],
        {"node-1": pairs("node-1")},
        [two()],
        [TopologyConstraint(TopologyKind.SAME_PCIE_ROOT)],
        held=[held_on("node-1", "gpu-1")],
        want={"node-1": ["gpu-2", "gpu-3"]},
    ),
    "gpu-nic-affinity-takes-gpus-under-the-nic-switch": Case(
        [gpus("node-1", 4)],
        {"node-1": pairs("node-1")},
        [claim("c").request("g").build()],
        [TopologyConstraint(TopologyKind.GPU_NIC_AFFINITY)],
        held=[held_on("node-1", "gpu-0")],
        want={"node-1": ["gpu-1"]},
    ),
    "gpu-nic-affinity-fails-when-the-near-gpus-are-taken": Case(
        [gpus("node-1", 4)],
        {"node-1": pairs("node-1")},
        [claim("c").request("g").build()],
        [TopologyConstraint(TopologyKind.GPU_NIC_AFFINITY)],
        held=[held_on("node-1", "gpu-0", "gpu-1")],
        reason="0 have a NIC at PXB or closer",
    ),
    "a-node-without-topology-meets-no-constraint": Case(
        [gpus("node-1", 4)],
        {},
        [two()],
        [TopologyConstraint(NVLINK)],
        reason="the node's topology is not known",
    ),
    "preferred-numa-is-met-when-it-can-be": Case(
        [gpus("node-1", 4)],
        {"node-1": pairs("node-1")},
        [two()],
        [TopologyConstraint(TopologyKind.SAME_NUMA_NODE, required=False)],
        held=[held_on("node-1", "gpu-0")],
        want={"node-1": ["gpu-2", "gpu-3"]},
    ),
    "preferred-numa-is-given-up-when-it-cannot": Case(
        [gpus("node-1", 4)],
        {"node-1": pairs("node-1")},
        [two()],
        [TopologyConstraint(TopologyKind.SAME_NUMA_NODE, required=False)],
        held=[held_on("node-1", "gpu-0", "gpu-3")],
        want={"node-1": ["gpu-1", "gpu-2"]},
        preferred_missed=1,
    ),
    "one-constraint-over-requests-of-two-claims": Case(
        [gpus("node-1", 4)],
        {"node-1": pairs("node-1")},
        [claim("a").request("g").build(), claim("b").request("g").build()],
        [TopologyConstraint(NVLINK, (RequestRef("g", "a"), RequestRef("g", "default/b")))],
        held=[held_on("node-1", "gpu-1")],
        want={"node-1": ["gpu-2", "gpu-3"]},
    ),
    "a-constraint-over-other-requests-leaves-this-one-free": Case(
        [gpus("node-1", 4)],
        {"node-1": pairs("node-1")},
        [claim("c").request("g").request("h").build()],
        [TopologyConstraint(NVLINK, (RequestRef("h"),))],
        held=[held_on("node-1", "gpu-1")],
        want={"node-1": ["gpu-0", "gpu-2"]},
    ),
    "node-choice-skips-nodes-without-a-connected-pair": Case(
        [gpus("node-a", 4), gpus("node-b", 4)],
        {"node-a": pairs("node-a"), "node-b": pairs("node-b")},
        [two()],
        [TopologyConstraint(NVLINK)],
        node=None,
        held=[held_on("node-a", "gpu-0", "gpu-2"), held_on("node-b", "gpu-0")],
        want={"node-b": ["gpu-2", "gpu-3"]},
    ),
    "default-policy-prefers-nvlinked-gpus-on-its-own": Case(
        [gpus("node-a", 4), gpus("node-b", 4)],
        {"node-a": pairs("node-a"), "node-b": pairs("node-b")},
        [two()],
        [],
        node=None,
        held=[held_on("node-a", "gpu-0", "gpu-2"), held_on("node-b", "gpu-0")],
        want={"node-b": ["gpu-2", "gpu-3"]},
    ),
    "first-fit-has-no-nvlink-taste": Case(
        [gpus("node-a", 4), gpus("node-b", 4)],
        {"node-a": pairs("node-a"), "node-b": pairs("node-b")},
        [two()],
        [],
        node=None,
        policy=Policy.FIRST_FIT,
        held=[held_on("node-a", "gpu-0", "gpu-2"), held_on("node-b", "gpu-0")],
        want={"node-a": ["gpu-1", "gpu-3"]},
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_topology_constraints(case: Case) -> None:
    snapshot = ClusterSnapshot.build(case.slices, topologies=case.topologies)  # type: ignore[arg-type]
    state = AllocatedState.build(snapshot, case.held)
    outcome = solve(
        snapshot,
        state,
        GPU,
        case.claims,
        node=case.node,
        policy=case.policy,
        selectors=SelectorCache(),
        explain=True,
        topology_constraints=case.constraints,
    )
    if case.want is None:
        assert isinstance(outcome, Unsatisfiable)
        assert case.reason in "\n".join(outcome.explanation.lines())
        return
    assert isinstance(outcome, Allocated), "\n".join(outcome.explanation.lines())
    [(node, devices)] = case.want.items()
    assert outcome.node == node
    assert sorted(r.device for a in outcome.allocations for r in a.results) == devices
    assert outcome.score.preferred_missed == case.preferred_missed


def test_unknown_request_in_a_constraint_is_invalid() -> None:
    snapshot = ClusterSnapshot.build([gpus("node-1", 2)])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match=r"topologyConstraints\[0\]\.requests\[0\]"):
        solve(
            snapshot,
            AllocatedState(snapshot),
            GPU,
            [two()],
            selectors=SelectorCache(),
            topology_constraints=[TopologyConstraint(NVLINK, (RequestRef("nope"),))],
        )


# --- NodeTopology -----------------------------------------------------------------------------


def test_node_topology_queries() -> None:
    topology = pairs("node-1", across=4)
    gpu = [DeviceID(DRIVER, "node-1", f"gpu-{i}") for i in range(4)]
    mig = DeviceID(DRIVER, "node-1", "gpu-2-mig-1g5gb-19-0")
    assert topology.gpu_of(mig) == gpu[2] and not topology.is_whole_gpu(mig)
    assert topology.place(mig) == GpuPlace(numa=1, pcie_root="root-1", pcie_switch="switch-1")
    assert (topology.links(gpu[0], gpu[1]), topology.links(gpu[0], gpu[2])) == (12, 4)
    assert topology.links(gpu[0], mig) == 0
    assert topology.nic_relation(gpu[1]) is PcieRelation.PIX
    assert topology.nic_relation(gpu[2]) is PcieRelation.SYS
    assert topology.largest_clique(gpu, 12) == 2 and topology.largest_clique(gpu, 4) == 4
    assert topology.nvlink_bandwidth(gpu[:3]) == 12 + 4 + 4
    assert topology.signature() == pairs("node-2", across=4).signature()
    assert topology.signature() != pairs("node-2").signature()
    assert topology.for_pool("node-9").gpus.keys() == pairs("node-9", across=4).gpus.keys()


@pytest.mark.parametrize(
    ("nic", "relation"),
    [
        pytest.param(NicInfo("n", "switch-0", "root-0", 0), PcieRelation.PIX, id="same-switch"),
        pytest.param(NicInfo("n", "switch-9", "root-0", 0), PcieRelation.PHB, id="same-root"),
        pytest.param(NicInfo("n", "switch-9", "root-9", 0), PcieRelation.NODE, id="same-numa"),
        pytest.param(NicInfo("n", None, None, 1), PcieRelation.SYS, id="other-numa"),
    ],
)
def test_nic_relations_follow_from_switch_root_and_numa(
    nic: NicInfo, relation: PcieRelation
) -> None:
    topology = NodeTopology.build(
        pool="p",
        numa={"g": 0},
        pcie_roots={"g": "root-0"},
        pcie_switches={"g": "switch-0"},
        nics=[nic],
    )
    assert topology.nic_relation(DeviceID("gpu.nvidia.com", "p", "g")) is relation


def test_largest_clique_of_a_big_node_uses_networkx() -> None:
    names = [f"gpu-{i}" for i in range(72)]  # an NVL72-sized NVLink domain, one clique
    topology = NodeTopology.build(
        pool="p", nvlinks={(a, b): 18 for a, b in itertools.combinations(names, 2)}
    )
    ids = [DeviceID("gpu.nvidia.com", "p", n) for n in names]
    assert topology.largest_clique(ids) == 72


@settings(max_examples=200, deadline=None)
@given(
    links=st.dictionaries(
        st.tuples(st.integers(0, 7), st.integers(0, 7)).filter(lambda p: p[0] < p[1]),
        st.integers(1, 4),
    ),
    members=st.sets(st.integers(0, 7)),
    min_links=st.integers(0, 4),
)
def test_largest_clique_equals_brute_force(
    links: dict[tuple[int, int], int], members: set[int], min_links: int
) -> None:
    """The bitmask search (GPU adjacency read once per topology) against every subset."""
    names = [f"gpu-{i}" for i in range(8)]
    topology = NodeTopology.build(
        pool="p",
        gpus=names,
        nvlinks={(names[a], names[b]): n for (a, b), n in links.items()},
    )
    ids = [DeviceID("gpu.nvidia.com", "p", names[i]) for i in sorted(members)]

    def connected(subset: Sequence[DeviceID]) -> bool:
        return all(topology.links(a, b) >= min_links for a, b in itertools.combinations(subset, 2))

    subsets = (s for r in range(len(ids) + 1) for s in itertools.combinations(ids, r))
    brute = max((len(s) for s in subsets if connected(s)), default=0)
    assert topology.largest_clique(ids, min_links) == brute


# --- the annotation -------------------------------------------------------------------------------


def annotated(text: str) -> ResourceClaim:
    return ResourceClaim("c", "default", requests=two().requests, annotations={ANNOTATION: text})


def test_annotation_parses_and_round_trips() -> None:
    text = json.dumps(
        [
            {"kind": "NVLinkConnected", "requests": ["g"], "minNVLinks": 4},
            {"kind": "GPUNICAffinity", "enforcement": "Preferred", "maxNICRelation": "PIX"},
        ]
    )
    parsed = parse_annotation(annotated(text))
    assert parsed == (
        TopologyConstraint(NVLINK, (RequestRef("g", "default/c"),), True, 4),
        TopologyConstraint(
            TopologyKind.GPU_NIC_AFFINITY,
            (RequestRef("", "default/c"),),
            False,
            1,
            PcieRelation.PIX,
        ),
    )
    again = parse_annotation(annotated(format_annotation(parsed)))
    assert again == parsed
    # annotations survive the Kubernetes object round trip, so the constraints do too
    claim_ = annotated(text)
    restored = decode_object(to_dict(claim_))
    assert isinstance(restored, ResourceClaim)
    assert constraints_from_annotations([restored]) == parsed


@pytest.mark.parametrize(
    ("text", "path"),
    [
        pytest.param("{", "metadata.annotations", id="not-json"),
        pytest.param("{}", "metadata.annotations", id="not-a-list"),
        pytest.param('[{"kind": "Nope"}]', "[0].kind", id="unknown-kind"),
        pytest.param('[{"kind": "SameNUMANode", "x": 1}]', "[0].x", id="unknown-field"),
        pytest.param(
            '[{"kind": "NVLinkConnected", "minNVLinks": 0}]', "[0].minNVLinks", id="links"
        ),
        pytest.param(
            '[{"kind": "GPUNICAffinity", "maxNICRelation": "FAR"}]', "[0].maxNICRelation", id="nic"
        ),
        pytest.param(
            '[{"kind": "SameNUMANode", "enforcement": "Maybe"}]', "[0].enforcement", id="enf"
        ),
        pytest.param('[{"kind": "SameNUMANode", "requests": "g"}]', "[0].requests", id="requests"),
    ],
)
def test_bad_annotation_names_the_field(text: str, path: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_annotation(annotated(text), "claims[0].")
    assert raised.value.field_path.startswith(f'claims[0].metadata.annotations["{ANNOTATION}"]')
    assert path in raised.value.field_path


# --- property: required constraints always hold --------------------------------------------------

KINDS = [
    NVLINK,
    TopologyKind.SAME_PCIE_ROOT,
    TopologyKind.SAME_NUMA_NODE,
    TopologyKind.GPU_NIC_AFFINITY,
]


@st.composite
def wired_nodes(draw: st.DrawFn) -> tuple[NodeTopology, int, list[str]]:
    count = draw(st.integers(2, 6))
    names = [f"gpu-{i}" for i in range(count)]
    links = {
        pair: draw(st.sampled_from([2, 12]))
        for pair in itertools.combinations(names, 2)
        if draw(st.booleans())
    }
    topology = NodeTopology.build(
        driver=DRIVER,
        pool="node-1",
        nvlinks=links,
        numa={n: draw(st.integers(0, 1)) for n in names},
        pcie_roots={n: f"root-{draw(st.integers(0, 2))}" for n in names},
        pcie_switches={n: f"switch-{draw(st.integers(0, 2))}" for n in names},
        nics=[NicInfo("nic-0", f"switch-{draw(st.integers(0, 2))}", "root-0", 0)],
    )
    held = [n for n in names if draw(st.integers(0, 3)) == 0]
    return topology, count, held


def holds(
    constraint: TopologyConstraint, topology: NodeTopology, devices: Sequence[DeviceID]
) -> bool:
    if constraint.kind is NVLINK:
        return all(topology.is_whole_gpu(d) for d in devices) and all(
            topology.links(a, b) >= constraint.min_nvlinks
            for a, b in itertools.combinations(devices, 2)
        )
    if constraint.kind is TopologyKind.GPU_NIC_AFFINITY:
        return all(
            (r := topology.nic_relation(d)) is not None and r <= constraint.max_nic_relation
            for d in devices
        )
    places = [topology.place(d) for d in devices]
    if any(p is None for p in places):
        return False
    attribute = "pcie_root" if constraint.kind is TopologyKind.SAME_PCIE_ROOT else "numa"
    return len({getattr(p, attribute) for p in places}) <= 1


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    wired=wired_nodes(),
    counts=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=2),
    min_links=st.sampled_from([1, 12]),
)
def test_required_constraints_hold_and_a_fit_is_found(
    wired: tuple[NodeTopology, int, list[str]],
    counts: list[int],
    kinds: list[TopologyKind],
    min_links: int,
) -> None:
    topology, count, held = wired
    snapshot = ClusterSnapshot.build([gpus("node-1", count)], topologies={"node-1": topology})  # type: ignore[list-item]
    state = AllocatedState.build(snapshot, [held_on("node-1", *held)] if held else [])
    builder = claim("c")
    for i, n in enumerate(counts):
        builder = builder.request(f"r{i}", "gpu", n)
    constraints = [TopologyConstraint(k, min_nvlinks=min_links) for k in kinds]
    outcome = solve(
        snapshot,
        state,
        GPU,
        [builder.build()],
        node="node-1",
        selectors=SelectorCache(),
        topology_constraints=constraints,
    )
    free = [DeviceID(DRIVER, "node-1", f"gpu-{i}") for i in range(count) if f"gpu-{i}" not in held]
    need = sum(counts)
    exists = any(
        all(holds(c, topology, list(chosen)) for c in constraints)
        for chosen in itertools.combinations(free, need)
    )
    if isinstance(outcome, Allocated):
        chosen = [r.device_id for r in outcome.allocations[0].results]
        assert len(set(chosen)) == need and set(chosen) <= set(free)
        assert all(holds(c, topology, chosen) for c in constraints)
    else:
        assert not outcome.budget_exhausted
        assert not exists


# --- a topology rejection is a fact: the constraint, the problem, its numbers ----------------

SAME_ROOT, SAME_NUMA, NIC = (
    TopologyKind.SAME_PCIE_ROOT,
    TopologyKind.SAME_NUMA_NODE,
    TopologyKind.GPU_NIC_AFFINITY,
)
FACTS = {
    "nvlink-largest-clique": (
        {"node-1": pairs("node-1")},
        TopologyConstraint(NVLINK),
        TopologyProblem(TopologyProblemKind.CLIQUE, count=2),
        "topology constraint #0 (NVLinkConnected): largest free NVLink-connected set is 2",
    ),
    "nvlink-min-links-named": (
        {"node-1": pairs("node-1", across=4)},
        TopologyConstraint(NVLINK, min_nvlinks=12),
        TopologyProblem(TopologyProblemKind.CLIQUE, count=2),
        "topology constraint #0 (NVLinkConnected (>= 12 links)): "
        "largest free NVLink-connected set is 2",
    ),
    "same-pcie-root-at-most": (
        {"node-1": pairs("node-1")},
        TopologyConstraint(SAME_ROOT),
        TopologyProblem(TopologyProblemKind.SHARE_PLACE, count=2),
        "topology constraint #0 (SamePCIeRoot): at most 2 share a PCIe root",
    ),
    "same-numa-at-most": (
        {"node-1": pairs("node-1")},
        TopologyConstraint(SAME_NUMA),
        TopologyProblem(TopologyProblemKind.SHARE_PLACE, count=2),
        "topology constraint #0 (SameNUMANode): at most 2 share a NUMA node",
    ),
    "nic-affinity-close-enough": (
        {"node-1": pairs("node-1")},
        TopologyConstraint(NIC),
        TopologyProblem(TopologyProblemKind.NICS, count=2),
        "topology constraint #0 (GPUNICAffinity (NIC at PXB or closer)): "
        "2 have a NIC at PXB or closer",
    ),
    "topology-unknown": (
        {},
        TopologyConstraint(NVLINK),
        TopologyProblem(TopologyProblemKind.UNKNOWN),
        "topology constraint #0 (NVLinkConnected): the node's topology is not known",
    ),
}


@pytest.mark.parametrize(("topologies", "constraint", "problem", "text"), FACTS.values(), ids=FACTS)
def test_topology_rejections_are_facts(
    topologies: dict[str, NodeTopology],
    constraint: TopologyConstraint,
    problem: TopologyProblem,
    text: str,
) -> None:
    snapshot = ClusterSnapshot.build([gpus("node-1", 4)], topologies=topologies)  # type: ignore[list-item]
    outcome = solve(
        snapshot,
        AllocatedState.build(snapshot, []),
        GPU,
        [two(count=3)],
        node="node-1",
        selectors=SelectorCache(),
        explain=True,
        topology_constraints=[constraint],
    )
    assert isinstance(outcome, Unsatisfiable)
    groups = [g for r in outcome.explanation.requests for g in r.rejections]
    miss = constraint.miss(0, problem)
    assert [(g.code, detail_text(g), g.count) for g in groups if g.fact == miss] == [
        (ReasonCode.CONSTRAINT, text, 4)
    ]


@pytest.mark.parametrize(
    ("constraint", "problem", "text"),
    [
        pytest.param(
            TopologyConstraint(NVLINK, min_nvlinks=12),
            TopologyProblem(TopologyProblemKind.FEW_LINKS, count=4, device="gpu-1"),
            "4 NVLinks to gpu-1 (needs 12)",
            id="few-links-to-a-member",
        ),
        pytest.param(
            TopologyConstraint(NVLINK),
            TopologyProblem(TopologyProblemKind.NOT_WHOLE_GPU),
            "not a whole GPU of the node's NVLink topology",
            id="not-a-whole-gpu",
        ),
        pytest.param(
            TopologyConstraint(NIC),
            TopologyProblem(TopologyProblemKind.NO_NIC),
            "no NIC known for its GPU",
            id="no-nic",
        ),
        pytest.param(
            TopologyConstraint(NIC, max_nic_relation=PcieRelation.PIX),
            TopologyProblem(TopologyProblemKind.NIC_TOO_FAR, value="SYS"),
            "closest NIC is SYS (needs PIX or closer)",
            id="nic-too-far",
        ),
        pytest.param(
            TopologyConstraint(SAME_ROOT),
            TopologyProblem(TopologyProblemKind.PLACE_UNKNOWN),
            "PCIe root not known",
            id="root-unknown",
        ),
        pytest.param(
            TopologyConstraint(SAME_NUMA),
            TopologyProblem(TopologyProblemKind.PLACE_DIFFERS, value="1", other="0"),
            "NUMA node 1 differs from 0",
            id="numa-differs",
        ),
    ],
)
def test_topology_problems_in_words(
    constraint: TopologyConstraint, problem: TopologyProblem, text: str
) -> None:
    assert topology_problem_text(constraint.miss(2, problem)) == text


def test_topology_state_problems_are_facts() -> None:
    """What the search sees device by device: too few links to a member, a different NUMA
    node, a MIG device in an NVLink set, no topology at all."""
    topology = pairs("node-1", across=4)
    gpu = [DeviceID(DRIVER, "node-1", f"gpu-{i}") for i in range(4)]
    links = TopologyState(TopologyConstraint(NVLINK, min_nvlinks=12), topology)
    links.add(gpu[0])
    assert links.problem(gpu[1]) is None
    assert links.problem(gpu[2]) == TopologyProblem(
        TopologyProblemKind.FEW_LINKS, count=4, device="gpu-0"
    )
    mig = DeviceID(DRIVER, "node-1", "gpu-0-mig-1g.10gb-0")
    assert links.problem(mig) == TopologyProblem(TopologyProblemKind.NOT_WHOLE_GPU)
    numa = TopologyState(TopologyConstraint(SAME_NUMA), topology)
    numa.add(gpu[0])
    assert numa.problem(gpu[2]) == TopologyProblem(
        TopologyProblemKind.PLACE_DIFFERS, value="1", other="0"
    )
    assert TopologyState(TopologyConstraint(NVLINK), None).problem(gpu[0]) == TopologyProblem(
        TopologyProblemKind.UNKNOWN
    )
