"""Properties of the solver on small random inventories, against an independent brute force.

The brute force below knows nothing of the solver: it enumerates every way to pick devices for
every request (every subrequest of a firstAvailable request), keeps the combinations that obey
the hard rules of docs/dra-compatibility.md, and so decides whether a fit exists. Properties:

1. every allocation the solver returns obeys the hard rules;
2. whenever the brute force finds a fit, the solver does not answer Unsatisfiable;
3. for a claim whose first request is a firstAvailable one, the solver picks the lowest
   subrequest for which any fit exists (upstream's "try subrequest 0 with the whole rest of the
   search first");
4. choosing the node finds a fit iff some node has one, and the fit is that node's fit.

Selectors are drawn from a fixed list whose Python meaning is written next to the CEL text.
Capacity policies and the 32-device limit are covered by the table tests, not here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from services.allocator.core import (
    Allocated,
    AllocatedState,
    Policy,
    SelectorCache,
    Unsatisfiable,
    solve,
)
from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    AttributeValue,
    CapacityRequirements,
    CounterSet,
    Device,
    DeviceCapacity,
    DeviceClass,
    DeviceConstraint,
    DeviceCounterConsumption,
    DeviceRequest,
    DeviceRequestAllocationResult,
    DeviceSelector,
    DeviceSubRequest,
    DeviceTaint,
    DeviceToleration,
    ExactDeviceRequest,
    Node,
    ResourceClaim,
    ResourcePool,
    ResourceSlice,
    TaintEffect,
    TolerationOperator,
)
from services.common.dra.quantity import Quantity
from services.common.errors import InvalidArgument
from tests.builders import DRIVER

NODE = "node-1"
DOMAIN = f'device.attributes["{DRIVER}"]'

# CEL text -> what it means for a device's attributes (guarded: never a runtime error).
SELECTORS: dict[str, Callable[[Mapping[str, AttributeValue]], bool]] = {
    f'"b" in {DOMAIN} && {DOMAIN}.b == "x"': lambda a: a.get("b") == AttributeValue.string("x"),
    f'"a" in {DOMAIN} && {DOMAIN}.a == 1': lambda a: a.get("a") == AttributeValue.int_(1),
    f'!("a" in {DOMAIN}) || {DOMAIN}.a != 0': lambda a: a.get("a") != AttributeValue.int_(0),
}
CLASSES = {
    "gpu": DeviceClass("gpu", (DeviceSelector(f'device.driver == "{DRIVER}"'),)),
    "any": DeviceClass("any"),
}
TAINTS = [DeviceTaint("t", TaintEffect.NO_SCHEDULE, "v"), DeviceTaint("u", TaintEffect.NO_EXECUTE)]
TOLERATIONS = [
    (),
    (DeviceToleration("t", TolerationOperator.EXISTS),),
    (DeviceToleration(operator=TolerationOperator.EXISTS),),
    (DeviceToleration("u", TolerationOperator.EQUAL, "", TaintEffect.NO_SCHEDULE),),
]


# --- generating scenarios --------------------------------------------------------------------


@st.composite
def devices(draw: st.DrawFn, with_counters: bool) -> list[Device]:
    found = []
    for i in range(draw(st.integers(1, 4))):
        attributes = {}
        a = draw(st.sampled_from([None, 0, 1]))
        if a is not None:
            attributes["a"] = AttributeValue.int_(a)
        b = draw(st.sampled_from([None, "x", "y"]))
        if b is not None:
            attributes["b"] = AttributeValue.string(b)
        multi = draw(st.booleans())
        memory = draw(st.sampled_from([None, 1, 2, 3])) if not multi else draw(st.integers(1, 3))
        capacity = {"mem": DeviceCapacity(Quantity.of(memory))} if memory is not None else {}
        consumes: tuple[DeviceCounterConsumption, ...] = ()
        if with_counters and draw(st.booleans()):
            amount = draw(st.integers(1, 3))
            consumes = (DeviceCounterConsumption("s", {"mem": Quantity.of(amount)}),)
        taints = (draw(st.sampled_from(TAINTS)),) if draw(st.integers(0, 3)) == 0 else ()
        found.append(Device(f"d{i}", attributes, capacity, consumes, taints, multi))
    return found


@st.composite
def inventory(draw: st.DrawFn, node: str = NODE) -> ResourceSlice:
    with_counters = draw(st.booleans())
    counters = (
        (CounterSet("s", {"mem": Quantity.of(draw(st.integers(2, 4)))}),) if with_counters else ()
    )
    return ResourceSlice(
        name=f"{node}-slice",
        driver=DRIVER,
        pool=ResourcePool(node, 1, 1),
        devices=tuple(draw(devices(with_counters))),
        node_name=node,
        shared_counters=counters,
    )


@st.composite
def held(draw: st.DrawFn, slice_: ResourceSlice) -> list[AllocationResult]:
    results = []
    for device in slice_.devices:
        if draw(st.integers(0, 4)) != 0:  # a fifth of the devices are held already
            continue
        share = None
        consumed: dict[str, Quantity] = {}
        if device.allow_multiple_allocations:
            share, consumed = f"share-{device.name}", {"mem": Quantity.of(1)}
        results.append(
            DeviceRequestAllocationResult(
                "held", DRIVER, slice_.pool.name, device.name, None, (), share, consumed
            )
        )
    return [AllocationResult(tuple(results))] if results else []


@st.composite
def subrequest(draw: st.DrawFn, name: str) -> DeviceSubRequest:
    """A subrequest; an exact request is drawn as one and converted (plus adminAccess)."""
    all_devices = draw(st.integers(0, 9)) == 0
    selectors: tuple[DeviceSelector, ...] = ()
    if draw(st.integers(0, 2)) == 0:
        selectors = (DeviceSelector(draw(st.sampled_from(sorted(SELECTORS)))),)
    capacity = None
    if draw(st.integers(0, 4)) == 0:
        capacity = CapacityRequirements({"mem": Quantity.of(draw(st.integers(1, 2)))})
    return DeviceSubRequest(
        name=name,
        device_class_name=draw(st.sampled_from(sorted(CLASSES))),
        selectors=selectors,
        allocation_mode=AllocationMode.ALL if all_devices else AllocationMode.EXACT_COUNT,
        count=0 if all_devices else draw(st.sampled_from([1, 1, 1, 2])),
        tolerations=draw(st.sampled_from(TOLERATIONS)),
        capacity=capacity,
    )


@st.composite
def request(draw: st.DrawFn, name: str, first_available: bool = False) -> DeviceRequest:
    if first_available or draw(st.integers(0, 2)) == 0:
        subs = tuple(draw(subrequest(f"s{k}")) for k in range(2))
        return DeviceRequest(name, first_available=subs)
    s = draw(subrequest(name))
    exact = ExactDeviceRequest(
        s.device_class_name,
        s.selectors,
        s.allocation_mode,
        s.count,
        admin_access=True if draw(st.integers(0, 5)) == 0 else None,
        tolerations=s.tolerations,
        capacity=s.capacity,
    )
    return DeviceRequest(name, exactly=exact)


@st.composite
def claims(draw: st.DrawFn, first_available: bool = False) -> list[ResourceClaim]:
    """1-2 claims with 1-3 requests in all; `first_available`: the very first request is one."""
    found = []
    budget = 3  # requests over all claims, to keep the brute force small
    for c in range(draw(st.integers(1, 2))):
        count = draw(st.integers(1, min(2, budget - (1 - c))))
        budget -= count
        requests = tuple(
            draw(request(f"r{j}", first_available and c == j == 0)) for j in range(count)
        )
        constraints = []
        kind = draw(st.sampled_from([None, None, None, "match-a", "distinct-a", "match-b"]))
        if kind is not None:
            scope = ("r0",) if draw(st.booleans()) else ()
            attribute = f"{DRIVER}/{kind[-1]}"
            if kind.startswith("match"):
                constraints.append(DeviceConstraint(scope, match_attribute=attribute))
            else:
                constraints.append(DeviceConstraint(scope, distinct_attribute=attribute))
        found.append(ResourceClaim(f"c{c}", requests=requests, constraints=tuple(constraints)))
    return found


# --- the brute force -------------------------------------------------------------------------


@dataclass(frozen=True)
class Alt:
    """One way to satisfy a request, flattened for the brute force."""

    request: str
    sub: str | None
    cls: str
    selectors: tuple[str, ...]
    all_devices: bool
    count: int
    admin: bool
    tolerations: tuple[DeviceToleration, ...]
    capacity: Mapping[str, Quantity]

    @property
    def result_name(self) -> str:
        return self.request if self.sub is None else f"{self.request}/{self.sub}"


def alternatives(request: DeviceRequest) -> list[Alt]:
    if request.exactly is not None:
        e = request.exactly
        return [
            _alt(request.name, None, e.device_class_name, e.selectors, e.allocation_mode, e.count,
                 bool(e.admin_access), e.tolerations, e.capacity)
        ]  # fmt: skip
    return [
        _alt(request.name, s.name, s.device_class_name, s.selectors, s.allocation_mode, s.count,
             False, s.tolerations, s.capacity)
        for s in request.first_available
    ]  # fmt: skip


def _alt(
    request: str,
    sub: str | None,
    cls: str,
    selectors: tuple[DeviceSelector, ...],
    mode: AllocationMode,
    count: int,
    admin: bool,
    tolerations: tuple[DeviceToleration, ...],
    capacity: CapacityRequirements | None,
) -> Alt:
    return Alt(
        request,
        sub,
        cls,
        tuple(x.cel for x in selectors),
        mode is AllocationMode.ALL,
        count,
        admin,
        tolerations,
        capacity.requests if capacity else {},
    )


@dataclass
class World:
    """The inventory of one node and what existing allocations hold there."""

    slice: ResourceSlice
    held: Sequence[AllocationResult]

    def __post_init__(self) -> None:
        self.devices = {d.name: d for d in self.slice.devices}
        self.exclusive = {r.device for a in self.held for r in a.results if r.share_id is None}
        self.shared: dict[str, Fraction] = {}
        for a in self.held:
            for r in a.results:
                if r.share_id is not None:
                    self.shared[r.device] = (
                        self.shared.get(r.device, Fraction(0)) + r.consumed_capacity["mem"].value
                    )

    def in_use(self, name: str) -> bool:
        return name in self.exclusive or name in self.shared

    def selected(self, alt: Alt, device: Device) -> bool:
        # Both classes select every device here: "gpu" checks the driver, which all share.
        return all(SELECTORS[s](device.attributes) for s in alt.selectors)

    def capacity_ok(self, alt: Alt, device: Device) -> bool:
        """The request's capacity on its own: named capacities exist and one share fits."""
        if any(name not in device.capacity for name in alt.capacity):
            return False
        for name, cap in device.capacity.items():
            amount = alt.capacity.get(name, cap.value).value
            if self.shared.get(device.name, Fraction(0)) + amount > cap.value.value:
                return False
        return True

    def tolerated(self, alt: Alt, device: Device) -> bool:
        return all(any(_tolerates(t, taint) for t in alt.tolerations) for taint in device.taints)

    def all_list(self, alt: Alt) -> list[str]:
        return [
            d.name for d in self.slice.devices if self.selected(alt, d) and self.capacity_ok(alt, d)
        ]

    def options(self, alt: Alt) -> list[tuple[str, ...]]:
        """Device tuples for one alternative that pass the per-device rules."""
        if alt.all_devices:
            listed = self.all_list(alt)
            ok = listed and all(self.tolerated(alt, self.devices[n]) for n in listed)
            return [tuple(listed)] if ok else []
        usable = [
            d.name
            for d in self.slice.devices
            if self.selected(alt, d) and self.tolerated(alt, d) and self.capacity_ok(alt, d)
        ]
        return [
            combo
            for combo in itertools.combinations_with_replacement(usable, alt.count)
            if all(self.devices[n].allow_multiple_allocations for n in combo if combo.count(n) > 1)
        ]


Pick = tuple[int, Alt, str]  # claim index, alternative, device name


def violation(world: World, claims_: Sequence[ResourceClaim], picks: Sequence[Pick]) -> str | None:
    """The first hard rule the picks break (in claim, request, slot order), or None."""
    earlier: list[Pick] = []
    for claim_index, alt, name in picks:
        device = world.devices.get(name)
        if device is None or not world.selected(alt, device) or not world.capacity_ok(alt, device):
            return f"{name} not selectable for {alt.result_name}"
        if not device.allow_multiple_allocations:
            if alt.admin:
                if any(c == claim_index and n == name for c, _, n in earlier):
                    return f"{name} twice in claim {claim_index}"
            elif world.in_use(name) or any(n == name for _, _, n in earlier):
                return f"{name} in use"
        elif not alt.admin and name in world.exclusive:
            return f"{name} held exclusively"
        earlier.append((claim_index, alt, name))
    return (
        _shared_problem(world, picks)
        or _counter_problem(world, picks)
        or _constraint_problem(world, claims_, picks)
    )


def _shared_problem(world: World, picks: Sequence[Pick]) -> str | None:
    for name in {n for _, _, n in picks}:
        device = world.devices[name]
        if not device.allow_multiple_allocations:
            continue
        for cap_name, cap in device.capacity.items():
            used = world.shared.get(name, Fraction(0)) + sum(
                alt.capacity.get(cap_name, cap.value).value for _, alt, n in picks if n == name
            )
            if used > cap.value.value:
                return f"{name} over capacity"
    return None


def _counter_problem(world: World, picks: Sequence[Pick]) -> str | None:
    picked = {n for _, _, n in picks}
    newly = [n for n in picked if world.devices[n].consumes_counters and not world.in_use(n)]
    if not newly or not world.slice.shared_counters:
        return None
    consuming = picked | {n for n in world.devices if world.in_use(n)}
    total = world.slice.shared_counters[0].counters["mem"].value
    used = sum(
        (c.counters["mem"].value for n in consuming for c in world.devices[n].consumes_counters),
        Fraction(0),
    )
    return "counters exhausted" if used > total else None


def _constraint_problem(
    world: World, claims_: Sequence[ResourceClaim], picks: Sequence[Pick]
) -> str | None:
    for claim_index, claim in enumerate(claims_):
        for constraint in claim.constraints:
            attribute = (constraint.match_attribute or constraint.distinct_attribute or "").split(
                "/"
            )[1]
            values = []
            for c, alt, name in picks:
                scoped = (
                    not constraint.requests
                    or alt.request in constraint.requests
                    or alt.result_name in constraint.requests
                )
                if c == claim_index and scoped:
                    values.append(world.devices[name].attributes.get(attribute))
            if any(v is None for v in values):
                return "constraint attribute missing"
            if constraint.match_attribute and len(set(values)) > 1:
                return "matchAttribute differs"
            if constraint.distinct_attribute and len(set(values)) < len(values):
                return "distinctAttribute repeats"
    return None


def fits(world: World, claims_: Sequence[ResourceClaim], first_sub: int | None = None) -> bool:
    """Does any combination obey every rule? `first_sub` fixes the first request's subrequest."""
    slots: list[list[list[Pick]]] = []
    for claim_index, claim in enumerate(claims_):
        for j, request_ in enumerate(claim.requests):
            alts = alternatives(request_)
            if claim_index == 0 and j == 0 and first_sub is not None:
                alts = [alts[first_sub]]
            slots.append(
                [
                    [(claim_index, alt, n) for n in combo]
                    for alt in alts
                    for combo in world.options(alt)
                ]
            )
    return any(
        violation(world, claims_, [p for part in choice for p in part]) is None
        for choice in itertools.product(*slots)
    )


def picks_of(
    claims_: Sequence[ResourceClaim], allocations: Sequence[AllocationResult]
) -> list[Pick]:
    picks = []
    for claim_index, (claim, allocation) in enumerate(zip(claims_, allocations, strict=True)):
        alts = {alt.result_name: alt for r in claim.requests for alt in alternatives(r)}
        used: dict[str, set[str]] = {}
        for r in allocation.results:
            alt = alts[r.request]
            used.setdefault(alt.request, set()).add(r.request)
            picks.append((claim_index, alt, r.device))
        assert all(len(names) == 1 for names in used.values()), used
        assert set(used) == {r.name for r in claim.requests}
    return picks


def _tolerates(toleration: DeviceToleration, taint: DeviceTaint) -> bool:
    if toleration.effect is not None and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator is TolerationOperator.EXISTS:
        return True
    return toleration.value == taint.value


def counts_ok(world: World, claims_: Sequence[ResourceClaim], picks: Sequence[Pick]) -> bool:
    for claim_index, claim in enumerate(claims_):
        for request_ in claim.requests:
            mine = [
                (alt, n) for c, alt, n in picks if c == claim_index and alt.request == request_.name
            ]
            alt = mine[0][0] if mine else alternatives(request_)[0]
            if alt.all_devices:
                if sorted(n for _, n in mine) != sorted(world.all_list(alt)):
                    return False
            elif len(mine) != alt.count:
                return False
    return True


# --- properties -------------------------------------------------------------------------------


def run_solver(
    world: World, claims_: Sequence[ResourceClaim], node: str | None = NODE
) -> Allocated | Unsatisfiable | None:
    from services.allocator.core import ClusterSnapshot

    snapshot = ClusterSnapshot.build([world.slice], [Node(world.slice.node_name or NODE)])
    state = AllocatedState.build(snapshot, (("holder", a) for a in world.held))
    try:
        return solve(
            snapshot,
            state,
            CLASSES,
            claims_,
            node=node,
            selectors=SelectorCache(),
            policy=Policy.FIRST_FIT,
        )
    except InvalidArgument as err:
        # `All` over a device that breaks a constraint is an error upstream, not a misfit.
        assert "because a claim constraint would not be satisfied" in str(err), err
        return None


@st.composite
def worlds(draw: st.DrawFn) -> World:
    slice_ = draw(inventory())
    return World(slice_, draw(held(slice_)))


SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@SETTINGS
@given(world=worlds(), claims_=claims())
def test_solver_agrees_with_brute_force(world: World, claims_: list[ResourceClaim]) -> None:
    outcome = run_solver(world, claims_)
    assume(outcome is not None)
    if isinstance(outcome, Allocated):
        picks = picks_of(claims_, outcome.allocations)
        assert counts_ok(world, claims_, picks), picks
        assert violation(world, claims_, picks) is None, (violation(world, claims_, picks), picks)
    else:
        assert isinstance(outcome, Unsatisfiable)
        assert not outcome.budget_exhausted
        assert not fits(world, claims_), "\n".join(outcome.explanation.lines())


@SETTINGS
@given(world=worlds(), claims_=claims(first_available=True))
def test_first_available_takes_the_lowest_subrequest_that_fits(
    world: World, claims_: list[ResourceClaim]
) -> None:
    first = claims_[0].requests[0]
    outcome = run_solver(world, claims_)
    assume(isinstance(outcome, Allocated))
    assert isinstance(outcome, Allocated)
    chosen = next(
        r.request for r in outcome.allocations[0].results if r.request.startswith(f"{first.name}/")
    )
    chosen_index = [s.name for s in first.first_available].index(chosen.split("/")[1])
    lowest = next(k for k in range(len(first.first_available)) if fits(world, claims_, first_sub=k))
    assert chosen_index == lowest


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), claims_=claims())
def test_node_choice_finds_a_node_iff_one_fits(
    data: st.DataObject, claims_: list[ResourceClaim]
) -> None:
    names = [f"node-{i}" for i in range(data.draw(st.integers(1, 3)))]
    slices = [data.draw(inventory(name)) for name in names]
    from services.allocator.core import ClusterSnapshot

    snapshot = ClusterSnapshot.build(slices, [Node(n) for n in names])
    state = AllocatedState(snapshot)
    try:
        per_node = {
            n: solve(snapshot, state, CLASSES, claims_, node=n, selectors=SelectorCache())
            for n in names
        }
        chosen = solve(snapshot, state, CLASSES, claims_, selectors=SelectorCache())
    except InvalidArgument:
        assume(False)
        return
    fitting = {n for n, r in per_node.items() if isinstance(r, Allocated)}
    assert isinstance(chosen, Allocated) == bool(fitting)
    if isinstance(chosen, Allocated):
        assert chosen.node in fitting
        same = per_node[chosen.node or ""]
        assert isinstance(same, Allocated) and same.allocations == chosen.allocations
