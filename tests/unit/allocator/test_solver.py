"""The solver against the DRA allocator semantics (resource.k8s.io/v1, Kubernetes 1.34).

One table of scenarios, named like upstream's `allocatortesting` cases where they mirror one.
Results are compared as sets of `request=pool/device` (driver prefixed when not the default),
errors by type, message and field path, unsatisfiable cases by the key explanation line.
Cases pin `node-1` and use FIRST_FIT unless they test node choice, like upstream's suite.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
from _pytest.mark import ParameterSet

from services.allocator.core import (
    Allocated,
    AllocatedState,
    Policy,
    SearchBudget,
    SelectorCache,
    SolveResult,
    Unsatisfiable,
    solve,
)
from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    DeviceRequest,
    ExactDeviceRequest,
    Node,
    NodeSelector,
    ResourceClaim,
)
from services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from tests.builders import (
    DRIVER,
    NODE,
    ClaimBuilder,
    ClassBuilder,
    DeviceBuilder,
    SliceBuilder,
    allocation,
    claim,
    classes,
    cls,
    device,
    node,
    node_selector,
    q,
    req,
    result,
    slice_,
    snapshot,
    sub,
    toleration,
)

NIC = "nic.example.com"
GPU_CLASS = cls("gpu", f'device.driver == "{DRIVER}"')
NIC_CLASS = cls("nic", f'device.driver == "{NIC}"')
LOCAL = "local"  # want_selector: pinned to the chosen node
UNKNOWN_MODE = cast(AllocationMode, "Some")  # what a newer API version might send
UNSET = "unset"


def mem(at_least: str) -> str:
    return f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{at_least}")) >= 0'


@dataclass
class Case:
    slices: Sequence[SliceBuilder]
    claims: Sequence[ClaimBuilder | ResourceClaim]
    want: Sequence[set[str]] | None = None  # per claim; None: unsatisfiable (or an error)
    classes: Sequence[ClassBuilder] = (GPU_CLASS, NIC_CLASS)
    nodes: Sequence[Node] = (node(NODE, region="region-1"),)
    node: str | None = NODE
    policy: Policy = Policy.FIRST_FIT
    allocated: Sequence[AllocationResult] = ()
    error: tuple[type[Exception], str, str] | None = None  # type, message part, field path
    reason: str = ""  # unsatisfiable: a part of some explanation line
    want_node: str | None = None
    want_selector: NodeSelector | str | None = LOCAL
    check: Callable[[Allocated], None] | None = None
    budget: SearchBudget = field(default_factory=SearchBudget)
    candidates: Sequence[str] | None = None  # the only nodes to choose from (with node=None)
    steps: int | None = None  # search steps (stats.steps) of the explained solve; not for errors
    # Upstream's DRADeviceBindingConditions and DRAResourceClaimDeviceStatus gates, both at once
    # (GPUALLOC_DEVICE_BINDING_CONDITIONS): off, devices with binding conditions are not usable.
    binding_conditions: bool = True


def run(case: Case, *, explain: bool = True) -> SolveResult:
    snap = snapshot(*case.slices, nodes=case.nodes, binding_conditions=case.binding_conditions)
    state = AllocatedState.build(snap, (("default/holder", a) for a in case.allocated))
    claims = [c.build() if isinstance(c, ClaimBuilder) else c for c in case.claims]
    return solve(
        snap,
        state,
        classes(*case.classes),
        claims,
        node=case.node,
        policy=case.policy,
        selectors=SelectorCache(),
        budget=case.budget,
        explain=explain,
        nodes=case.candidates,
    )


def got(allocation: AllocationResult) -> set[str]:
    shown = set()
    for r in allocation.results:
        driver = "" if r.driver == DRIVER else f"{r.driver}:"
        admin = "+admin" if r.admin_access else ""
        binding = ""
        if r.binding_conditions or r.binding_failure_conditions:
            binding = f" until {','.join(r.binding_conditions)}"
            binding += f" unless {','.join(r.binding_failure_conditions)}"
        shown.add(f"{r.request}={driver}{r.pool}/{r.device}{admin}{binding}")
    return shown


def local(name: str) -> NodeSelector:
    return node_selector(fields=[req("metadata.name", "In", name)])


def gpu(name: str, memory: str | None = None) -> DeviceBuilder:
    built = device(name)
    return built.capacity("memory", memory) if memory else built


def mig(name: str, gpu_set: str, memory: str) -> DeviceBuilder:
    return device(name).capacity("memory", memory).consumes(gpu_set, memory=memory)


def one_gpu_slice(name: str = "slice-1", node_name: str = NODE) -> SliceBuilder:
    return slice_(name, device("gpu-0")).node(node_name)


def gpus_on(node_name: str, count: int) -> SliceBuilder:
    return slice_(f"slice-{node_name}", *(device(f"gpu-{i}") for i in range(count))).node(node_name)


# node-1 has 4 GPUs, node-2 has 2, node-3 has 1: BINPACK prefers node-3, then node-2.
THREE_NODES = [gpus_on(NODE, 4), gpus_on("node-2", 2), gpus_on("node-3", 1)]


def check_stats(**want: int) -> Callable[[Allocated], None]:
    def check(allocated: Allocated) -> None:
        assert {name: getattr(allocated.stats, name) for name in want} == want

    return check


def check_configs(*want: tuple[str, tuple[str, ...], str]) -> Callable[[Allocated], None]:
    """Each config as (source, requests, parameters['name'])."""

    def check(allocated: Allocated) -> None:
        configs = allocated.allocations[0].config
        shown = [(str(c.source), c.requests, c.opaque.parameters.get("name")) for c in configs]
        assert shown == list(want)

    return check


def check_consumed(*want: dict[str, str]) -> Callable[[Allocated], None]:
    """Consumed capacity of each claim's first result; every result of a shared device has a
    share ID."""

    def check(allocated: Allocated) -> None:
        for allocation_, consumed in zip(allocated.allocations, want, strict=True):
            first = allocation_.results[0]
            assert first.share_id is not None
            assert first.consumed_capacity == {n: q(v) for n, v in consumed.items()}

    return check


def check_order(*devices: str) -> Callable[[Allocated], None]:
    """The devices of the first claim's results, in result (pick) order."""

    def check(allocated: Allocated) -> None:
        assert [r.device for r in allocated.allocations[0].results] == list(devices)

    return check


def dedicated(allocated: Allocated) -> None:
    for allocation_ in allocated.allocations:
        for r in allocation_.results:
            assert r.share_id is None and not r.consumed_capacity


# Pairs of devices share `i`; two requests of two that must all match cannot fit, but each
# request alone can, so only the search finds out (and `j` keeps every device distinct).
BUDGET_SLICE = slice_(
    "slice-1", *(device(f"gpu-{k}").attr("i", k // 2).attr("j", k) for k in range(12))
)
BUDGET_CLAIM = (
    claim("c0")
    .request("r0", "gpu", 2, f'device.attributes["{DRIVER}"].j >= 0')
    .request("r1", "gpu", 2)
    .match(f"{DRIVER}/i")
)
TWO_GPUS = slice_("slice-1", device("gpu-0"), device("gpu-1"))
ATTRS = slice_(
    "slice-1",
    device("gpu-0").attr("numa", 0).attr("model", "a").attr("nvlink", True).version("fw", "1.0.0"),
    device("gpu-1").attr("numa", 1).attr("model", "a").attr("nvlink", False).version("fw", "2.0.0"),
    device("gpu-2").attr("numa", 1).attr("model", "b").attr("nvlink", True).version("fw", "1.0.0"),
)


def bound_1() -> DeviceBuilder:
    """Upstream's device-1 with binding conditions (a fresh builder: builders mutate)."""
    return device("device-1").binding(["IsPrepare"], ["BindingFailed"])


def node_restriction(**options: Any) -> Case:
    """Upstream's node-restriction: a network-attached device (its slice selects planet=earth)
    with bindsToNode, on a node of that planet."""
    return Case(
        [
            slice_("slice-1", device("device-1").binds_to_node())
            .nodes(node_selector(req("planet", "In", "earth")))
            .pool("pool-1")
        ],
        [claim("c0").request("req-0")],
        [{"req-0=pool-1/device-1"}],
        nodes=[node(NODE, region="region-1", planet="earth")],
        steps=2,
        **options,
    )


TAINTED_BOUND = slice_(
    "slice-1",
    bound_1().consumes("set-1", memory="4Gi").taint("key1", "value1"),
    device("device-2").consumes("set-1", memory="4Gi"),
).counter_set("set-1", memory="8Gi")

CASES = [
    # --- basics -------------------------------------------------------------------------------
    pytest.param(
        Case([one_gpu_slice()], [claim("c0").request("req-0")], [{"req-0=node-1/gpu-0"}], steps=2),
        id="simple",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0")).driver(NIC), one_gpu_slice("slice-2", "node-2")],
            [claim("c0").request("req-0")],
            [{"req-0=node-2/gpu-0"}],
            node="node-2",
            steps=2,
        ),
        id="other-node",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", gpu("gpu-0", "1Gi"), gpu("gpu-1", "2Gi"))],
            [
                claim("c0")
                .request("small", "gpu", 1, mem("1Gi"))
                .request("large", "gpu", 1, mem("2Gi"))
            ],
            [{"small=node-1/gpu-0", "large=node-1/gpu-1"}],
            steps=4,
        ),
        id="small-and-large",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", gpu("gpu-1", "2Gi"), gpu("gpu-0", "1Gi"))],
            [
                claim("c0")
                .request("small", "gpu", 1, mem("1Gi"))
                .request("large", "gpu", 1, mem("2Gi"))
            ],
            [{"small=node-1/gpu-0", "large=node-1/gpu-1"}],
            steps=8,
        ),
        id="small-and-large-backtrack-requests",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", gpu("gpu-1", "2Gi"), gpu("gpu-0", "1Gi"))],
            [
                claim("c0").request("small", "gpu", 1, mem("1Gi")),
                claim("c1").request("large", "gpu", 1, mem("2Gi")),
            ],
            [{"small=node-1/gpu-0"}, {"large=node-1/gpu-1"}],
            steps=8,
        ),
        id="small-and-large-backtrack-claims",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", device("gpu-0")).pool(NODE, count=2),
                slice_("slice-2", device("gpu-1")).pool(NODE, count=2),
            ],
            [claim("c0").request("req-0", "gpu", 2)],
            [{"req-0=node-1/gpu-0", "req-0=node-1/gpu-1"}],
            steps=3,
        ),
        id="devices-split-across-different-slices",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", device("gpu-old")).pool(NODE, generation=1),
                slice_("slice-2", device("gpu-new")).pool(NODE, generation=2),
            ],
            [claim("c0").request("req-0")],
            [{"req-0=node-1/gpu-new"}],
            steps=2,
        ),
        id="obsolete-slice",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", device("gpu-0")).pool(NODE, count=2),
                slice_("slice-2", device("gpu-0")).pool(NODE, count=2),
            ],
            [claim("c0").request("req-0")],
            error=(FailedPrecondition, "pool node-1 is invalid: duplicate device name gpu-0", ""),
        ),
        id="duplicate-slice",
    ),
    pytest.param(
        Case(
            [], [claim("c0").request("req-0")], reason="0 of 1 devices for request req-0", steps=0
        ),
        id="no-slices",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0", "gpu", 2)],
            reason="node-1: 1 of 2 devices for request req-0 of claim default/c0; "
            "the others are not on this node (1)",
            steps=0,
        ),
        id="not-enough-suitable-devices",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0")],
            classes=(),
            error=(
                InvalidArgument,
                "claim default/c0, request req-0: could not retrieve device class gpu",
                "claims[0].spec.devices.requests[0].exactly.deviceClassName",
            ),
        ),
        id="unknown-class",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0", "")],
            error=(
                InvalidArgument,
                "missing device class name (unsupported request type?)",
                "claims[0].spec.devices.requests[0].exactly.deviceClassName",
            ),
        ),
        id="empty-class",
    ),
    pytest.param(Case([one_gpu_slice()], [], [], steps=0), id="no-claims-to-allocate"),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").raw_request(DeviceRequest("req-0"))],
            error=(
                InvalidArgument,
                "exactly one of exactly and firstAvailable",
                "claims[0].spec.devices.requests[0]",
            ),
        ),
        id="request-without-exactly-or-first-available",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0", "gpu", 1, "")],
            error=(
                InvalidArgument,
                "claim default/c0, request req-0, selector #0: "
                "CEL expression empty (unsupported selector type?)",
                "claims[0].spec.devices.requests[0].exactly.selectors[0].cel.expression",
            ),
        ),
        id="unknown-selector",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [
                claim("c0").raw_request(
                    DeviceRequest("req-0", ExactDeviceRequest("gpu", allocation_mode=UNKNOWN_MODE))
                )
            ],
            error=(
                InvalidArgument,
                "unsupported count mode Some",
                "claims[0].spec.devices.requests[0].exactly.allocationMode",
            ),
        ),
        id="unknown-allocation-mode",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0").empty_constraint()],
            error=(
                InvalidArgument,
                "claim default/c0, constraint #0: empty constraint (unsupported constraint type?)",
                "claims[0].spec.devices.constraints[0]",
            ),
        ),
        id="unknown-constraint",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0", "gpu", 1, "noSuchVar.foo == 1")],
            error=(
                InvalidArgument,
                "claim default/c0: selector #0: CEL compile error",
                "claims[0].spec.devices.requests[0].exactly.selectors[0].cel.expression",
            ),
        ),
        id="invalid-cel-one-device",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0")],
            classes=(cls("gpu", "noSuchVar.foo == 1"),),
            error=(
                InvalidArgument,
                "class gpu: selector #0: CEL compile error",
                'classes["gpu"].spec.selectors[0].cel.expression',
            ),
        ),
        id="invalid-cel-one-device-class",
    ),
    pytest.param(
        Case(
            [],
            [claim("c0").request("req-0", "gpu", 1, "noSuchVar.foo == 1")],
            reason="0 of 1 devices",
            steps=0,
        ),
        id="invalid-cel-no-devices-no-error",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0", "gpu", 1, f'device.attributes["{DRIVER}"].missing == 1')],
            error=(
                InvalidArgument,
                "claim default/c0: selector #0: CEL runtime error: no such key",
                "",
            ),
        ),
        id="cel-runtime-error-is-fatal",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [
                claim("c0")
                .request("req-0", "gpu", all_devices=True)
                .request("req-1", "gpu", 1, "noSuchVar.foo == 1")
            ],
            error=(InvalidArgument, "CEL compile error", ""),
        ),
        id="invalid-cel-all-devices",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0", "gpu", 33)],
            error=(
                InvalidArgument,
                "claim default/c0: number of requested devices 33 exceeds the claim limit of 32",
                "claims[0].spec.devices.requests",
            ),
        ),
        id="too-many-devices-single-request",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0", "gpu", 17).request("req-1", "gpu", 16)],
            error=(
                InvalidArgument,
                "number of requested devices 33 exceeds the claim limit of 32",
                "",
            ),
        ),
        id="too-many-devices-total",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", *(device(f"gpu-{i}") for i in range(32)))],
            [claim("c0").request("req-0", "gpu", 32)],
            [{f"req-0=node-1/gpu-{i}" for i in range(32)}],
            steps=33,
        ),
        id="max-number-devices",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", *(device(f"gpu-{i}") for i in range(33)))],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            error=(
                InvalidArgument,
                "number of requested devices 33 exceeds the claim limit of 32",
                "",
            ),
        ),
        id="all-devices-over-claim-limit",
    ),
    # --- allocation mode All ------------------------------------------------------------------
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            [{"req-0=node-1/gpu-0"}],
            steps=2,
        ),
        id="all-devices-single",
    ),
    pytest.param(
        Case(
            [one_gpu_slice(), slice_("slice-2", device("gpu-0")).pool("pool-2")],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            [{"req-0=node-1/gpu-0", "req-0=pool-2/gpu-0"}],
            steps=3,
        ),
        id="all-devices-many",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0")).pool(NODE, count=2)],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            error=(
                FailedPrecondition,
                "claim default/c0, request req-0: asks for all devices, "
                "but resource pool gpu.example.com/node-1 is currently being updated",
                "",
            ),
        ),
        id="all-devices-of-the-incomplete-pool",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", device("nic-0")).driver(NIC).pool(NODE, count=2),
                one_gpu_slice("slice-2"),
            ],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            error=(
                FailedPrecondition,
                "resource pool nic.example.com/node-1 is currently being updated",
                "",
            ),
        ),
        id="all-devices-checks-every-pool-of-any-driver",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0")).pool(NODE, count=2)],
            [claim("c0").request("req-0")],
            [{"req-0=node-1/gpu-0"}],
            steps=2,
        ),
        id="exact-count-uses-incomplete-pool",
    ),
    pytest.param(
        Case(
            [one_gpu_slice(), slice_("slice-2", device("nic-0")).driver(NIC)],
            [
                claim("c0").request("req-0", "gpu", all_devices=True),
                claim("c1").request("req-0", "nic"),
            ],
            [{"req-0=node-1/gpu-0"}, {"req-0=nic.example.com:node-1/nic-0"}],
            steps=4,
        ),
        id="all-devices-plus-another",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", device("gpu-0"), device("gpu-1")),
                slice_("slice-2", device("nic-0")).driver(NIC),
            ],
            [
                claim("c1").request("req-0", "nic"),
                claim("c0").request("req-0", "gpu", all_devices=True),
            ],
            [{"req-0=nic.example.com:node-1/nic-0"}, {"req-0=node-1/gpu-0", "req-0=node-1/gpu-1"}],
            steps=5,
        ),
        id="all-devices-many-plus-another-reversed",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c1").request("req-0"), claim("c0").request("req-0", "gpu", all_devices=True)],
            steps=7,
        ),
        id="all-devices-no-solution",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0", "gpu", all_devices=True), claim("c1").request("req-0")],
            steps=7,
        ),
        id="all-devices-no-solution-reversed",
    ),
    pytest.param(
        Case(
            [slice_("slice-1")],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            reason="not on this node",
            steps=0,
        ),
        id="all-devices-slice-without-devices",
    ),
    pytest.param(
        Case(
            [TWO_GPUS],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            allocated=[allocation(result("x", "gpu-0"))],
            reason="in use by default/holder",
            steps=3,
        ),
        id="all-devices-some-allocated",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0"), device("gpu-1").taint("bad"))],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            reason="tainted",
            steps=5,
        ),
        id="tainted-all-devices-single",
    ),
    # --- admin access -------------------------------------------------------------------------
    pytest.param(
        Case(
            [TWO_GPUS],
            [claim("c0").request("req-0", "gpu", all_devices=True, admin=True)],
            [{"req-0=node-1/gpu-0+admin", "req-0=node-1/gpu-1+admin"}],
            allocated=[allocation(result("x", "gpu-0"))],
            steps=3,
        ),
        id="all-devices-some-allocated-admin-access",
    ),
    pytest.param(
        Case(
            [TWO_GPUS],
            [
                claim("c0")
                .request("req-0", admin=True)
                .request("req-1", "gpu", all_devices=True, admin=True)
            ],
            steps=13,
        ),
        id="all-devices-some-allocating-admin-access",
    ),
    pytest.param(
        Case(
            [TWO_GPUS],
            [claim("c0").request("req-0", "gpu", 2, admin=True)],
            [{"req-0=node-1/gpu-0+admin", "req-0=node-1/gpu-1+admin"}],
            allocated=[allocation(result("x", "gpu-0"))],
            steps=3,
        ),
        id="count-devices-some-allocated-admin-access",
    ),
    pytest.param(
        Case(
            [TWO_GPUS],
            [claim("c0").request("req-0", admin=True), claim("c1").request("req-0", admin=True)],
            [{"req-0=node-1/gpu-0+admin"}, {"req-0=node-1/gpu-0+admin"}],
            steps=4,
        ),
        id="separate-claims-share-device-admin-access",
    ),
    pytest.param(
        Case(
            [TWO_GPUS],
            [claim("c0").request("req-0"), claim("c1").request("req-0", admin=True)],
            [{"req-0=node-1/gpu-0"}, {"req-0=node-1/gpu-0+admin"}],
            steps=4,
        ),
        id="admin-access-claims-device-allocating-for-non-admin-access",
    ),
    pytest.param(
        Case(
            [TWO_GPUS],
            [claim("c1").request("req-0", admin=True), claim("c0").request("req-0")],
            [{"req-0=node-1/gpu-0+admin"}, {"req-0=node-1/gpu-1"}],
            steps=4,
        ),
        id="non-admin-pick-skips-device-picked-by-admin",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0", admin=True)],
            [{"req-0=node-1/gpu-0+admin"}],
            allocated=[allocation(result("x", "gpu-0"))],
            steps=2,
        ),
        id="admin-access-enabled",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0")],
            allocated=[allocation(result("x", "gpu-0", admin=True))],
            want=[{"req-0=node-1/gpu-0"}],
            steps=2,
        ),
        id="admin-allocations-do-not-hold-devices",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0")],
            allocated=[allocation(result("x", "gpu-0"))],
            reason="the others are in use (1)",
            steps=0,
        ),
        id="already-allocated-devices",
    ),
    # --- node access and node selectors -------------------------------------------------------
    pytest.param(
        Case(
            [
                slice_("slice-1", device("gpu-0"))
                .nodes(node_selector(req("region", "In", "region-1")))
                .pool("pool-1")
            ],
            [claim("c0").request("req-0")],
            [{"req-0=pool-1/gpu-0"}],
            want_selector=node_selector(req("region", "In", "region-1")),
            steps=2,
        ),
        id="network-attached-device",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", device("gpu-0"))
                .nodes(node_selector(req("region", "In", "region-1")))
                .pool("pool-1")
            ],
            [claim("c0").request("req-0")],
            nodes=[node("node-2", region="region-2")],
            node="node-2",
            steps=0,
        ),
        id="unsuccessful-allocation-network-attached-device",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", device("gpu-0"))
                .nodes(node_selector(req("region", "In", "region-1")))
                .pool("pool-1"),
                slice_("slice-2", device("gpu-0")).all_nodes().pool("pool-2"),
                slice_("slice-3", device("gpu-0"))
                .nodes(node_selector(req("planet", "In", "earth")))
                .pool("pool-3"),
                slice_("slice-4", device("gpu-0")).nodes(local(NODE)).pool("pool-4"),
            ],
            [claim("c0").request("req-0", "gpu", 4)],
            [
                {
                    "req-0=pool-1/gpu-0",
                    "req-0=pool-2/gpu-0",
                    "req-0=pool-3/gpu-0",
                    "req-0=pool-4/gpu-0",
                }
            ],
            nodes=[node(NODE, region="region-1", planet="earth")],
            want_selector=node_selector(
                req("region", "In", "region-1"),
                req("planet", "In", "earth"),
                fields=[req("metadata.name", "In", NODE)],
            ),
            steps=5,
        ),
        id="many-network-attached-devices",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", device("gpu-0"))
                .nodes(node_selector(req("region", "In", "region-1")))
                .pool("pool-1"),
                slice_("slice-2", device("gpu-0")).pool("pool-2"),
            ],
            [claim("c0").request("req-0", "gpu", 2)],
            [{"req-0=pool-1/gpu-0", "req-0=pool-2/gpu-0"}],
            steps=3,
        ),
        id="local-and-network-attached-devices",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0")).all_nodes().pool("fabric")],
            [claim("c0").request("req-0")],
            [{"req-0=fabric/gpu-0"}],
            want_selector=None,
            steps=2,
        ),
        id="all-nodes-device-has-no-node-selector",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", device("gpu-0"))
                .nodes(node_selector(req("gen", "Gt", "3"), req("spot", "DoesNotExist")))
                .pool("p1"),
                slice_("slice-2", device("gpu-0"))
                .nodes(node_selector(req("gen", "Lt", "3")))
                .pool("p2"),
                slice_("slice-3", device("gpu-0"))
                .nodes(node_selector(req("zone", "NotIn", "z1"), req("gpu", "Exists")))
                .pool("p3"),
            ],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            [{"req-0=p1/gpu-0", "req-0=p3/gpu-0"}],
            nodes=[node(NODE, gen="4", zone="z2", gpu="yes")],
            want_selector=node_selector(
                req("gen", "Gt", "3"),
                req("spot", "DoesNotExist"),
                req("zone", "NotIn", "z1"),
                req("gpu", "Exists"),
            ),
            steps=3,
        ),
        id="node-selector-operators",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0").on_node(NODE),
                    device("gpu-1").on_node("node-2"),
                    device("gpu-2").on_all_nodes(),
                )
                .per_device()
                .pool("shared")
            ],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            [{"req-0=shared/gpu-0", "req-0=shared/gpu-2"}],
            steps=3,
        ),
        id="per-device-node-selection",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0")).unreachable()],
            [claim("c0").request("req-0")],
            reason="0 of 1",
            steps=0,
        ),
        id="slice-without-node-access-is-ignored",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", device("gpu-0"), device("gpu-1")),
                slice_("slice-2", device("nic-0")).driver(NIC),
            ],
            [claim("c0").request("req-0"), claim("c0").request("req-0", "nic")],
            [{"req-0=node-1/gpu-0"}, {"req-0=nic.example.com:node-1/nic-0"}],
            steps=4,
        ),
        id="several-different-drivers",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0")],
            node="node-9",
            error=(NotFound, "node node-9 not found", ""),
        ),
        id="unknown-pinned-node",
    ),
    # --- constraints --------------------------------------------------------------------------
    pytest.param(
        Case(
            [ATTRS],
            [claim("c0").request("req-0", "gpu", 2).match(f"{DRIVER}/numa")],
            [{"req-0=node-1/gpu-1", "req-0=node-1/gpu-2"}],
            steps=5,
        ),
        id="with-constraint",
    ),
    pytest.param(
        Case(
            [ATTRS],
            [claim("c0").request("req-0", "gpu", 2).match(f"{DRIVER}/missing")],
            reason="constraint",
            steps=0,
        ),
        id="with-constraint-non-existent-attribute",
    ),
    pytest.param(
        Case(
            [ATTRS],
            [claim("c0").request("req-0", "gpu", 3).match(f"{DRIVER}/numa")],
            reason="ruled out by constraints",
            steps=0,
        ),
        id="with-constraint-not-matching-int-attribute",
    ),
    pytest.param(
        Case(
            [ATTRS],
            [claim("c0").request("req-0", "gpu", 2).match(f"{DRIVER}/model")],
            [{"req-0=node-1/gpu-0", "req-0=node-1/gpu-1"}],
            steps=3,
        ),
        id="with-constraint-string-attribute",
    ),
    pytest.param(
        Case([ATTRS], [claim("c0").request("req-0", "gpu", 3).match(f"{DRIVER}/model")], steps=0),
        id="with-constraint-not-matching-string-attribute",
    ),
    pytest.param(
        Case(
            [ATTRS],
            [claim("c0").request("req-0", "gpu", 2).match(f"{DRIVER}/nvlink")],
            [{"req-0=node-1/gpu-0", "req-0=node-1/gpu-2"}],
            steps=3,
        ),
        id="with-constraint-bool-attribute",
    ),
    pytest.param(
        Case(
            [ATTRS],
            [claim("c0").request("req-0", "gpu", 2).match(f"{DRIVER}/fw")],
            [{"req-0=node-1/gpu-0", "req-0=node-1/gpu-2"}],
            steps=3,
        ),
        id="with-constraint-version-attribute",
    ),
    pytest.param(
        Case([ATTRS], [claim("c0").request("req-0", "gpu", 3).match(f"{DRIVER}/fw")], steps=0),
        id="with-constraint-not-matching-version-attribute",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").attr("numa", 0), device("gpu-1").attr("numa", "0"))],
            [claim("c0").request("req-0", "gpu", 2).match(f"{DRIVER}/numa")],
            steps=0,
        ),
        id="with-constraint-different-types-never-match",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0").attr("other.example.com/rack", "r1"),
                    device("gpu-1").attr("rack", "r1"),
                )
            ],
            [claim("c0").request("req-0", "gpu", 2).match("other.example.com/rack")],
            reason="1 devices: attribute missing (e.g. gpu.example.com/node-1/gpu-1)",
            steps=0,
        ),
        id="with-constraint-bare-name-only-in-driver-domain",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0").attr(f"{DRIVER}/rack", "r1"),
                    device("gpu-1").attr("rack", "r1"),
                )
            ],
            [claim("c0").request("req-0", "gpu", 2).match(f"{DRIVER}/rack")],
            [{"req-0=node-1/gpu-0", "req-0=node-1/gpu-1"}],
            steps=3,
        ),
        id="with-constraint-qualified-and-bare-names-in-driver-domain",
    ),
    pytest.param(
        Case(
            [ATTRS],
            [claim("c0").request("req-0", "gpu", all_devices=True).match(f"{DRIVER}/numa")],
            error=(
                InvalidArgument,
                "claim default/c0, request req-0: cannot add device gpu.example.com/node-1/gpu-1 "
                "because a claim constraint would not be satisfied",
                "claims[0].spec.devices.constraints[0]",
            ),
        ),
        id="with-constraint-not-matching-int-attribute-all-devices",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0").version("fw", "1.0.0"),
                    device("gpu-1").version("fw", "2.0.0"),
                )
            ],
            [claim("c0").request("req-0").request("req-1").match(f"{DRIVER}/fw", "req-0")],
            [{"req-0=node-1/gpu-0", "req-1=node-1/gpu-1"}],
            steps=4,
        ),
        id="with-constraint-for-request",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-1").version("fw", "1.0.0").attr("s", "a"),
                    device("gpu-2").version("fw", "2.0.0").attr("s", "b"),
                    device("gpu-3").version("fw", "3.0.0").attr("s", "b"),
                )
            ],
            [
                claim("c0")
                .request("req-0")
                .request("req-1")
                .match(f"{DRIVER}/fw", "req-0")
                .match(f"{DRIVER}/s")
            ],
            [{"req-0=node-1/gpu-2", "req-1=node-1/gpu-3"}],
            steps=8,
        ),
        id="with-constraint-for-request-retry",
    ),
    pytest.param(
        Case(
            [ATTRS],
            [claim("c0").request("req-0", "gpu", 2).distinct(f"{DRIVER}/numa")],
            [{"req-0=node-1/gpu-0", "req-0=node-1/gpu-1"}],
            steps=3,
        ),
        id="distinct-attribute",
    ),
    pytest.param(
        Case(
            [ATTRS],
            [
                claim("c0")
                .request("req-0", "gpu", 2)
                .distinct(f"{DRIVER}/model")
                .match(f"{DRIVER}/nvlink")
            ],
            [{"req-0=node-1/gpu-0", "req-0=node-1/gpu-2"}],
            steps=3,
        ),
        id="distinct-and-match-together",
    ),
    pytest.param(
        Case(
            [ATTRS],
            [claim("c0").request("req-0", "gpu", 3).distinct(f"{DRIVER}/model")],
            reason="only 2 distinct values, 3 needed",
            steps=0,
        ),
        id="distinct-attribute-equal-values-on-different-devices",
    ),
    # --- config -------------------------------------------------------------------------------
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").request("req-0")],
            [{"req-0=node-1/gpu-0"}],
            classes=(cls("gpu", f'device.driver == "{DRIVER}"').config(name="class-a"),),
            check=check_configs(("FromClass", ("req-0",), "class-a")),
            steps=2,
        ),
        id="with-class-device-config",
    ),
    pytest.param(
        Case(
            [TWO_GPUS, slice_("slice-2", device("nic-0")).driver(NIC)],
            [claim("c0").request("req-0").request("req-1").request("req-2", "nic")],
            [{"req-0=node-1/gpu-0", "req-1=node-1/gpu-1", "req-2=nic.example.com:node-1/nic-0"}],
            classes=(
                cls("gpu", f'device.driver == "{DRIVER}"').config(name="a-1").config(name="a-2"),
                cls("nic", f'device.driver == "{NIC}"').config(NIC, name="b"),
            ),
            check=check_configs(
                ("FromClass", ("req-0", "req-1"), "a-1"),
                ("FromClass", ("req-0", "req-1"), "a-2"),
                ("FromClass", ("req-2",), "b"),
            ),
            steps=6,
        ),
        id="with-class-device-config-with-multiple-request-and-configs",
    ),
    pytest.param(
        Case(
            [TWO_GPUS],
            [
                claim("c0")
                .request("req-0")
                .first_available("req-1", sub("big", "gpu", 3), sub("small"))
                .config(name="all")
                .config("req-0", name="r0")
                .config("req-0", "req-1", name="both")
                .config("req-1/big", name="unselected")
                .config("req-1/small", name="selected")
            ],
            [{"req-0=node-1/gpu-0", "req-1/small=node-1/gpu-1"}],
            check=check_configs(
                ("FromClaim", (), "all"),
                ("FromClaim", ("req-0",), "r0"),
                ("FromClaim", ("req-0", "req-1"), "both"),
                ("FromClaim", ("req-0", "req-1"), "both"),
                ("FromClaim", ("req-1/small",), "selected"),
            ),
            steps=8,
        ),
        id="claim-with-device-config",
    ),
    pytest.param(
        Case(
            [TWO_GPUS],
            [claim("c0").first_available("req-0", sub("a", "nic"), sub("b"))],
            [{"req-0/b=node-1/gpu-0"}],
            classes=(
                cls("gpu", f'device.driver == "{DRIVER}"').config(name="gpu-config"),
                NIC_CLASS,
            ),
            check=check_configs(("FromClass", ("req-0/b",), "gpu-config")),
            steps=4,
        ),
        id="prioritized-list-class-config",
    ),
    # --- firstAvailable -----------------------------------------------------------------------
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").first_available("req-0", sub("sub-0", "nic"), sub("sub-1"))],
            [{"req-0/sub-1=node-1/gpu-0"}],
            steps=4,
        ),
        id="prioritized-list-first-unavailable",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").first_available("req-0", sub("sub-0", "nic"), sub("sub-1", "gpu", 2))],
            steps=0,
        ),
        id="prioritized-list-non-available",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", gpu("gpu-1", "2Gi"), gpu("gpu-2", "2Gi"), gpu("gpu-3", "1Gi"))],
            [
                claim("c0")
                .request("req-0", "gpu", 1, mem("1Gi"))
                .first_available(
                    "req-1", sub("sub-0", "gpu", 1, mem("4Gi")), sub("sub-1", "gpu", 2, mem("2Gi"))
                )
            ],
            [{"req-0=node-1/gpu-3", "req-1/sub-1=node-1/gpu-1", "req-1/sub-1=node-1/gpu-2"}],
            steps=15,
        ),
        id="prioritized-list-subrequests-with-expressions",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1", device("gpu-1").capacity("memory", "8Gi").version("fw", "1.0.0")
                ).pool("pool-1"),
                slice_(
                    "slice-2",
                    device("gpu-2").capacity("memory", "2Gi").version("fw", "2.0.0"),
                    device("gpu-3").capacity("memory", "1Gi").version("fw", "1.0.0"),
                ).pool("pool-2"),
            ],
            [
                claim("c0")
                .request("req-0", "gpu", 1, mem("8Gi"))
                .first_available(
                    "req-1", sub("sub-0", "gpu", 1, mem("2Gi")), sub("sub-1", "gpu", 1, mem("1Gi"))
                )
                .match(f"{DRIVER}/fw", "req-0", "req-1")
            ],
            [{"req-0=pool-1/gpu-1", "req-1/sub-1=pool-2/gpu-3"}],
            steps=6,
        ),
        id="prioritized-list-subrequests-with-constraints-ref-parent-request",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1", device("gpu-1").capacity("memory", "8Gi").version("fw", "1.0.0")
                ).pool("pool-1"),
                slice_(
                    "slice-2", device("gpu-2").capacity("memory", "2Gi").version("fw", "2.0.0")
                ).pool("pool-2"),
            ],
            [
                claim("c0")
                .request("req-0", "gpu", 1, mem("8Gi"))
                .first_available(
                    "req-1", sub("sub-0", "gpu", 1, mem("2Gi")), sub("sub-1", "gpu", 1, mem("1Gi"))
                )
                .match(f"{DRIVER}/fw", "req-0", "req-1/sub-0")
            ],
            [{"req-0=pool-1/gpu-1", "req-1/sub-1=pool-2/gpu-2"}],
            steps=6,
        ),
        id="prioritized-list-subrequests-with-constraints-ref-sub-request",
    ),
    pytest.param(
        Case(
            [TWO_GPUS],
            [claim("c0").first_available("req-0", sub("sub-0", all_devices=True), sub("sub-1"))],
            [{"req-0/sub-1=node-1/gpu-1"}],
            allocated=[allocation(result("x", "gpu-0"))],
            steps=4,
        ),
        id="prioritized-list-subrequests-with-allocation-mode-all",
    ),
    pytest.param(
        Case(
            [TWO_GPUS],
            [
                claim("c0")
                .request("req-0")
                .first_available("req-1", sub("sub-0", all_devices=True), sub("sub-1"))
            ],
            [{"req-0=node-1/gpu-0", "req-1/sub-1=node-1/gpu-1"}],
            steps=6,
        ),
        id="prioritized-list-allocation-mode-all-multiple-requests",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("nic-0")).driver(NIC), one_gpu_slice("slice-2")],
            [
                claim("c0").first_available(
                    "req-0", sub("sub-0", "gpu", all_devices=True), sub("sub-1", "nic")
                )
            ],
            [{"req-0/sub-0=node-1/gpu-0"}],
            steps=2,
        ),
        id="prioritized-list-all-devices-first",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", gpu("gpu-1", "8Gi")).pool("pool-1"),
                slice_("slice-2", gpu("gpu-2", "4Gi")).pool("pool-2"),
            ],
            [
                claim("c0")
                .request("req-1", "gpu", 1, mem("8Gi"))
                .first_available(
                    "req-0", sub("sub-0", "gpu", 1, mem("8Gi")), sub("sub-1", "gpu", 1, mem("4Gi"))
                )
            ],
            [{"req-1=pool-1/gpu-1", "req-0/sub-1=pool-2/gpu-2"}],
            steps=6,
        ),
        id="prioritized-list-multi-request",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", gpu("gpu-1", "8Gi")).pool("pool-1"),
                slice_("slice-2", gpu("gpu-2", "4Gi")).pool("pool-2"),
            ],
            [
                claim("c0")
                .first_available(
                    "req-0", sub("sub-0", "gpu", 1, mem("8Gi")), sub("sub-1", "gpu", 1, mem("4Gi"))
                )
                .request("req-1", "gpu", 1, mem("8Gi"))
            ],
            [{"req-0/sub-1=pool-2/gpu-2", "req-1=pool-1/gpu-1"}],
            steps=14,
        ),
        id="prioritized-list-with-backtracking",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", gpu("gpu-0", "8Gi"), gpu("gpu-1", "4Gi"))],
            [
                claim("c0")
                .request("req-0")
                .first_available(
                    "req-1", sub("big", "gpu", 1, mem("8Gi")), sub("small", "gpu", 1, mem("4Gi"))
                )
            ],
            [{"req-0=node-1/gpu-0", "req-1/small=node-1/gpu-1"}],
            steps=6,
        ),
        id="prioritized-list-earlier-choices-are-not-revisited",
    ),
    pytest.param(
        Case(
            [one_gpu_slice()],
            [claim("c0").first_available("req-0", sub("sub-0", "nic", 500), sub("sub-1"))],
            [{"req-0/sub-1=node-1/gpu-0"}],
            steps=2,
        ),
        id="prioritized-list-too-many-in-first-subrequest",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", *(device(f"gpu-{i}") for i in range(34)))],
            [
                claim("c0")
                .request("req-0", "gpu", 30)
                .first_available("req-1", sub("sub-0", "gpu", 3), sub("sub-1", "gpu", 2))
            ],
            [
                {
                    *(f"req-0=node-1/gpu-{i}" for i in range(30)),
                    "req-1/sub-1=node-1/gpu-30",
                    "req-1/sub-1=node-1/gpu-31",
                }
            ],
            steps=34,
        ),
        id="prioritized-list-max-allocation-limit-request",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", *(device(f"gpu-{i}") for i in range(4)))],
            [
                claim("c0")
                .request("req-0", "gpu", 30)
                .first_available("req-1", sub("sub-0", "gpu", 3))
            ],
            error=(
                InvalidArgument,
                "number of requested devices 33 exceeds the claim limit of 32",
                "",
            ),
        ),
        id="prioritized-list-minimum-over-claim-limit",
    ),
    # --- partitionable devices (counters) -----------------------------------------------------
    pytest.param(
        Case(
            [
                slice_("slice-1", mig("mig-0", "gpu-0-set", "4Gi")).counter_set(
                    "gpu-0-set", memory="8Gi"
                )
            ],
            [claim("c0").request("req-0")],
            [{"req-0=node-1/mig-0"}],
            steps=2,
        ),
        id="partitionable-devices-single-device",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    mig("mig-1", "set", "4Gi"),
                    mig("mig-2", "set", "6Gi"),
                    mig("mig-3", "set", "4Gi"),
                ).counter_set("set", memory="8Gi")
            ],
            [claim("c0").request("req-0").request("req-1")],
            [{"req-0=node-1/mig-1", "req-1=node-1/mig-3"}],
            steps=4,
        ),
        id="partitionable-devices-multiple-devices",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    mig("mig-1", "set", "4Gi"),
                    mig("mig-2", "set", "6Gi"),
                    mig("mig-3", "set", "4Gi"),
                ).counter_set("set", memory="8Gi")
            ],
            [
                claim("c0")
                .request("req-0")
                .first_available(
                    "req-1", sub("sub-0", "gpu", 1, mem("6Gi")), sub("sub-1", "gpu", 1, mem("4Gi"))
                )
            ],
            [{"req-0=node-1/mig-1", "req-1/sub-1=node-1/mig-3"}],
            steps=6,
        ),
        id="partitionable-devices-prioritized-list",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("mig-1").consumes("set", memory="4Gi", sm="2"),
                    device("mig-2").consumes("set", memory="2Gi", sm="6"),
                    device("mig-3").consumes("set", memory="2Gi", sm="2"),
                ).counter_set("set", memory="8Gi", sm="6")
            ],
            [claim("c0").request("req-0", "gpu", 2)],
            [{"req-0=node-1/mig-1", "req-0=node-1/mig-3"}],
            steps=3,
        ),
        id="partitionable-devices-multiple-counters",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1", mig("mig-1", "set", "4Gi"), mig("mig-2", "set", "16Gi")
                ).counter_set("set", memory="18Gi")
            ],
            [claim("c0").request("req-0")],
            allocated=[allocation(result("x", "mig-2"))],
            reason="short of counters",
            steps=3,
        ),
        id="partitionable-devices-no-capacity-available",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("mig-1").consumes("a", memory="4Gi"),
                    device("mig-2").consumes("b", memory="20Gi"),
                )
                .counter_set("a", memory="18Gi")
                .counter_set("b", memory="18Gi")
            ],
            [claim("c0").request("req-0")],
            allocated=[allocation(result("x", "mig-2"))],
            reason="short of counters",
            steps=3,
        ),
        id="partitionable-devices-overallocated-capacity-pool",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1", device("mig-1").consumes("set", memory="4Gi", unknown="1")
                ).counter_set("set", memory="4Gi", unused="1")
            ],
            [claim("c0").request("req-0")],
            [{"req-0=node-1/mig-1"}],
            steps=2,
        ),
        id="partitionable-devices-unused-counters-in-counter-set",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", mig("mig-1", "gpu-0", "4Gi"), mig("mig-2", "gpu-0", "4Gi"))
                .counter_set("gpu-0", memory="8Gi")
                .pool("p1"),
                slice_("slice-2", mig("mig-1", "gpu-0", "8Gi"))
                .counter_set("gpu-0", memory="8Gi")
                .pool("p2"),
            ],
            [claim("c0").request("req-0", "gpu", 3)],
            [{"req-0=p1/mig-1", "req-0=p1/mig-2", "req-0=p2/mig-1"}],
            steps=4,
        ),
        id="partitionable-devices-counter-sets-are-per-pool",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    mig("mig-0", "set", "4Gi").on_node(NODE),
                    mig("mig-1", "set", "6Gi").on_node("node-2"),
                )
                .per_device()
                .pool("pool-1")
                .counter_set("set", memory="18Gi")
            ],
            [
                claim("c0").first_available(
                    "req-0", sub("sub-0", "gpu", 1, mem("6Gi")), sub("sub-1", "gpu", 1, mem("4Gi"))
                )
            ],
            [{"req-0/sub-1=pool-1/mig-0"}],
            steps=4,
        ),
        id="partitionable-devices-per-device-node-selection-nodename",
    ),
    # --- taints and tolerations ---------------------------------------------------------------
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0").taint("k", "v"),
                    device("gpu-1").taint("k", "v", "NoExecute"),
                )
            ],
            [claim("c0").request("req-0")],
            reason="tainted (2)",
            steps=0,
        ),
        id="tainted-two-devices",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").taint("a", "1").taint("b", "2"))],
            [claim("c0").request("req-0", tolerations=[toleration("a", "1")])],
            steps=0,
        ),
        id="tainted-one-device-two-taints",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").taint("a", "1").taint("b", "2", "NoExecute"))],
            [
                claim("c0").request(
                    "req-0",
                    tolerations=[
                        toleration("a", "1"),
                        toleration("b", exists=True, effect="NoExecute"),
                    ],
                )
            ],
            [{"req-0=node-1/gpu-0"}],
            steps=2,
        ),
        id="tainted-one-device-two-taints-both-tolerated",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").taint("a", "1"))],
            [claim("c0").request("req-0", tolerations=[toleration("a", "2")])],
            steps=0,
        ),
        id="toleration-value-mismatch",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").taint("a", "1", "NoExecute"))],
            [claim("c0").request("req-0", tolerations=[toleration("a", "1", effect="NoSchedule")])],
            steps=0,
        ),
        id="toleration-effect-mismatch",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").taint("a", "1").taint("b", "", "NoExecute"))],
            [claim("c0").request("req-0", tolerations=[toleration(exists=True)])],
            [{"req-0=node-1/gpu-0"}],
            steps=2,
        ),
        id="toleration-exists-without-key-tolerates-everything",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").taint("a", "1"), device("gpu-1"))],
            [claim("c0").first_available("req-0", sub("sub-0", "gpu", 2), sub("sub-1"))],
            [{"req-0/sub-1=node-1/gpu-1"}],
            steps=6,
        ),
        id="tainted-prioritized-list",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").taint("a", "1"))],
            [claim("c0").request("req-0", admin=True)],
            steps=0,
        ),
        id="tainted-admin-access",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").taint("a", "1"))],
            [
                claim("c0").request(
                    "req-0", "gpu", all_devices=True, tolerations=[toleration("a", "1")]
                )
            ],
            [{"req-0=node-1/gpu-0"}],
            steps=2,
        ),
        id="tainted-all-devices-tolerated",
    ),
    # --- consumable capacity ------------------------------------------------------------------
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0").multi().capacity("memory", "1"),
                    device("gpu-1").multi().capacity("memory", "1"),
                )
            ],
            [claim("c0").request("req-0"), claim("c1").request("req-0")],
            [{"req-0=node-1/gpu-0"}, {"req-0=node-1/gpu-1"}],
            check=check_consumed({"memory": "1"}, {"memory": "1"}),
            steps=4,
        ),
        id="consumable-capacity-multi-allocatable-device-without-policy-without-capacity-request",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").multi().capacity("memory", "2"))],
            [claim("c0").request("req-0"), claim("c1").request("req-0")],
            reason="short of capacity",
            steps=7,
        ),
        id="consumable-capacity-multi-allocatable-device-without-policy-without-capacity-request-block",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").multi().capacity("memory", "2"))],
            [
                claim("c0").request("req-0", capacity={"memory": "1"}),
                claim("c1").request("req-0", capacity={"memory": "1"}),
            ],
            [{"req-0=node-1/gpu-0"}, {"req-0=node-1/gpu-0"}],
            check=check_consumed({"memory": "1"}, {"memory": "1"}),
            steps=4,
        ),
        id="consumable-capacity-multi-allocatable-device-without-policy-with-capacity-request",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0")
                    .multi()
                    .capacity("memory", "4", default="2", valid_range=("2", "4", "2")),
                )
            ],
            [claim("c0").request("req-0"), claim("c1").request("req-0")],
            [{"req-0=node-1/gpu-0"}, {"req-0=node-1/gpu-0"}],
            check=check_consumed({"memory": "2"}, {"memory": "2"}),
            steps=4,
        ),
        id="consumable-capacity-multi-allocatable-device-with-policy-without-capacity-request",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0")
                    .multi()
                    .capacity("memory", "1", default="0", valid_values=["0"]),
                )
            ],
            [claim("c0").request("req-0"), claim("c1").request("req-0")],
            [{"req-0=node-1/gpu-0"}, {"req-0=node-1/gpu-0"}],
            check=check_consumed({"memory": "0"}, {"memory": "0"}),
            steps=4,
        ),
        id="consumable-capacity-multi-allocatable-device-with-zero-request-policy",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0")
                    .multi()
                    .capacity("memory", "1", default="0", valid_values=["0"]),
                )
            ],
            [claim("c0").request("req-0", capacity={"memory": "1"})],
            reason="short of capacity",
            steps=0,
        ),
        id="consumable-capacity-multi-allocatable-device-violates-zero-request-policy",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0")
                    .multi()
                    .capacity("memory", "4", default="2", valid_range=("2", "4", "2")),
                )
            ],
            [
                claim("c0").request("req-0", capacity={"memory": "1"}),
                claim("c1").request("req-0", capacity={"memory": "1"}),
            ],
            [{"req-0=node-1/gpu-0"}, {"req-0=node-1/gpu-0"}],
            check=check_consumed({"memory": "2"}, {"memory": "2"}),
            steps=4,
        ),
        id="consumable-capacity-multi-allocatable-device-with-range-policy-with-capacity-request",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0")
                    .multi()
                    .capacity("memory", "4", default="2", valid_range=("2", "4", "2")),
                )
            ],
            [claim("c0").request("req-0", capacity={"memory": "3"})],
            [{"req-0=node-1/gpu-0"}],
            check=check_consumed({"memory": "4"}),
            steps=2,
        ),
        id="consumable-capacity-multi-allocatable-device-with-range-policy-step",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0")
                    .multi()
                    .capacity("memory", "4", default="1", valid_values=["1", "2"]),
                )
            ],
            [claim("c0").request("req-0", capacity={"memory": "2"})],
            [{"req-0=node-1/gpu-0"}],
            check=check_consumed({"memory": "2"}),
            steps=2,
        ),
        id="consumable-capacity-multi-allocatable-device-with-valid-values-policy",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0")
                    .multi()
                    .capacity("memory", "3", default="1", valid_values=["1", "3"]),
                )
            ],
            [claim("c0").request("req-0", capacity={"memory": "2"})],
            [{"req-0=node-1/gpu-0"}],
            check=check_consumed({"memory": "3"}),
            steps=2,
        ),
        id="consumable-capacity-multi-allocatable-device-with-valid-values-policy-round-up",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0")
                    .multi()
                    .capacity("memory", "2", default="2", valid_range=("2", "4", "2")),
                )
            ],
            [
                claim("c0").request("req-0", capacity={"memory": "1"}),
                claim("c1").request("req-0", capacity={"memory": "2"}),
            ],
            steps=7,
        ),
        id="consumable-capacity-multi-allocatable-device-with-exceeded-consumable-capacity-request",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0")
                    .multi()
                    .capacity("memory", "10", default="2", valid_range=("2", "4", "2")),
                )
            ],
            [claim("c0").request("req-0", capacity={"memory": "6"})],
            reason="not allowed by its requestPolicy",
            steps=0,
        ),
        id="consumable-capacity-multi-allocatable-device-with-request-over-max-sharing-policy",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0")
                    .multi()
                    .capacity("memory", "4", default="2", valid_range=("2", "4", "2")),
                )
            ],
            [claim("c0").request("req-0", capacity={"memory": "2"})],
            [{"req-0=node-1/gpu-0"}],
            allocated=[allocation(result("x", "gpu-0", share_id="s-1", consumed={"memory": "2"}))],
            steps=2,
        ),
        id="consumable-capacity-multi-allocatable-device-with-some-remaining-consumable-capacity",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0")
                    .multi()
                    .capacity("memory", "2", default="2", valid_range=("2", "4", "2")),
                )
            ],
            [claim("c0").request("req-0", capacity={"memory": "2"})],
            allocated=[allocation(result("x", "gpu-0", share_id="s-1", consumed={"memory": "2"}))],
            reason="capacity memory: needs 2, free 0",
            steps=0,
        ),
        id="consumable-capacity-multi-allocatable-device-with-no-available-consumable-capacity",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-2")
                    .attr("s", "v1")
                    .multi()
                    .capacity("memory", "2", default="2", valid_range=("2", "4", "2")),
                    device("gpu-1")
                    .attr("s", "v2")
                    .multi()
                    .capacity("memory", "4", default="2", valid_range=("2", "4", "2")),
                )
            ],
            [
                claim("c0")
                .request("req-0", capacity={"memory": "2"})
                .request("req-1", capacity={"memory": "2"})
                .match(f"{DRIVER}/s"),
                claim("c1").request("req-0", capacity={"memory": "2"}),
            ],
            [{"req-0=node-1/gpu-1", "req-1=node-1/gpu-1"}, {"req-0=node-1/gpu-2"}],
            steps=10,
        ),
        id="consumable-capacity-with-multi-allocatable-device-backtrack",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0").multi().capacity("memory", "2"),
                    device("gpu-1").multi(),
                )
            ],
            [claim("c0").request("req-0", "gpu", all_devices=True, capacity={"memory": "2"})],
            [{"req-0=node-1/gpu-0"}],
            steps=2,
        ),
        id="consumable-capacity-multi-allocatable-device-allocation-mode-all-filter-out-no-capacity",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0").multi().capacity("memory", "2"),
                    device("gpu-1").multi().capacity("memory", "1"),
                )
            ],
            [
                claim("c0")
                .request("req-0", capacity={"memory": "1"})
                .request("req-1", "gpu", all_devices=True, capacity={"memory": "1"})
            ],
            [{"req-0=node-1/gpu-0", "req-1=node-1/gpu-0", "req-1=node-1/gpu-1"}],
            steps=5,
        ),
        id="consumable-capacity-multi-allocatable-device-allocation-mode-all-allocating-sufficient",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0").multi().capacity("memory", "1"),
                    device("gpu-1").multi().capacity("memory", "1"),
                )
            ],
            [
                claim("c0")
                .request("req-0", capacity={"memory": "1"})
                .request("req-1", "gpu", all_devices=True, capacity={"memory": "1"})
            ],
            steps=13,
        ),
        id="consumable-capacity-multi-allocatable-device-allocation-mode-all-allocating-insufficient",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").capacity("memory", "1"))],
            [claim("c0").request("req-0", capacity={"memory": "1"})],
            [{"req-0=node-1/gpu-0"}],
            check=dedicated,
            steps=2,
        ),
        id="consumable-capacity-dedicated-device-with-consumable-capacity-request",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").capacity("memory", "40Gi"))],
            [claim("c0").request("req-0", capacity={"memory": "80Gi"})],
            reason="capacity memory: needs 80Gi, free 40Gi",
            steps=0,
        ),
        id="capacity-request-larger-than-dedicated-device",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").capacity("memory", "40Gi"))],
            [claim("c0").request("req-0", capacity={"cores": "1"})],
            reason="has no capacity cores",
            steps=0,
        ),
        id="capacity-request-for-unknown-capacity",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").multi().capacity("memory", "2"))],
            [claim("c0").request("req-0", capacity={"memory": "1"})],
            allocated=[allocation(result("x", "gpu-0"))],
            reason="in use by default/holder",
            steps=0,
        ),
        id="allow-multiple-allocations-not-allocate-multi-allocatable-device-which-already-dedicated",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").capacity("memory", "2"))],
            [claim("c0").request("req-0", capacity={"memory": "1"})],
            allocated=[allocation(result("x", "gpu-0", share_id="s-1", consumed={"memory": "1"}))],
            steps=0,
        ),
        id="allow-multiple-allocations-not-allocate-dedicated-device-which-change-from-multi-allocatable",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1", device("gpu-0").multi().consumes("set", memory="4Gi")
                ).counter_set("set", memory="8Gi")
            ],
            [claim("c0").request("req-0"), claim("c1").request("req-0")],
            [{"req-0=node-1/gpu-0"}, {"req-0=node-1/gpu-0"}],
            steps=4,
        ),
        id="allow-multiple-allocations-with-partitionable-device",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-0").attr("s", "v").multi().capacity("memory", "2", default="1"),
                )
            ],
            [
                claim("c0")
                .request("req-0", capacity={"memory": "1"})
                .request("req-1", capacity={"memory": "1"})
                .distinct(f"{DRIVER}/s")
            ],
            steps=7,
        ),
        id="distinct-constraint-one-multi-allocatable-device-with-distinct-constraint",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    device("gpu-1").attr("s", "v1").multi().capacity("memory", "4"),
                    device("gpu-2").attr("s", "v2").multi().capacity("memory", "4"),
                )
            ],
            [
                claim("c0")
                .request("req-0", capacity={"memory": "2"})
                .request("req-1", capacity={"memory": "2"})
                .distinct(f"{DRIVER}/s")
            ],
            [{"req-0=node-1/gpu-1", "req-1=node-1/gpu-2"}],
            steps=4,
        ),
        id="distinct-constraint-two-multi-allocatable-devices-with-distinct-constraint",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0").multi().capacity("memory", "4"))],
            [claim("c0").request("req-0", "gpu", 2, capacity={"memory": "2"})],
            [{"req-0=node-1/gpu-0"}],
            steps=3,
        ),
        id="shared-device-twice-in-one-request",
    ),
    # --- node choice and restricted nodes (node=None; `candidates`: the only nodes) ----------
    pytest.param(
        Case(
            THREE_NODES,
            [claim("c0").request("req-0")],
            [{"req-0=node-3/gpu-0"}],
            node=None,
            policy=Policy.BINPACK,
            check=check_stats(nodes_total=3, nodes_feasible=3),
            steps=6,
        ),
        id="unpinned-binpack-takes-the-fullest-node",
    ),
    pytest.param(
        Case(
            THREE_NODES,
            [claim("c0").request("req-0")],
            [{"req-0=node-2/gpu-0"}],
            node=None,
            candidates=(NODE, "node-2"),
            policy=Policy.BINPACK,
            check=check_stats(nodes_total=2, nodes_searched=2, nodes_feasible=2),
            steps=4,
        ),
        id="restricted-the-best-node-excluded",
    ),
    pytest.param(
        Case(
            THREE_NODES,
            [claim("c0").request("req-0", "gpu", 3)],
            node=None,
            candidates=("node-2", "node-3"),
            policy=Policy.BINPACK,
            reason="no eligible node fits the claims; closest: node-2: 2 of 3 devices",
            steps=0,
        ),
        id="restricted-to-nodes-none-of-which-fit",
    ),
    pytest.param(
        Case(
            THREE_NODES,
            [claim("c0").request("req-0", "gpu", 3)],
            node=None,
            candidates=("node-2", "node-3"),
            policy=Policy.BINPACK,
            reason="node-3: 1 of 3 devices for request req-0 of claim default/c0",
            steps=0,
        ),
        id="restricted-every-miss-is-shown",
    ),
    pytest.param(
        Case(
            THREE_NODES,
            [claim("c0").request("req-0", "gpu", 2)],
            [{"req-0=node-2/gpu-0", "req-0=node-2/gpu-1"}],
            node=None,
            candidates=("node-9", "node-2"),
            policy=Policy.BINPACK,
            check=check_stats(nodes_total=1),
            steps=3,
        ),
        id="restricted-an-unknown-node-name-is-no-candidate",
    ),
    pytest.param(
        Case(
            THREE_NODES,
            [claim("c0").request("req-0")],
            [{"req-0=node-2/gpu-0"}],
            node=None,
            candidates=("node-3", "node-2"),
            check=check_stats(nodes_total=2, nodes_searched=1, nodes_feasible=1),
            steps=2,
        ),
        id="restricted-first-fit-stops-at-the-first-node-by-name",
    ),
    pytest.param(
        Case(
            THREE_NODES,
            [claim("c0").request("req-0", "gpu", 2)],
            [{"req-0=node-1/gpu-1", "req-0=node-1/gpu-2"}],
            node=None,
            candidates=(NODE, "node-2"),
            allocated=[allocation(result("x", "gpu-0"))],
            check=check_stats(nodes_total=2, nodes_searched=1, nodes_feasible=1),
            steps=3,
        ),
        id="restricted-first-fit-skips-held-devices-on-the-first-node",
    ),
    pytest.param(
        Case(
            THREE_NODES,
            [claim("c0").request("req-0")],
            node=None,
            candidates=(),
            reason="no node with devices matches the node selector",
            steps=0,
        ),
        id="restricted-to-no-nodes",
    ),
    pytest.param(
        Case(
            THREE_NODES,
            [claim("c0").request("req-0")],
            nodes=(node(NODE), node("node-4")),
            node=None,
            candidates=("node-4",),
            reason="no node with devices matches the node selector",
            steps=0,
        ),
        id="restricted-to-a-node-without-devices",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0")).pool(NODE, count=2), gpus_on("node-2", 1)],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            node=None,
            candidates=(NODE,),
            error=(FailedPrecondition, "gpu.example.com/node-1 is currently being updated", ""),
        ),
        id="restricted-a-node-only-error-raised-when-no-node-fits",
    ),
    pytest.param(
        Case(
            [slice_("slice-1", device("gpu-0")).pool(NODE, count=2), gpus_on("node-2", 1)],
            [claim("c0").request("req-0", "gpu", all_devices=True)],
            [{"req-0=node-2/gpu-0"}],
            node=None,
            candidates=(NODE, "node-2"),
            steps=2,
        ),
        id="restricted-a-node-only-error-skips-the-node-when-another-fits",
    ),
    pytest.param(
        Case(
            [BUDGET_SLICE, gpus_on("node-2", 4)],
            [BUDGET_CLAIM],
            node=None,
            candidates=(NODE, "node-2"),
            budget=SearchBudget(max_steps=20),
            reason="search budget exhausted: a fit may exist",
            steps=21,
        ),
        id="restricted-the-budget-is-shared-by-the-nodes",
    ),
    pytest.param(
        Case(
            [gpus_on(NODE, 1), gpus_on("node-2", 1), gpus_on("node-3", 1)],
            [claim("c0").request("req-0")],
            node=None,
            candidates=(NODE, "node-2"),
            allocated=[
                allocation(result("x", "gpu-0")),
                allocation(result("x", "gpu-0", pool="node-2")),
            ],
            reason="claim default/c0, request req-0: 2 devices considered; 2 in use",
            steps=0,
        ),
        id="restricted-rejections-are-counted-over-the-nodes",
    ),
    # --- device binding conditions (DRADeviceBindingConditions) -------------------------------
    # Results carry the device's bindingConditions and bindingFailureConditions; bindsToNode pins
    # the allocation to the node. Upstream's gate-off cases (either of its two gates off) are our
    # one setting off: devices with binding conditions are then not allocatable.
    pytest.param(
        Case(
            [slice_("slice-1", bound_1())],
            [claim("c0").request("req-0")],
            [{"req-0=node-1/device-1 until IsPrepare unless BindingFailed"}],
            steps=2,
        ),
        id="device-binding-conditions",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    bound_1(),
                    device("device-2").binding(["IsPrepare2"], ["BindingFailed2"]),
                    device("device-3").binding(["IsPrepare3"], ["BindingFailed3"]),
                )
            ],
            [claim("c0").request("req-0", "gpu", 2).request("req-1")],
            [
                {
                    "req-0=node-1/device-1 until IsPrepare unless BindingFailed",
                    "req-0=node-1/device-2 until IsPrepare2 unless BindingFailed2",
                    "req-1=node-1/device-3 until IsPrepare3 unless BindingFailed3",
                }
            ],
            steps=5,
        ),
        id="binding-conditions-multiple-devices",
    ),
    *(
        pytest.param(
            Case(
                [slice_("slice-1", bound_1())],
                [claim("c0").request("req-0")],
                binding_conditions=False,
                reason="1 unusable: binding conditions are turned off",
                steps=0,
            ),
            id=name,
        )
        for name in (
            "binding-conditions-without-feature-gate",
            "device-binding-conditions-without-binding-conditions-feature-gate",
            "device-binding-conditions-without-device-status-feature-gate",
        )
    ),
    pytest.param(node_restriction(), id="node-restriction"),
    pytest.param(
        node_restriction(
            binding_conditions=False, want_selector=node_selector(req("planet", "In", "earth"))
        ),
        # Not upstream's table: with its gate off the API server drops bindsToNode and the
        # stable allocator never reads it, so the slice's own selector stands.
        id="node-restriction-without-feature-gate",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", bound_1().consumes("set-1", memory="4Gi")).counter_set(
                    "set-1", memory="8Gi"
                )
            ],
            [claim("c0").request("req-0")],
            [{"req-0=node-1/device-1 until IsPrepare unless BindingFailed"}],
            steps=2,
        ),
        id="partitionable-devices-with-binding-conditions",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    bound_1().consumes("set-1", memory="4Gi"),
                    device("device-2")
                    .consumes("set-1", memory="4Gi")
                    .binding(["IsPrepare2"], ["BindingFailed2"]),
                ).counter_set("set-1", memory="8Gi")
            ],
            [claim("c0").request("req-0", "gpu", 2)],
            [
                {
                    "req-0=node-1/device-1 until IsPrepare unless BindingFailed",
                    "req-0=node-1/device-2 until IsPrepare2 unless BindingFailed2",
                }
            ],
            steps=3,
        ),
        id="partitionable-devices-with-binding-conditions-multiple",
    ),
    pytest.param(
        Case(
            [
                slice_(
                    "slice-1",
                    bound_1().consumes("set-1", memory="2Gi"),
                    device("device-2").consumes("set-1", memory="2Gi"),
                    device("device-3")
                    .consumes("set-1", memory="4Gi")
                    .binding(["IsReady"], ["BindingTimeout"]),
                ).counter_set("set-1", memory="8Gi")
            ],
            [claim("c0").request("req-0", "gpu", 3)],
            [
                {
                    "req-0=node-1/device-1 until IsPrepare unless BindingFailed",
                    "req-0=node-1/device-2",
                    "req-0=node-1/device-3 until IsReady unless BindingTimeout",
                }
            ],
            steps=4,
        ),
        id="partitionable-devices-with-binding-conditions-some-devices-no-conditions",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", bound_1().consumes("set-1", memory="4Gi")).counter_set(
                    "set-1", memory="8Gi"
                ),
                slice_("slice-2", device("device-2").consumes("set-1", memory="4Gi")).counter_set(
                    "set-1", memory="8Gi"
                ),
            ],
            [claim("c0").request("req-0", "gpu", 2)],
            [
                {
                    "req-0=node-1/device-1 until IsPrepare unless BindingFailed",
                    "req-0=node-1/device-2",
                }
            ],
            check=check_order("device-2", "device-1"),  # the slice without conditions first
            steps=3,
        ),
        id="partitionable-devices-with-binding-conditions-multi-slices",
    ),
    pytest.param(
        Case(
            [TAINTED_BOUND],
            [claim("c0").request("req-0", "gpu", 2)],
            reason="tainted",
            steps=0,
        ),
        id="partitionable-devices-with-binding-conditions-and-taints",
    ),
    pytest.param(
        Case(
            [TAINTED_BOUND],
            [
                claim("c0").request(
                    "req-0",
                    "gpu",
                    2,
                    tolerations=[toleration("key1", exists=True, effect="NoSchedule")],
                )
            ],
            [
                {
                    "req-0=node-1/device-1 until IsPrepare unless BindingFailed",
                    "req-0=node-1/device-2",
                }
            ],
            steps=3,
        ),
        id="partitionable-devices-with-binding-conditions-and-taints-tolerated",
    ),
    pytest.param(
        Case(
            [
                slice_("slice-1", bound_1()).pool("pool-a"),
                slice_("slice-2", device("device-2")).pool("pool-b"),
            ],
            [claim("c0").request("req-0")],
            [{"req-0=pool-b/device-2"}],
            steps=2,
        ),
        id="binding-conditions-pool-comes-last",
    ),
    # --- budget -------------------------------------------------------------------------------
    pytest.param(
        Case(
            [BUDGET_SLICE],
            [BUDGET_CLAIM],
            budget=SearchBudget(max_steps=20),
            reason="search budget exhausted",
            steps=21,
        ),
        id="budget-exhausted",
    ),
]


def _one_path(cases: Sequence[ParameterSet]) -> list[ParameterSet]:
    """Every pinned case again as a query restricted to its node and, where its node is the
    only one with devices, as an unpinned query: one solve path answers all three alike, step
    for step. (A restriction to a node without devices has no candidates at all, unlike a pin:
    restricted-to-a-node-without-devices.)"""
    variants = []
    for param in cases:
        [case] = param.values
        assert isinstance(case, Case)
        if case.node is None:
            continue
        snap = snapshot(*case.slices, nodes=case.nodes)
        with_devices = [v.name for v in snap.views() if v.device_count > 0]
        if case.node not in with_devices:
            continue
        restricted = replace(case, node=None, candidates=(case.node,))
        variants.append(pytest.param(restricted, id=f"{param.id}-restricted-to-its-node"))
        if with_devices == [case.node]:
            variants.append(pytest.param(replace(case, node=None), id=f"{param.id}-unpinned"))
    return variants


ONE_PATH = _one_path(CASES)


@pytest.mark.parametrize("case", [*CASES, *ONE_PATH])
def test_solve(case: Case) -> None:
    if case.error is not None:
        kind, message, path = case.error
        with pytest.raises(kind) as raised:
            run(case)
        assert message in str(raised.value)
        if path:
            assert isinstance(raised.value, InvalidArgument)
            assert raised.value.field_path == path
        return
    outcome = run(case)
    assert case.steps is not None, f"steps={outcome.stats.steps}"
    assert outcome.stats.steps == case.steps
    if case.want is None:
        assert isinstance(outcome, Unsatisfiable), outcome
        lines = "\n".join(outcome.explanation.lines())
        assert case.reason in lines
        return
    assert isinstance(outcome, Allocated), "\n".join(outcome.explanation.lines())
    assert [got(a) for a in outcome.allocations] == list(case.want)
    if case.want_node is not None:
        assert outcome.node == case.want_node
    for allocation_ in outcome.allocations:
        if case.want_selector == LOCAL and allocation_.results:
            assert allocation_.node_selector == local(outcome.node or "")
        elif case.want_selector != LOCAL:
            assert allocation_.node_selector == case.want_selector
    if case.check is not None:
        case.check(outcome)


@pytest.mark.parametrize("case", [*CASES, *ONE_PATH])
def test_explain_flag_does_not_change_the_outcome(case: Case) -> None:
    if case.error is not None:
        return
    plain, explained = run(case, explain=False), run(case, explain=True)
    assert type(plain) is type(explained)
    if isinstance(plain, Allocated) and isinstance(explained, Allocated):
        assert plain.allocations == explained.allocations
        assert plain.explanation is None
