"""What the client returns: small frozen values, never protobuf messages.

Allocations are the DRA model's AllocationResult (services.common.dra.model), so a caller can
write them to a ResourceClaim's status or read the devices out directly. `Placement.reason()`
is the human answer to "why not?" that the bridges print: Explain's messages plus who holds
the devices that blocked the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from services.common.dra.model import AllocationResult, DeviceID

__all__ = [
    "Capacity",
    "ClaimAllocation",
    "Explanation",
    "Holder",
    "NodeMiss",
    "NodePlacement",
    "Outcome",
    "Placement",
    "Reservation",
    "ReservationChange",
    "ReservationState",
]


class Outcome(StrEnum):
    ALLOCATED = "Allocated"
    UNSATISFIABLE = "Unsatisfiable"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    QUOTA_EXCEEDED = "QuotaExceeded"


class ReservationState(StrEnum):
    RESERVED = "Reserved"
    COMMITTED = "Committed"


@dataclass(frozen=True)
class ClaimAllocation:
    """One claim's devices, as DRA would write them to status.allocation."""

    namespace: str
    name: str
    uid: str
    allocation: AllocationResult

    @property
    def devices(self) -> tuple[DeviceID, ...]:
        return tuple(r.device_id for r in self.allocation.results)


@dataclass(frozen=True)
class Reservation:
    """Devices held for an owner on one node: leased (RESERVED) or until released (COMMITTED)."""

    id: str
    owner: str
    node_name: str
    state: ReservationState
    allocations: tuple[ClaimAllocation, ...] = ()
    devices: tuple[DeviceID, ...] = ()
    fencing_token: int = 0
    expires_at: datetime | None = None
    idempotency_key: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    created_at: datetime | None = None
    committed_at: datetime | None = None
    tenant: str = ""  # of another tenant, only this, node, devices, state and expiry are shown
    # DRA binding conditions (docs/reservations.md, "Binding"): "" (none to wait for),
    # "binding" (not usable yet: Commit answers NotBound) or "bound"
    binding: str = ""


@dataclass(frozen=True)
class Holder:
    """A reservation holding devices that a request could not get."""

    reservation_id: str
    owner: str
    node_name: str
    state: ReservationState
    devices: tuple[DeviceID, ...] = ()
    expires_at: datetime | None = None
    tenant: str = ""  # another tenant's holder has no reservation_id or owner

    def __str__(self) -> str:
        state = "committed" if self.state is ReservationState.COMMITTED else "reserved"
        shown = ", ".join(d.device for d in self.devices[:4])
        more = f" (+{len(self.devices) - 4} more)" if len(self.devices) > 4 else ""
        if not self.reservation_id:
            return f"tenant {self.tenant} holds {shown}{more} on {self.node_name} ({state})"
        return (
            f"{self.owner} holds {shown}{more} on {self.node_name} ({state}, {self.reservation_id})"
        )


@dataclass(frozen=True)
class NodeMiss:
    """One of the closest nodes that did not fit, and what was missing there."""

    node_name: str
    message: str
    missing_devices: int = 0


@dataclass(frozen=True)
class Explanation:
    """Why claims fit or not, as the allocator recorded it during its search."""

    messages: tuple[str, ...] = ()
    nodes: tuple[NodeMiss, ...] = ()


@dataclass(frozen=True)
class NodePlacement:
    """One node of a gang: the claims' allocations there, in claim order."""

    node_name: str
    allocations: tuple[ClaimAllocation, ...] = ()
    score: float = 0.0


@dataclass(frozen=True)
class TenantQuota:
    """One tenant's standing on one quota resource, as QuotaStatus answers it (Kubernetes
    quantities; an empty limit is unlimited)."""

    tenant: str
    resource: str
    cohort: str
    nominal: str
    used: str
    borrowed: str
    lent: str
    left: str
    borrowing_limit: str = ""
    lending_limit: str = ""
    # the tenant's reservations revoked by a preemption whose holders were not told yet
    pending_preemptions: int = 0
    pending_preemption_ids: tuple[str, ...] = ()  # the oldest of them
    cohort_path: tuple[str, ...] = ()  # the cohorts from the root down to its own
    fair_sharing_weight: str = "1"
    weighted_share: int = 0  # Kueue's weightedShare: per tenant, its dominant resource share
    dominant_resource: str = ""
    decayed_used: str = ""  # its usage of the resource with a half-life ("" when not configured)
    decayed_usage: str = ""  # per tenant: the weighted sum, what a bridge orders its queue by
    decayed_at: float | None = None  # when it was sampled (seconds since the epoch)


@dataclass(frozen=True)
class CohortQuota:
    """One cohort's standing on one quota resource, as QuotaStatus answers it (Kueue's
    hierarchical Cohort; Kubernetes quantities; an empty limit is unlimited)."""

    cohort: str
    resource: str
    cohort_path: tuple[str, ...]  # the cohorts from the root down to its parent
    nominal: str
    subtree_quota: str
    used: str
    borrowed: str
    lent: str
    left: str
    borrowing_limit: str = ""
    lending_limit: str = ""
    fair_sharing_weight: str = "1"
    weighted_share: int = 0
    dominant_resource: str = ""


@dataclass(frozen=True)
class QuotaStatus:
    """QuotaStatus's answer: the tenants' rows, the cohorts above them, and whether quotas and
    fair sharing are on."""

    tenants: tuple[TenantQuota, ...]
    cohorts: tuple[CohortQuota, ...] = ()
    enabled: bool = False
    fair_sharing: bool = False


@dataclass(frozen=True)
class Placement:
    """The answer of Allocate or Explain: where the claims go (`gang`: one NodePlacement per
    node of a gang, `node_name` and `allocations` then empty), or why they do not fit."""

    outcome: Outcome
    node_name: str = ""
    allocations: tuple[ClaimAllocation, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    explanation: Explanation | None = None
    holders: tuple[Holder, ...] = ()
    inventory_generation: int = 0
    score: float = 0.0
    gang: tuple[NodePlacement, ...] = ()
    quota_refusals: tuple[str, ...] = ()  # QUOTA_EXCEEDED: each quota the grant would exceed
    preemption: tuple[str, ...] = ()  # the victims a preempt call would revoke (or revoked)
    flavors: tuple[str, ...] = ()  # a flavored grant: each flavor tried, its mode and why

    @property
    def fits(self) -> bool:
        return self.outcome is Outcome.ALLOCATED

    @property
    def devices(self) -> tuple[DeviceID, ...]:
        """Every device placed (on every node of a gang)."""
        allocations = [*self.allocations, *(a for m in self.gang for a in m.allocations)]
        return tuple(d for a in allocations for d in a.devices)

    def reason(self, max_lines: int = 12) -> str:
        """Explain's summary, who holds the devices that blocked the claims, then Explain's
        other lines (per node, per request): the most telling first, for short logs."""
        messages = self.explanation.messages if self.explanation is not None else ()
        lines = [f"outcome: {self.outcome.value}", *messages[:1]]
        lines.extend(f"quota: {refusal}" for refusal in self.quota_refusals)
        lines.extend(f"preempt: {victim}" for victim in self.preemption)
        lines.extend(f"flavor: {flavor}" for flavor in self.flavors)
        lines.extend(f"held: {holder}" for holder in self.holders)
        lines.extend(messages[1:])
        if len(lines) > max_lines:
            lines = [*lines[:max_lines], f"... {len(lines) - max_lines} more lines"]
        return "\n".join(lines)


@dataclass(frozen=True)
class Capacity:
    """How many copies of the claims (one unit = all claims on one node) fit now."""

    total: int
    exact: bool
    nodes: Mapping[str, int] = field(default_factory=dict)
    models: Mapping[str, int] = field(default_factory=dict)
    inventory_generation: int = 0


@dataclass(frozen=True)
class ReservationChange:
    """One change of WatchReservations (docs/api.md). `kind`: reserved, committed, renewed,
    released, expired, preempted (`preempted_by` names the preemptor), heartbeat or resync (list
    again: changes were lost), the reservation's fields empty for the last two; unspecified for
    a kind this client does not know (a newer server's)."""

    kind: str
    reservation_id: str = ""
    node_name: str = ""
    owner: str = ""
    fencing_token: int = 0
    preempted_by: str = ""
