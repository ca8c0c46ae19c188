"""Flavor assignment end to end in the use-case layer (app/flavor_search.py on core/flavors.py):
the real AllocatorService on the embedded store and quota ledger, a policy parsed from its YAML,
and a small fleet:

- hop-1, hop-2 (`family: hopper`): 2 whole H100s each;
- ada-1 (`family: ada`): 3 whole L40Ss;
- spot-1 (`family: spot`): 2 whole A10s;
- edge-1 (`family: edge`): 2 whole A10s whose devices carry the DRA taint `maintenance=soon`;
- mix-1 (`family: mixed`): one whole H100 and 4 MIG slices (`kind: mig`).

Classes: `gpu` selects whole GPUs, `mig` MIG slices. Each row is one of Kueue's flavorassigner
cases (pkg/scheduler/flavorassigner/flavorassigner_test.go, read and rewritten in gpualloc's
tenant model: a flavor's quota is `gpus/<flavor>`, admitted workloads are reservations held
first, the incoming workload is Allocate(reserve)) or a gpualloc rule of its own (device-level
flavors, taints on requests, firstAvailable alternatives, two flavored resources): the
flavors tried with their modes, the flavor the grant lands on, and the victims proposed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import pytest
import yaml

from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.adapters.store.memory_quota import MemoryQuotaLedger
from services.allocator.app.cluster_view import ClusterView
from services.allocator.app.inventory_feed import InventoryUpdate
from services.allocator.app.live_reservations import Holdings
from services.allocator.app.messages import Answer, LeaseOptions, Outcome, Query
from services.allocator.app.placing import PlacementSearch
from services.allocator.app.quotas import QuotaGuard
from services.allocator.app.service import AllocatorService
from services.allocator.core import FlavorReason, SelectorCache
from services.common.dra.model import DeviceToleration, ResourceClaim
from services.common.quota.model import QuotaModel
from services.common.security.policy import parse_policy
from tests.builders import (
    DRIVER,
    DeviceBuilder,
    claim,
    classes,
    cls,
    device,
    node,
    slice_,
    sub,
    toleration,
)

KIND = f'device.attributes["{DRIVER}"].kind'
MODEL = f'device.attributes["{DRIVER}"].model'
CLASSES = classes(
    cls("gpu", f'{KIND} == "whole"'),
    cls("mig", f'{KIND} == "mig"'),
    cls("any-gpu"),  # every device: a class no quota resource lists, overlapping both
)


def _gpus(node_name: str, model: str, count: int, *, taint: bool = False) -> list[DeviceBuilder]:
    made = []
    for i in range(count):
        built = device(f"gpu-{i}").attr("kind", "whole").attr("model", model)
        if taint:
            built = built.taint("maintenance", "soon")
        made.append(built)
    return made


FAMILIES = {"hop-1": "hopper", "hop-2": "hopper", "ada-1": "ada", "spot-1": "spot"}
FAMILIES |= {"edge-1": "edge", "mix-1": "mixed"}
SLICES = [
    slice_("hop-1", *_gpus("hop-1", "H100", 2)).node("hop-1").build(),
    slice_("hop-2", *_gpus("hop-2", "H100", 2)).node("hop-2").build(),
    slice_("ada-1", *_gpus("ada-1", "L40S", 3)).node("ada-1").build(),
    slice_("spot-1", *_gpus("spot-1", "A10", 2)).node("spot-1").build(),
    slice_("edge-1", *_gpus("edge-1", "A10", 2, taint=True)).node("edge-1").build(),
    slice_(
        "mix-1",
        device("whole-0").attr("kind", "whole").attr("model", "H100"),
        *(device(f"mig-{i}").attr("kind", "mig").attr("model", "H100-1g") for i in range(4)),
    )
    .node("mix-1")
    .build(),
]

PRIORITIES = """\
    priorityClasses:
    - {name: low, value: 0}
    - {name: standard, value: 100, globalDefault: true}
    - {name: high, value: 1000}
"""
BY_NODE = """\
    resourceFlavors:
    - {name: hopper, nodeLabels: {family: hopper}}
    - {name: ada, nodeLabels: {family: ada}}
    - name: spot
      nodeLabels: {family: spot}
      nodeTaints: [{key: spot, value: "true", effect: NoSchedule}]
    - name: edge
      nodeLabels: {family: edge}
      tolerations: [{key: maintenance, operator: Exists}]
    resources:
    - {name: gpus, deviceClassNames: [gpu], flavors: [hopper, ada, spot, edge]}
"""


def model_of(quota: str, tenants: str) -> QuotaModel:
    document = {
        "apiVersion": "gpualloc.dev/v1alpha1",
        "kind": "AccessPolicy",
        "metadata": {"name": "flavors"},
        "spec": {
            "quota": yaml.safe_load("quota:\n" + quota)["quota"],
            "tenants": yaml.safe_load(tenants),
        },
    }
    return parse_policy(document).quotas


@dataclass
class Fleet:
    service: AllocatorService
    held: dict[str, str] = field(default_factory=dict)  # name -> reservation id
    models: list[QuotaModel] = field(default_factory=list)  # the last is the policy's now

    def hold(self, tenant: str, name: str, count: int, priority: str, node_name: str) -> None:
        query = Query((gpus(count),), node=node_name)
        lease = LeaseOptions(f"{tenant}/{name}", priority_class=priority)
        answer = self.service.allocate(query, lease)
        assert answer.outcome is Outcome.ALLOCATED, (name, answer.outcome, answer.quota)
        self.held[name] = answer.reservations[0].id

    def names(self, answer: Answer) -> list[str]:
        by_id = {i: n for n, i in self.held.items()}
        return [by_id[v.holder.reservation_id] for v in answer.preemption]


def fleet_of(quota_model: QuotaModel) -> Iterator[Fleet]:
    view = ClusterView(min_interval=0.0)
    nodes = {name: node(name, family=family) for name, family in FAMILIES.items()}
    view.apply(InventoryUpdate(1, True, {s.node_name or "": (s,) for s in SLICES}, nodes))
    view.flush()
    store = MemoryReservationStore()
    holdings = Holdings(store, expire_interval=3600)
    holdings.start()
    selectors = SelectorCache()
    models = [quota_model]  # a test appends one to reload the policy
    guard = QuotaGuard(lambda: models[-1], MemoryQuotaLedger(), lambda: CLASSES, selectors)
    service = AllocatorService(
        view, holdings, store, PlacementSearch(selectors), CLASSES, quotas=guard
    )
    try:
        yield Fleet(service, models=models)
    finally:
        holdings.close()
        view.close()


def gpus(count: int = 1, tolerations: Sequence[DeviceToleration] = ()) -> ResourceClaim:
    return claim("c").request("gpu", "gpu", count, tolerations=tolerations).build()


def families(answer: Answer) -> set[str]:
    return {FAMILIES[p.node or ""] for p in answer.placements}


# --- Kueue's fungibility, one knob a row ------------------------------------------------------

TWO_FLAVORS = """\
- name: hpc
  quotas:
  - {resource: gpus, flavor: hopper, nominal: 2}
  - {resource: gpus, flavor: ada, nominal: 3}
  FUNGIBILITY
"""
COHORT = """\
- name: lender
  cohort: pool
  quotas:
  - {resource: gpus, flavor: hopper, nominal: LHOPPER}
  - {resource: gpus, flavor: ada, nominal: LADA}
- name: hpc
  cohort: pool
  quotas:
  - {resource: gpus, flavor: hopper, nominal: HOPPER}
  - {resource: gpus, flavor: ada, nominal: ADA}
  FUNGIBILITY
"""


def tenants(template: str, fungibility: str = "", **values: int) -> str:
    """`template` with hpc's fungibility and quotas (`lender`'s: 4 hopper and 3 ada unless
    given as lhopper, lada)."""
    text = template.replace("FUNGIBILITY", f"flavorFungibility: {{{fungibility}}}")
    values = {"lhopper": 4, "lada": 3, **values}
    for key, value in values.items():
        text = text.replace(key.upper(), str(value))
    return text


@dataclass(frozen=True)
class Case:
    tenants: str
    holdings: tuple[tuple[str, str, int, str, str], ...]  # (tenant, name, GPUs, priority, node)
    asks: int  # GPUs, for hpc
    priority: str
    tried: tuple[tuple[str, str, int], ...]  # (flavor, mode, borrows) in order
    lands: str | None  # the family the grant lands on (None: not ALLOCATED)
    victims: tuple[str, ...] = ()
    outcome: Outcome = Outcome.ALLOCATED
    quota: str = BY_NODE
    reasons: tuple[str, ...] = ()  # each attempt's typed reason ("": none), when given


LOW_ON_HOPPER = (("hpc", "low-1", 1, "low", "hop-1"), ("hpc", "low-2", 1, "low", "hop-2"))

CASES = {
    "fits-the-first-flavor": Case(
        tenants(TWO_FLAVORS), (), 1, "", (("hopper", "Fit", 0),), "hopper"
    ),
    "a-spent-flavor-without-victims-tries-the-next": Case(
        tenants(TWO_FLAVORS),
        (("hpc", "h1", 2, "", "hop-1"),),
        1, "",
        (("hopper", "NoCandidates", 0), ("ada", "Fit", 0)),
        "ada",
        reasons=("quota", ""),
    ),
    # Kueue: "preempt before try next flavor" (whenCanPreempt MayStopSearch)
    "when-can-preempt-may-stop-search-preempts-on-the-first": Case(
        tenants(TWO_FLAVORS, "whenCanPreempt: MayStopSearch"),
        LOW_ON_HOPPER,
        1, "high",
        (("hopper", "Preempt", 0),),
        None,
        ("low-2",),
        Outcome.QUOTA_EXCEEDED,
        reasons=("quota",),
    ),
    "when-can-preempt-older-name-preempt": Case(
        tenants(TWO_FLAVORS, "whenCanPreempt: Preempt"),
        LOW_ON_HOPPER,
        1, "high",
        (("hopper", "Preempt", 0),),
        None,
        ("low-2",),
        Outcome.QUOTA_EXCEEDED,
    ),
    # Kueue: "preempt try next flavor" (the default, TryNextFlavor)
    "when-can-preempt-try-next-flavor-takes-a-fit-after": Case(
        tenants(TWO_FLAVORS),
        LOW_ON_HOPPER,
        1, "high",
        (("hopper", "Preempt", 0), ("ada", "Fit", 0)),
        "ada",
    ),
    "when-can-preempt-try-next-flavor-keeps-the-first-when-none-fits": Case(
        tenants(TWO_FLAVORS),
        (*LOW_ON_HOPPER, ("hpc", "ada-held", 3, "high", "ada-1")),
        1, "high",
        (("hopper", "Preempt", 0), ("ada", "NoCandidates", 0)),
        None,
        ("low-2",),
        Outcome.QUOTA_EXCEEDED,
    ),
    # Kueue: "borrow before try next flavor" (whenCanBorrow MayStopSearch, the default)
    "when-can-borrow-may-stop-search-borrows-on-the-first": Case(
        tenants(COHORT, hopper=0, ada=2), (), 1, "", (("hopper", "Fit", 1),), "hopper"
    ),
    "when-can-borrow-older-name-borrow": Case(
        tenants(COHORT, "whenCanBorrow: Borrow", hopper=0, ada=2),
        (), 1, "",
        (("hopper", "Fit", 1),),
        "hopper",
    ),
    # Kueue: "borrow try next flavor, found the second flavor"
    "when-can-borrow-try-next-flavor-takes-a-later-one-within-nominal": Case(
        tenants(COHORT, "whenCanBorrow: TryNextFlavor", hopper=0, ada=2),
        (), 1, "",
        (("hopper", "Fit", 1), ("ada", "Fit", 0)),
        "ada",
    ),
    # Kueue: "borrow try next flavor, found the first flavor"
    "when-can-borrow-try-next-flavor-keeps-the-first-when-all-borrow": Case(
        tenants(COHORT, "whenCanBorrow: TryNextFlavor", hopper=0, ada=0),
        (), 1, "",
        (("hopper", "Fit", 1), ("ada", "Fit", 1)),
        "hopper",
    ),
    # Kueue: "when borrowing while preemption is needed for flavor one; WhenCanBorrow=MayStopSearch"
    # (hopper: hpc's 2 held at low, nobody lends it; ada: hpc's 0, the lender's 3)
    "preemption-needed-on-the-first-a-borrowing-fit-on-the-second-stops-there": Case(
        tenants(COHORT, hopper=2, ada=0, lhopper=0),
        LOW_ON_HOPPER,
        1, "high",
        (("hopper", "Preempt", 0), ("ada", "Fit", 1)),
        "ada",
    ),
    # Kueue: the same with WhenCanPreempt=MayStopSearch
    "preemption-needed-on-the-first-with-may-stop-search-preempts-there": Case(
        tenants(COHORT, "whenCanPreempt: MayStopSearch", hopper=2, ada=0, lhopper=0),
        LOW_ON_HOPPER,
        1, "high",
        (("hopper", "Preempt", 0),),
        None,
        ("low-2",),
        Outcome.QUOTA_EXCEEDED,
    ),
    # Kueue's TestReclaimBeforePriorityPreemption: "Select first flavor where gpu reclamation
    # is possible": reclaiming a borrower beats preempting the tenant's own
    # (hopper: hpc's 2 held at low, nobody lends it; ada: the lender borrows 2 of hpc's 2)
    "reclaim-is-preferred-to-preempting-its-own": Case(
        tenants(COHORT, hopper=2, ada=2, lhopper=0, lada=1),
        (*LOW_ON_HOPPER, ("lender", "borrower", 3, "", "ada-1")),
        1, "high",
        (("hopper", "Preempt", 0), ("ada", "Reclaim", 0)),
        None,
        ("borrower",),
        Outcome.UNSATISFIABLE,
    ),
    # Kueue's TestIsPreferred: "explicit PreemptionOverBorrowing prioritises lower preemption"
    "preference-preemption-over-borrowing-takes-the-preempting-flavor": Case(
        tenants(
            COHORT,
            "whenCanBorrow: TryNextFlavor, whenCanPreempt: TryNextFlavor, "
            "preference: PreemptionOverBorrowing",
            hopper=0,
            ada=1,
            lada=0,
        ),
        (("hpc", "ada-low", 1, "low", "ada-1"),),
        1, "high",
        (("hopper", "Fit", 1), ("ada", "Preempt", 0)),
        None,
        ("ada-low",),
        Outcome.QUOTA_EXCEEDED,
    ),
    "preference-borrowing-over-preemption-takes-the-borrowing-fit": Case(
        tenants(
            COHORT,
            "whenCanBorrow: TryNextFlavor, whenCanPreempt: TryNextFlavor, "
            "preference: BorrowingOverPreemption",
            hopper=0,
            ada=1,
            lada=0,
        ),
        (("hpc", "ada-low", 1, "low", "ada-1"),),
        1, "high",
        (("hopper", "Fit", 1), ("ada", "Preempt", 0)),
        "hopper",
    ),
    # Kueue: "insufficient quota ... > maximum capacity": NoFit, never preempted for
    "more-than-the-quota-can-ever-grant-is-no-fit": Case(
        tenants(TWO_FLAVORS), (), 3, "", (("hopper", "NoFit", 0), ("ada", "Fit", 0)), "ada"
    ),
    "no-devices-of-the-flavor-is-no-fit": Case(
        tenants(COHORT, hopper=4, ada=3),
        (), 3, "",
        (("hopper", "NoFit", 0), ("ada", "Fit", 0)),
        "ada",
    ),
    # Kueue's isPreferred: "no-candidate flavor remains preferable to no-fit flavor"
    "no-candidates-is-preferred-to-no-fit": Case(
        tenants(TWO_FLAVORS),
        (("hpc", "ada-held", 2, "", "ada-1"),),
        3, "",
        (("hopper", "NoFit", 0), ("ada", "NoCandidates", 0)),
        None,
        (),
        Outcome.UNSATISFIABLE,
        reasons=("no-devices", "devices-in-use"),
    ),
    # preemption per flavor: the victims are looked for on the flavor tried (here hopper, with
    # whenCanPreempt MayStopSearch), not where the solver would place it (ada's lowest is the
    # newest and lowest of hpc's, and frees nothing of hopper)
    "victims-are-looked-for-on-the-flavor-tried": Case(
        tenants(TWO_FLAVORS, "whenCanPreempt: MayStopSearch"),
        (("hpc", "hop-low", 1, "low", "hop-1"), ("hpc", "hop-std", 1, "", "hop-2"),
         ("hpc", "ada-low", 1, "low", "ada-1")),
        1, "high",
        (("hopper", "Preempt", 0),),
        None,
        ("hop-low",),
        Outcome.QUOTA_EXCEEDED,
    ),
    "every-flavor-no-fit-is-quota-exceeded-without-victims": Case(
        "- {name: hpc, quotas: [{resource: gpus, flavor: hopper, nominal: 2}, "
        "{resource: gpus, flavor: ada, nominal: 2}]}",
        (), 3, "high",
        (("hopper", "NoFit", 0), ("ada", "NoFit", 0)),
        None,
        (),
        Outcome.QUOTA_EXCEEDED,
    ),
    "a-flavor-the-tenant-does-not-list-is-never-tried": Case(
        "- {name: hpc, quotas: [{resource: gpus, flavor: ada, nominal: 3}]}",
        (), 1, "",
        (("ada", "Fit", 0),),
        "ada",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_flavor_assignment_table(case: Case) -> None:
    """The flavors hpc's grant tries (mode and borrowing each), where it lands, and the
    victims proposed (nothing is revoked: no `preempt`)."""
    for fleet in fleet_of(model_of(case.quota + PRIORITIES, case.tenants)):
        for tenant, name, count, priority, on in case.holdings:
            if count:
                fleet.hold(tenant, name, count, priority, on)
        lease = LeaseOptions("hpc/grant", priority_class=case.priority)
        answer = fleet.service.allocate(Query((gpus(case.asks),)), lease)
        tried = [(a.flavor, a.mode.label, a.borrows) for a in answer.flavors]
        assert tried == list(case.tried)
        if case.reasons:
            assert [a.reason or "" for a in answer.flavors] == list(case.reasons)
        assert answer.outcome is case.outcome, (answer.quota, answer.flavors)
        if case.lands is not None:
            assert families(answer) == {case.lands}
        assert fleet.names(answer) == list(case.victims)
        if case.victims:  # with `preempt`: the victims go and the grant lands on that flavor
            (chosen,) = [a.flavor for a in answer.flavors if a.chosen]
            taken = fleet.service.allocate(Query((gpus(case.asks),)), replace(lease, preempt=True))
            assert taken.outcome is Outcome.ALLOCATED and fleet.names(taken) == list(case.victims)
            assert families(taken) == {chosen}


# --- what a flavor selects, and who may use it (taints) ---------------------------------------

SPOT = toleration("spot", "true")
DEVICE_LEVEL = """\
    resourceFlavors:
    - {name: whole, deviceClassNames: [gpu]}
    - {name: mig, deviceClassNames: [mig]}
    - {name: h100, selectors: [{cel: {expression: 'MODEL == "H100"'}}]}
    - {name: other}
    resources:
    - {name: gpus, deviceClassNames: [gpu, mig], gpuShare: true, flavors: [whole, mig]}
    - {name: models, deviceClassNames: [gpu], flavors: [h100, other]}
""".replace("MODEL", MODEL)
TWO_RESOURCES = """\
    resourceFlavors:
    - {name: hopper, nodeLabels: {family: hopper}}
    - {name: mixed, nodeLabels: {family: mixed}}
    resources:
    - {name: gpus, deviceClassNames: [gpu], flavors: [hopper, mixed]}
    - {name: slices, deviceClassNames: [mig], flavors: [hopper, mixed]}
"""


@dataclass(frozen=True)
class Ask:
    quota: str
    tenants: str
    request: ResourceClaim
    tried: tuple[tuple[str, str, str], ...]  # (resource, flavor, mode), in order
    lands: str | None  # the family the grant lands on (None: not ALLOCATED)
    charged: tuple[str, ...] = ()  # the quota resources the grant counts
    reason: FlavorReason | None = None  # the first attempt's reason (when not Fit)
    holdings: tuple[tuple[str, str, int, str, str], ...] = ()
    reasons: tuple[str, ...] = ()  # each attempt's typed reason ("": none), when given


def edited(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


def hpc(*quotas: str, extra: str = "") -> str:
    return f"- {{name: hpc, quotas: [{', '.join(quotas)}]{extra}}}"


def q(flavored: str, nominal: int = 4) -> str:
    resource, flavor = flavored.split("/")
    return f"{{resource: {resource}, flavor: {flavor}, nominal: {nominal}}}"


SPOT_FIRST = hpc(q("gpus/spot"), q("gpus/hopper"))
ASKS = {
    # Kueue: "multiple flavors, fits while skipping tainted flavor"
    "an-untolerated-flavor-taint-skips-the-flavor": Ask(
        BY_NODE, SPOT_FIRST, gpus(1),
        (("gpus", "spot", "NoFit"), ("gpus", "hopper", "Fit")), "hopper",
        reason=FlavorReason.UNTOLERATED_TAINT,
    ),
    # Kueue: "single flavor, fits tainted flavor with toleration"
    "a-request-that-tolerates-the-taint-uses-the-flavor": Ask(
        BY_NODE, SPOT_FIRST, gpus(1, [SPOT]), (("gpus", "spot", "Fit"),), "spot",
        ("gpus/spot",),
    ),
    "a-tenant-that-tolerates-the-taint-uses-the-flavor": Ask(
        BY_NODE,
        hpc(q("gpus/spot"), q("gpus/hopper"),
            extra=", tolerations: [{key: spot, operator: Exists}]"),
        gpus(1), (("gpus", "spot", "Fit"),), "spot",
    ),
    "a-toleration-of-another-effect-does-not-tolerate": Ask(
        BY_NODE, SPOT_FIRST, gpus(1, [toleration("spot", "true", effect="NoExecute")]),
        (("gpus", "spot", "NoFit"), ("gpus", "hopper", "Fit")), "hopper",
    ),
    # Kueue: "taint_and_toleration": a flavor's own tolerations count in its taint check
    "a-flavors-own-toleration-tolerates-its-taint": Ask(
        edited(
            BY_NODE,
            'effect: NoSchedule}]',
            'effect: NoSchedule}]\n      tolerations: [{key: spot, operator: Exists}]',
        ),
        SPOT_FIRST, gpus(1), (("gpus", "spot", "Fit"),), "spot",
    ),
    "a-prefer-no-schedule-taint-never-refuses": Ask(
        edited(BY_NODE, "effect: NoSchedule}]", "effect: PreferNoSchedule}]"),
        SPOT_FIRST, gpus(1), (("gpus", "spot", "Fit"),), "spot",
    ),
    "a-flavors-tolerations-reach-its-devices-taints": Ask(
        BY_NODE, hpc(q("gpus/edge"), q("gpus/hopper")), gpus(1), (("gpus", "edge", "Fit"),),
        "edge",
    ),
    "without-the-flavors-toleration-tainted-devices-are-no-fit": Ask(
        edited(BY_NODE, "\n      tolerations: [{key: maintenance, operator: Exists}]", ""),
        hpc(q("gpus/edge"), q("gpus/hopper")), gpus(1),
        (("gpus", "edge", "NoFit"), ("gpus", "hopper", "Fit")), "hopper",
        reason=FlavorReason.NO_DEVICES,
    ),
    "first-available-drops-the-alternatives-that-do-not-tolerate": Ask(
        BY_NODE, SPOT_FIRST,
        claim("c")
        .first_available("g", sub("two", "gpu", 2), sub("one", "gpu", 1, tolerations=[SPOT]))
        .build(),
        (("gpus", "spot", "Fit"),), "spot", ("gpus/spot",),
    ),
    "first-available-with-no-alternative-tolerating-is-no-fit": Ask(
        BY_NODE, SPOT_FIRST,
        claim("c").first_available("g", sub("two", "gpu", 2), sub("one", "gpu", 1)).build(),
        (("gpus", "spot", "NoFit"), ("gpus", "hopper", "Fit")), "hopper", ("gpus/hopper",),
        reason=FlavorReason.UNTOLERATED_TAINT,
    ),
    # device-level flavors: whole GPUs and MIG slices on one node, by device class
    "a-device-class-flavor-takes-the-mig-slices": Ask(
        DEVICE_LEVEL, hpc(q("gpus/mig"), q("gpus/whole"), q("models/h100"), q("models/other")),
        claim("c").request("s", "mig", 1).build(),
        (("gpus", "mig", "Fit"),), "mixed", ("gpus/mig",),
    ),
    "a-whole-gpu-request-is-no-fit-on-the-mig-flavor": Ask(
        DEVICE_LEVEL, hpc(q("gpus/mig"), q("gpus/whole"), q("models/h100"), q("models/other")),
        claim("c").request("g", "gpu", 1, f'{MODEL} == "L40S"').build(),
        (("gpus", "mig", "NoFit"), ("gpus", "whole", "Fit"), ("models", "h100", "NoFit"),
         ("models", "other", "Fit")),
        "ada", ("gpus/whole", "models/other"), reason=FlavorReason.NO_DEVICES,
    ),
    # firstAvailable: each alternative may land on another flavor, charged to it
    "first-available-lands-its-first-alternative-on-the-first-flavor": Ask(
        DEVICE_LEVEL, hpc(q("gpus/whole"), q("gpus/mig"), q("models/h100"), q("models/other")),
        claim("c").first_available("g", sub("whole", "gpu", 1), sub("slice", "mig", 1)).build(),
        (("gpus", "whole", "Fit"), ("models", "h100", "Fit")), None, ("gpus/whole", "models/h100"),
    ),
    "first-available-lands-its-second-alternative-on-the-second-flavor": Ask(
        DEVICE_LEVEL, hpc(q("gpus/mig"), q("gpus/whole"), q("models/h100"), q("models/other")),
        claim("c").first_available("g", sub("whole", "gpu", 1), sub("slice", "mig", 1)).build(),
        (("gpus", "mig", "Fit"),), "mixed", ("gpus/mig",),
    ),
    "first-available-falls-back-when-the-flavors-quota-is-spent": Ask(
        DEVICE_LEVEL,
        hpc(q("gpus/mig", 0), q("gpus/whole"), q("models/h100"), q("models/other")),
        claim("c").first_available("g", sub("slice", "mig", 1), sub("whole", "gpu", 1)).build(),
        (("gpus", "mig", "NoFit"), ("gpus", "whole", "Fit"), ("models", "h100", "Fit")),
        None, ("gpus/whole", "models/h100"), reason=FlavorReason.ABOVE_MAX,
    ),
    # a CEL selector: a flavor of the devices' model, whatever their node
    "a-cel-selector-flavor-takes-the-models-devices": Ask(
        DEVICE_LEVEL, hpc(q("gpus/whole"), q("gpus/mig"), q("models/other"), q("models/h100", 1)),
        claim("c").request("g", "gpu", 2).build(),
        (("gpus", "whole", "Fit"), ("models", "other", "Fit")), None,
        ("gpus/whole", "models/other"),
    ),
    # overlapping flavors (`other` selects every GPU): a device is charged to the first of
    # them in the *tenant's* order, whatever order the resource lists them in
    "an-overlapping-earlier-flavor-is-charged-not-the-later": Ask(
        DEVICE_LEVEL,
        hpc(q("gpus/whole"), q("gpus/mig"), q("models/other"), q("models/h100")),
        claim("c").request("g", "gpu", 1, f'{MODEL} == "H100"').build(),
        (("gpus", "whole", "Fit"), ("models", "other", "Fit")),
        None, ("gpus/whole", "models/other"), reason=None,
    ),
    "an-overlapping-flavor-the-tenant-lists-first-is-charged-not-the-resources-first": Ask(
        DEVICE_LEVEL.replace("flavors: [h100, other]", "flavors: [other, h100]"),
        hpc(q("gpus/whole"), q("gpus/mig"), q("models/h100"), q("models/other")),
        claim("c").request("g", "gpu", 1, f'{MODEL} == "H100"').build(),
        (("gpus", "whole", "Fit"), ("models", "h100", "Fit")),
        None, ("gpus/whole", "models/h100"), reason=None,
    ),
    # a request of a class the resource does not list (any-gpu) is not pinned to the flavor
    # tried, yet its devices count where the resource's classes select them: found on the
    # L40S, they are not h100's but `other`'s (NoFit, charged-elsewhere), then Fit on other
    "a-request-of-an-unlisted-class-found-off-the-flavor-is-charged-elsewhere": Ask(
        DEVICE_LEVEL, hpc(q("gpus/whole"), q("gpus/mig"), q("models/h100"), q("models/other")),
        claim("c").request("g", "any-gpu", 1, f'{MODEL} == "L40S"').build(),
        (("gpus", "whole", "Fit"), ("models", "h100", "NoFit"), ("models", "other", "Fit")),
        "ada", ("gpus/whole", "models/other"), reasons=("", "charged-elsewhere", ""),
    ),
    # a request counting two flavored resources: their flavors in turn, each pinned to those
    # chosen before (no going back, as Kueue's resource groups)
    "two-flavored-resources-are-assigned-in-turn": Ask(
        TWO_RESOURCES,
        hpc(q("gpus/mixed"), q("gpus/hopper"), q("slices/hopper"), q("slices/mixed")),
        claim("c").request("g", "gpu", 1).request("s", "mig", 1).build(),
        (("gpus", "mixed", "Fit"), ("slices", "hopper", "NoFit"), ("slices", "mixed", "Fit")),
        "mixed", ("gpus/mixed", "slices/mixed"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", ASKS.values(), ids=ASKS.keys())
def test_what_a_flavor_selects_and_who_may_use_it(case: Ask) -> None:
    """The flavors hpc's grant tries (resource, flavor, mode), where it lands, what it is
    charged to, and why the first flavor was not taken."""
    for fleet in fleet_of(model_of(case.quota + PRIORITIES, case.tenants)):
        answer = fleet.service.allocate(Query((case.request,)), LeaseOptions("hpc/grant"))
        tried = [(a.resource, a.flavor, a.mode.label) for a in answer.flavors]
        assert tried == list(case.tried)
        if case.reason is not None:
            assert answer.flavors[0].reason is case.reason
        if case.reasons:
            assert [a.reason or "" for a in answer.flavors] == list(case.reasons)
        assert answer.outcome is Outcome.ALLOCATED
        if case.lands is not None:
            assert families(answer) == {case.lands}
        if case.charged:
            status = fleet.service.quotas.status(["hpc"])  # type: ignore[union-attr]
            assert {row.resource for row in status if row.used} == set(case.charged)


def test_capacity_counts_what_each_flavors_quota_allows() -> None:
    """hpc lists hopper (nominal 2; 4 H100s free) and ada (nominal 3; 3 L40Ss free): of one-GPU
    units, its quota allows 2 on hopper and 3 on ada, 5 in all, wherever the solver's first
    placement would land; with one H100 held, 1 more on hopper."""
    model = model_of(BY_NODE + PRIORITIES, tenants(TWO_FLAVORS))
    for fleet in fleet_of(model):
        counted = fleet.service.capacity(Query((gpus(1),)), owner="hpc/x")
        assert counted.within_quota == 5 and counted.total > 5
        fleet.hold("hpc", "h1", 1, "", "hop-1")
        assert fleet.service.capacity(Query((gpus(1),)), owner="hpc/x").within_quota == 4


# --- flavors are per tenant (Kueue's flavors are per ClusterQueue) ----------------------------

# The Kueue bridge example's ClusterQueue (flavor gpu-flavor: no nodeLabels, every GPU) beside
# ClusterQueues on flavor hopper (nodeLabels family=hopper), in one cohort: `team` lists
# gpu-flavor, `research` and `vision` hopper, `both` the two in the resource's order.
PER_TENANT = """\
    resourceFlavors:
    - {name: gpu-flavor}
    - {name: hopper, nodeLabels: {family: hopper}}
    resources:
    - {name: gpus, deviceClassNames: [gpu], flavors: [gpu-flavor, hopper]}
"""
PER_TENANT_TENANTS = """\
- {name: team, cohort: org, quotas: [{resource: gpus, flavor: gpu-flavor, nominal: 8}]}
- {name: research, cohort: org, quotas: [{resource: gpus, flavor: hopper, nominal: 2}]}
- {name: vision, cohort: org, quotas: [{resource: gpus, flavor: hopper, nominal: 2}]}
- name: both
  quotas:
  - {resource: gpus, flavor: gpu-flavor, nominal: 8}
  - {resource: gpus, flavor: hopper, nominal: 8}
"""


@dataclass(frozen=True)
class PerTenant:
    holdings: tuple[tuple[str, str, int, str, str], ...]  # (tenant, name, GPUs, priority, node)
    tenant: str  # who asks
    asks: int  # GPUs
    tried: tuple[tuple[str, str, int], ...]  # (flavor, mode, borrows) in order
    lands: str | None  # the family the grant lands on (None: not ALLOCATED)
    used: dict[tuple[str, str], int]  # (tenant, quota resource) -> milli-units used, after
    outcome: Outcome = Outcome.ALLOCATED


TEAM_ON_HOPPER = (("team", "team-h", 2, "", "hop-1"),)
PER_TENANT_CASES = {
    # the case found under a real Kueue: every GPU was charged to gpu-flavor (listed first on
    # the resource), so research's grants were all refused while Kueue admitted them
    "a-label-less-flavor-of-another-tenant-does-not-take-its-devices": PerTenant(
        (), "research", 2,
        (("hopper", "Fit", 0),), "hopper",
        {("research", "gpus/hopper"): 2000},
    ),
    "the-label-less-flavors-tenant-is-charged-to-it-on-the-same-nodes": PerTenant(
        TEAM_ON_HOPPER, "research", 2,
        (("hopper", "Fit", 0),), "hopper",
        {("team", "gpus/gpu-flavor"): 2000, ("research", "gpus/hopper"): 2000},
    ),
    # the cohort sums per flavor name: team's GPUs on hopper nodes are gpu-flavor's, so they
    # take nothing of the hopper quota research borrows from vision
    "borrowing-counts-the-cohorts-usage-of-the-flavor-by-name": PerTenant(
        (("research", "r-own", 2, "", "hop-1"), ("team", "team-m", 1, "", "mix-1")), "research", 2,
        (("hopper", "Fit", 1),), "hopper",
        {("research", "gpus/hopper"): 4000, ("team", "gpus/gpu-flavor"): 1000},
    ),
    # the search avoids devices none of the tenant's flavors selects: research waits for hopper
    # devices (team's holding counts no resource research's grant counts: no victim) rather
    # than taking L40Ss and being refused for them
    "with-its-flavors-devices-held-it-is-not-placed-on-others": PerTenant(
        (*TEAM_ON_HOPPER, ("team", "team-h2", 2, "", "hop-2")), "research", 2,
        (("hopper", "NoCandidates", 0),), None,
        {("team", "gpus/gpu-flavor"): 4000},
        Outcome.UNSATISFIABLE,
    ),
    # 3 GPUs on one node: no hopper node holds them (2 each), the L40S node would; refused,
    # naming the flavor those devices are charged to (one research does not list)
    "what-no-node-of-its-flavors-holds-is-no-fit-and-nothing-else-is-taken": PerTenant(
        (), "research", 3,
        (("hopper", "NoFit", 0),), None,
        {},
        Outcome.QUOTA_EXCEEDED,
    ),
    # a tenant listing the flavors as the resource does: the native rule (the label-less
    # flavor listed first takes every device, hopper's too)
    "a-tenant-listing-them-in-the-resources-order-is-charged-as-before": PerTenant(
        (), "both", 2,
        (("gpu-flavor", "Fit", 0),), None,
        {("both", "gpus/gpu-flavor"): 2000},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", PER_TENANT_CASES.values(), ids=PER_TENANT_CASES.keys())
def test_flavors_are_charged_in_each_tenants_own_order(case: PerTenant) -> None:
    """A device is charged to the first flavor *of the asking tenant's quotas* that selects it
    (Kueue's flavors are per ClusterQueue): the flavors tried, where the grant lands, and every
    tenant's usage per flavored quota resource afterwards (the ledger's, QuotaStatus's)."""
    for fleet in fleet_of(model_of(PER_TENANT + PRIORITIES, PER_TENANT_TENANTS)):
        for tenant, name, count, priority, on in case.holdings:
            fleet.hold(tenant, name, count, priority, on)
        lease = LeaseOptions(f"{case.tenant}/grant")
        answer = fleet.service.allocate(Query((gpus(case.asks),)), lease)
        tried = [(a.flavor, a.mode.label, a.borrows) for a in answer.flavors]
        assert tried == list(case.tried)
        assert answer.outcome is case.outcome, (answer.quota, answer.flavors)
        assert not answer.preemption
        if case.outcome is Outcome.QUOTA_EXCEEDED:
            assert [(r.resource, r.listed) for r in answer.quota] == [("gpus/gpu-flavor", False)]
        if case.lands is not None:
            assert families(answer) == {case.lands}
        status = fleet.service.quotas.status()  # type: ignore[union-attr]
        assert {(r.tenant, r.resource): r.used for r in status if r.used} == case.used


# --- a grant is charged to the flavor it was assigned (Kueue's accounting) --------------------

# `cat` lists the label-less gpu-flavor (every GPU) before hopper, as a ClusterQueue may; `res`
# lists hopper only, in cohort org with `cat` (its unused hopper quota is what `cat` borrows).
ASSIGNED_TENANTS = """\
- name: cat
  cohort: org
  quotas:
  - {resource: gpus, flavor: gpu-flavor, nominal: 2}
  - {resource: gpus, flavor: hopper, nominal: 2}
- {name: res, cohort: org, quotas: [{resource: gpus, flavor: hopper, nominal: 2}]}
"""
# the same quotas with `cat` in no cohort (its entries move to a ledger of its own on reload)
ALONE_TENANTS = ASSIGNED_TENANTS.replace("  cohort: org\n", "", 1)


@dataclass(frozen=True)
class Charged:
    holdings: tuple[tuple[str, str, int, str, str], ...]  # (tenant, name, GPUs, priority, node)
    tenant: str  # who asks
    asks: int  # GPUs (per item)
    tried: tuple[tuple[str, str, int], ...]  # (flavor, mode, borrows) in order
    lands: str | None  # the family the grant lands on (None: anywhere, or not ALLOCATED)
    used: dict[tuple[str, str], int]  # (tenant, quota resource) -> milli-units, after the ask
    outcome: Outcome = Outcome.ALLOCATED
    victims: tuple[str, ...] = ()
    items: int = 0  # >0: the ask is an AllocateBatch run of that many items (tried unchecked)
    then: str = ""  # release | preempt | reload | reconcile: done after the ask
    after: dict[tuple[str, str], int] | None = None  # usage once `then` is done
    on: str = ""  # the node the ask names
    quota: str = PER_TENANT
    tenants: str = ASSIGNED_TENANTS


# cat lists hopper, a flavor of node labels *and* device classes, before the catch-all: a
# pinned search cannot leave hopper's devices out of the catch-all's (NotIn covers node-level
# flavors, a negated selector device-level ones), so it may find them there
BOTH_LEVELS = PER_TENANT.replace(
    "{name: hopper, nodeLabels: {family: hopper}}",
    "{name: hopper, nodeLabels: {family: hopper}, deviceClassNames: [gpu]}",
)
HOPPER_FIRST = """\
- name: cat
  quotas:
  - {resource: gpus, flavor: hopper, nominal: 2}
  - {resource: gpus, flavor: gpu-flavor, nominal: 2}
"""
CAT_ANY = (("cat", "cat-any", 2, "", "ada-1"),)  # cat's gpu-flavor quota spent, on L40Ss
CAT_SPENT_CATCH_ALL = {("cat", "gpus/gpu-flavor"): 2000, ("cat", "gpus/hopper"): 2000}
CHARGED_CASES = {
    # Kueue admits on the next flavor once the catch-all's quota is spent, and counts the
    # workload there; charged by what selects its devices, it was gpu-flavor's again (NoFit,
    # charged-elsewhere) and refused
    "a-spent-catch-all-falls-to-the-labelled-flavor-and-is-counted-there": Charged(
        CAT_ANY, "cat", 2,
        (("gpu-flavor", "NoCandidates", 0), ("hopper", "Fit", 0)), "hopper",
        CAT_SPENT_CATCH_ALL,
    ),
    "a-catch-all-with-quota-left-is-charged-first": Charged(
        (), "cat", 2,
        (("gpu-flavor", "Fit", 0),), None,
        {("cat", "gpus/gpu-flavor"): 2000},
    ),
    # an AllocateBatch run: the first item takes the catch-all's last GPU, the second falls
    # to hopper and is counted there
    "a-batch-falls-to-the-labelled-flavor-item-by-item": Charged(
        (("cat", "cat-any", 1, "", "ada-1"),), "cat", 1,
        (), None,
        {("cat", "gpus/gpu-flavor"): 2000, ("cat", "gpus/hopper"): 1000},
        items=2,
    ),
    "release-frees-the-labelled-flavors-usage": Charged(
        CAT_ANY, "cat", 2,
        (("gpu-flavor", "NoCandidates", 0), ("hopper", "Fit", 0)), "hopper",
        CAT_SPENT_CATCH_ALL,
        then="release", after={("cat", "gpus/gpu-flavor"): 2000},
    ),
    # cat borrows res's hopper quota (its own hopper grant, then one more); res reclaims: the
    # victim is cat's borrowing grant, whose amounts are hopper's as its ledger entry holds
    # them (what selects its devices, gpu-flavor, frees nothing of hopper: no victim)
    "preemption-counts-the-victims-amounts-on-their-assigned-flavor": Charged(
        (*CAT_ANY, ("cat", "cat-h1", 2, "", "hop-1"), ("cat", "cat-h2", 2, "", "hop-2")),
        "res", 2,
        (("hopper", "Reclaim", 0),), None,
        {("cat", "gpus/gpu-flavor"): 2000, ("cat", "gpus/hopper"): 4000},
        Outcome.UNSATISFIABLE, ("cat-h2",),
        then="preempt", after={**CAT_SPENT_CATCH_ALL, ("res", "gpus/hopper"): 2000},
    ),
    # the policy reloaded with cat in no cohort: its entries move to its own ledger with the
    # amounts they were charged
    "a-reload-keeps-the-charges": Charged(
        CAT_ANY, "cat", 2,
        (("gpu-flavor", "NoCandidates", 0), ("hopper", "Fit", 0)), "hopper",
        CAT_SPENT_CATCH_ALL,
        then="reload", after=CAT_SPENT_CATCH_ALL,
    ),
    # hopper spent, the catch-all's pinned search finds hopper's devices on hop-2 (it does
    # not leave them out): charged to the catch-all it was assigned, as Kueue would (charged
    # by what selects them, they were hopper's again: NoFit, charged-elsewhere)
    "a-flavor-of-labels-and-devices-spent-passes-its-devices-to-the-next": Charged(
        (("cat", "cat-h1", 2, "", "hop-1"),), "cat", 2,
        (("hopper", "NoCandidates", 0), ("gpu-flavor", "Fit", 0)), "hopper",
        {("cat", "gpus/hopper"): 2000, ("cat", "gpus/gpu-flavor"): 2000},
        on="hop-2", quota=BOTH_LEVELS, tenants=HOPPER_FIRST,
    ),
    # the reconciler adds entries only for reservations none covers: it leaves the charges
    "a-reconcile-keeps-the-charges": Charged(
        CAT_ANY, "cat", 2,
        (("gpu-flavor", "NoCandidates", 0), ("hopper", "Fit", 0)), "hopper",
        CAT_SPENT_CATCH_ALL,
        then="reconcile", after=CAT_SPENT_CATCH_ALL,
    ),
}  # fmt: skip


def _used(fleet: Fleet) -> dict[tuple[str, str], int]:
    """Every tenant's usage per quota resource, as QuotaStatus answers it."""
    rows, enforced = fleet.service.quota_status()
    assert enforced
    return {(r.tenant, r.resource): r.used for r in rows if r.used}


@pytest.mark.parametrize("case", CHARGED_CASES.values(), ids=CHARGED_CASES.keys())
def test_a_grant_is_charged_to_the_flavor_it_was_assigned(case: Charged) -> None:
    """A grant is charged to the flavor its flavor search was pinned to when it found the
    placement (Kueue counts a workload on the flavor it assigned), and its ledger entry keeps
    that charge: QuotaStatus, release, preemption's amounts, a reload and the reconciler all
    count it there."""
    for fleet in fleet_of(model_of(case.quota + PRIORITIES, case.tenants)):
        for tenant, name, count, priority, on in case.holdings:
            fleet.hold(tenant, name, count, priority, on)
        lease = LeaseOptions(f"{case.tenant}/grant")
        query = Query((gpus(case.asks),), node=case.on)
        if case.items:
            items = [(query, LeaseOptions(f"{case.tenant}/item-{i}")) for i in range(case.items)]
            answers = fleet.service.allocate_run(items)
            assert [a.outcome for a in answers if isinstance(a, Answer)] == [
                Outcome.ALLOCATED
            ] * case.items
            assert _used(fleet) == case.used
            continue
        answer = fleet.service.allocate(query, lease)
        tried = [(a.flavor, a.mode.label, a.borrows) for a in answer.flavors]
        assert tried == list(case.tried)
        assert answer.outcome is case.outcome, (answer.quota, answer.flavors)
        assert fleet.names(answer) == list(case.victims)
        if case.lands is not None:
            assert families(answer) == {case.lands}
        assert _used(fleet) == case.used
        service, quotas = fleet.service, fleet.service.quotas
        assert quotas is not None
        if case.then == "release":
            for reservation in answer.reservations:
                service.release(reservation.id, lease.owner, reservation.fencing_token)
        elif case.then == "preempt":
            taken = service.allocate(query, replace(lease, preempt=True))
            assert taken.outcome is Outcome.ALLOCATED and fleet.names(taken) == list(case.victims)
            assert families(taken) == {"hopper"}
        elif case.then == "reload":
            fleet.models.append(model_of(PER_TENANT + PRIORITIES, ALONE_TENANTS))
            assert {r.cohort for r in quotas.status(["cat"])} == {""}
        elif case.then == "reconcile":
            reconciled = quotas.reconcile(
                service.store, service.holdings.reservations, service.reservation_usage
            )
            assert reconciled == (0, 0)
        if case.after is not None:
            assert _used(fleet) == case.after
