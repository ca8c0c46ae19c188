"""The values the allocator's use cases take and give: no protobuf, no gRPC.

`Query` is what Allocate, Explain and Capacity share (claims and where/how to place them; with
`gang`, the same claims on several nodes); `LeaseOptions` what reserving adds; `Answer` /
`CapacityAnswer` / `Holder` what comes back. A placement is one shape: the core's
`NodePlacement`s, one for a single node, one per member for a gang.
The servicer maps them from and to protobuf (adapters/grpc/mapping.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from services.allocator.core import (
    Explanation,
    FlavorAttempt,
    NodePlacement,
    Policy,
    PreemptionReason,
    QuotaRefusal,
    Score,
    Stats,
    TenantStatus,
    TopologyConstraint,
)
from services.allocator.reservations.model import Reservation, ReservationState
from services.common.dra.model import (
    AllocationResult,
    DeviceClass,
    DeviceID,
    NodeSelector,
    ResourceClaim,
)

__all__ = [
    "Accuracy",
    "Answer",
    "CapacityAnswer",
    "GangSpec",
    "Holder",
    "LeaseOptions",
    "NodeCount",
    "Outcome",
    "Query",
    "Victim",
    "claim_ref",
]


def claim_ref(namespace: str, name: str) -> str:
    """How a reservation names a claim: `namespace/name`."""
    return f"{namespace or 'default'}/{name}"


@dataclass(frozen=True)
class GangSpec:
    """A multi-node job: the query's claims on each of `node_count` distinct nodes, all sharing
    one value of the node label `group_by_label` (any nodes when empty)."""

    node_count: int
    group_by_label: str = ""


@dataclass(frozen=True)
class Query:
    """Claims to place together on one node (on each member node, for a gang), and the
    constraints on where and how."""

    claims: tuple[ResourceClaim, ...]
    device_classes: tuple[DeviceClass, ...] = ()  # inline; shadow the server's for this call
    node: str = ""  # pinned node; empty: the allocator chooses
    node_selector: NodeSelector | None = None  # only nodes it matches
    policy: Policy | None = None  # None: the server's default
    max_steps: int = 0  # 0: the server's limit (a request can only lower it)
    max_nodes: int = 0  # 0: every node
    min_generation: int = 0  # wait until the view has this inventory generation
    explain: bool = False  # record reasons even when the claims fit
    topology_constraints: tuple[TopologyConstraint, ...] = ()  # besides the claims' annotations
    gang: GangSpec | None = None  # the claims on several nodes (then `node` is empty)

    @property
    def node_count(self) -> int:
        """How many nodes its placement spans: a gang's members, else one."""
        return self.gang.node_count if self.gang is not None else 1


@dataclass(frozen=True)
class LeaseOptions:
    """How to reserve: for whom, how long, and the retry-safety key."""

    owner: str
    lease_seconds: float | None = None  # None: the server's default
    idempotency_key: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    request_digest: str = ""  # a digest of what was asked: a reused key must ask the same
    priority_class: str = ""  # the policy's priority class ("" : its default)
    preempt: bool = False  # revoke the victims of a preemption proposal, then reserve
    # when the work was queued (seconds since the epoch; None: when the call arrived)
    queued_at: float | None = None
    max_reservations: int | None = None  # the owner's tenant's live reservations bound


class Outcome(StrEnum):
    ALLOCATED = "allocated"
    UNSATISFIABLE = "unsatisfiable"
    BUDGET_EXHAUSTED = "budget-exhausted"  # the step budget or the deadline ran out
    QUOTA_EXCEEDED = "quota-exceeded"  # it fits, but not within the tenant's quota


@dataclass(frozen=True)
class Holder:
    """A live reservation holding devices that blocked a claim (for Explain)."""

    reservation_id: str
    owner: str
    node: str
    state: ReservationState
    expires_at: float | None
    devices: tuple[DeviceID, ...]
    redacted: bool = False  # another tenant's: reservation_id and owner hidden (app/tenancy.py)


@dataclass(frozen=True)
class Victim:
    """A reservation a preemption revokes (or would): who holds it, and by which rule."""

    holder: Holder
    priority_class: str
    reason: PreemptionReason  # by which rule (services/allocator/core/preemption.py)
    moved_to_node: str = ""  # consolidate: the node its replacement is (or would be) on
    replacement_id: str = ""  # consolidate, once done: the replacement reservation


@dataclass(frozen=True)
class Answer:
    """What Allocate and Explain return. When ALLOCATED, `placements` is the placement, one
    shape whatever was asked: one NodePlacement per node it spans (a single node's query is a
    gang of one); its reservations cover every node. Which protobuf fields carry it (a gang's
    `gang_placements`, a single node's `node_name` and `allocations`) is the wire's business:
    the servicer knows what was asked."""

    outcome: Outcome
    generation: int  # the inventory generation the answer was computed from
    claims: tuple[ResourceClaim, ...]
    placements: tuple[NodePlacement, ...] = ()  # allocations one per claim, in claim order
    policy: Policy = Policy.BINPACK
    explanation: Explanation | None = None
    stats: Stats | None = None
    cel_cache_hits: int = 0
    elapsed_seconds: float = 0.0
    reservations: tuple[Reservation, ...] = ()
    holders: tuple[Holder, ...] = ()
    quota: tuple[QuotaRefusal, ...] = ()  # why the tenant's quota refuses it (QUOTA_EXCEEDED)
    preemption: tuple[Victim, ...] = ()  # who would go (not ALLOCATED) or went (ALLOCATED)
    # the flavors tried for a grant charged to flavors, in order (app/flavor_search.py)
    flavors: tuple[FlavorAttempt[None], ...] = ()

    @property
    def single(self) -> NodePlacement | None:
        """The placement when it is on one node (None across several, or when not
        ALLOCATED)."""
        return self.placements[0] if len(self.placements) == 1 else None

    @property
    def node(self) -> str | None:
        """The placement's node when it is on one node (None across several, or on none)."""
        single = self.single
        return single.node if single is not None else None

    @property
    def allocations(self) -> tuple[AllocationResult, ...]:
        """The placement's allocations, one per claim, when it is on one node (else empty)."""
        single = self.single
        return single.allocations if single is not None else ()

    @property
    def score(self) -> Score | None:
        single = self.single
        return single.score if single is not None else None


class Accuracy(StrEnum):
    EXACT = "exact"
    LOWER_BOUND = "lower-bound"  # the search stopped early (budget, deadline, unit bound)


@dataclass(frozen=True)
class NodeCount:
    node: str
    count: int
    accuracy: Accuracy


@dataclass(frozen=True)
class CapacityAnswer:
    total: int
    accuracy: Accuracy
    nodes: tuple[NodeCount, ...]  # nodes with a non-zero count, by name
    models: Mapping[str, int] = field(default_factory=dict)  # product name -> units
    generation: int = 0
    quota: tuple[TenantStatus, ...] = ()  # the caller's tenant's quotas, when it has any
    within_quota: int | None = None  # units its quota headroom allows (None: not limited)
