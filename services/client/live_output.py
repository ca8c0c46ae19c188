"""How the live verbs print: kubectl's columns, `-o wide|json|yaml|name`, and plain values.

Tables are left-aligned columns separated by three spaces (kubectl's printer); JSON and YAML
are a `kind: List` of items in Kubernetes spelling (camelCase, AllocationResult as in a
ResourceClaim's status.allocation), so `jq` and `yq` read them as they read kubectl's. Every
item has `apiVersion: gpualloc.io/v1alpha1` and its kind (Reservation, Device, FleetNode,
Placement, Capacity), and `reservation_ids` reads the reservations of such a file back, as
`commit|renew|release -f FILE` do.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml

from services.client.fleet import DeviceState, FleetNode, Use
from services.client.results import (
    Capacity,
    ClaimAllocation,
    CohortQuota,
    Holder,
    Placement,
    Reservation,
    ReservationChange,
    TenantQuota,
)
from services.common.dra.serialize import allocation_result_to_dict

__all__ = [
    "API_VERSION",
    "capacity_to_dict",
    "change_to_dict",
    "cohort_quota_to_dict",
    "device_to_dict",
    "expiry",
    "fleet_node_to_dict",
    "node_headers",
    "node_row",
    "placement_to_dict",
    "reservation_ids",
    "reservation_to_dict",
    "table",
    "tenant_quota_to_dict",
    "write_structured",
]

API_VERSION = "gpualloc.io/v1alpha1"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], empty: str = "<none>") -> str:
    """Columns as kubectl prints them (no trailing spaces); `empty` for empty cells."""
    cells = [list(headers), *([str(c) if str(c) else empty for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "".join(line.rstrip() + "\n" for line in lines)


def write_structured(data: Any, output: str, out: TextIO, *, compact: bool = False) -> None:
    """`data` as JSON (indented, or one line with `compact`: a stream of objects, one a line)
    or as a YAML document."""
    if output == "json" and compact:
        out.write(json.dumps(data, separators=(",", ":")) + "\n")
    elif output == "json":
        json.dump(data, out, indent=2)
        out.write("\n")
    else:
        yaml.safe_dump(data, out, sort_keys=False)


def as_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "List", "items": items}


def expiry(when: datetime | None, now: datetime | None = None) -> str:
    """`in 1m52s`, `expired 3s ago`, or `never` (committed)."""
    if when is None:
        return "never"
    seconds = int((when - (now or datetime.now(UTC))).total_seconds())
    text = _age(abs(seconds))
    return f"in {text}" if seconds >= 0 else f"expired {text} ago"


def _age(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def _time(when: datetime | None) -> str | None:
    return None if when is None else when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _compact(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v not in (None, "", (), [], {})}


# --- items --------------------------------------------------------------------------------


def claim_allocation_to_dict(allocation: ClaimAllocation) -> dict[str, Any]:
    return _compact(
        namespace=allocation.namespace,
        name=allocation.name,
        uid=allocation.uid,
        allocation=allocation_result_to_dict(allocation.allocation),
    )


def reservation_to_dict(reservation: Reservation) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Reservation",
        **_compact(
            id=reservation.id,
            owner=reservation.owner,
            tenant=reservation.tenant,
            nodeName=reservation.node_name,
            state=reservation.state.value,
            fencingToken=reservation.fencing_token,
            expiresAt=_time(reservation.expires_at),
            createdAt=_time(reservation.created_at),
            committedAt=_time(reservation.committed_at),
            idempotencyKey=reservation.idempotency_key,
            labels=dict(reservation.labels),
            devices=[str(d) for d in reservation.devices],
            claims=[claim_allocation_to_dict(a) for a in reservation.allocations],
        ),
    }


def tenant_quota_to_dict(quota: TenantQuota) -> dict[str, Any]:
    """One tenant's row of QuotaStatus, in the API's camelCase (an unset limit is left out:
    unlimited)."""
    decayed_at = None
    if quota.decayed_at is not None:
        decayed_at = _time(datetime.fromtimestamp(quota.decayed_at, UTC))
    return {
        "apiVersion": API_VERSION,
        "kind": "TenantQuota",
        **_compact(tenant=quota.tenant, resource=quota.resource, cohort=quota.cohort),
        **_standing(quota),
        **_compact(
            decayedUsed=quota.decayed_used,
            decayedUsage=quota.decayed_usage,
            decayedAt=decayed_at,
            pendingPreemptions=quota.pending_preemptions,
            pendingPreemptionIds=list(quota.pending_preemption_ids),
        ),
    }


def cohort_quota_to_dict(quota: CohortQuota) -> dict[str, Any]:
    """One cohort's row of QuotaStatus, in the API's camelCase."""
    return {
        "apiVersion": API_VERSION,
        "kind": "CohortQuota",
        **_compact(cohort=quota.cohort, resource=quota.resource, subtreeQuota=quota.subtree_quota),
        **_standing(quota),
    }


def _standing(quota: TenantQuota | CohortQuota) -> dict[str, Any]:
    """What a tenant's and a cohort's rows share: the quota, its use and limits, the share."""
    return _compact(
        cohortPath=list(quota.cohort_path),
        nominal=quota.nominal,
        used=quota.used,
        borrowed=quota.borrowed,
        lent=quota.lent,
        left=quota.left,
        borrowingLimit=quota.borrowing_limit,
        lendingLimit=quota.lending_limit,
        fairSharingWeight=quota.fair_sharing_weight,
        weightedShare=quota.weighted_share,
        dominantResource=quota.dominant_resource,
    )


def device_to_dict(state: DeviceState) -> dict[str, Any]:
    holder = state.holder
    return {
        "apiVersion": API_VERSION,
        "kind": "Device",
        **_compact(
            nodeName=state.node,
            driver=state.id.driver,
            pool=state.id.pool,
            device=state.id.device,
            type=state.type,
            model=state.model,
            memory=state.memory,
            uuid=state.device.uuid,
            gpuUUID=state.device.gpu_uuid,
            state=state.use.value,
            reservation=None if holder is None else holder.id,
            owner=None if holder is None else holder.owner,
            expiresAt=_time(state.expires_at),
        ),
    }


def node_headers(*, wide: bool = False) -> list[str]:
    """The columns of `get nodes`; `-o wide` adds its own after them, as kubectl's does."""
    headers = ["NAME", "MODEL", "GPUS", "FREE", "TAINTED", "RESERVED", "COMMITTED", "MIG-FREE"]
    return headers + ["DEVICES", "BLOCKED", "RESERVATIONS"] if wide else headers


def node_row(node: FleetNode, *, wide: bool = False) -> list[object]:
    """A `get nodes` row under `node_headers`: FREE and TAINTED count whole GPUs (a tainted
    GPU nothing holds is never free), RESERVED, COMMITTED and BLOCKED count devices."""
    slices = [d for d in node.devices if d.type == "mig"]
    mig = f"{sum(1 for d in slices if d.use is Use.FREE)}/{len(slices)}" if slices else "-"
    row: list[object] = [
        node.name,
        ",".join(node.models),
        len(node.gpus),
        sum(1 for g in node.gpus if g.free),
        sum(1 for g in node.gpus if g.tainted),
        node.count(Use.RESERVED),
        node.count(Use.COMMITTED),
        mig,
    ]
    if wide:
        row += [len(node.devices), node.count(Use.BLOCKED), len(node.reservations)]
    return row


def fleet_node_to_dict(node: FleetNode) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "FleetNode",
        "name": node.name,
        "labels": dict(node.labels),
        "models": list(node.models),
        "gpus": len(node.gpus),
        "freeGPUs": sum(1 for g in node.gpus if g.free),
        "taintedGPUs": sum(1 for g in node.gpus if g.tainted),
        "devices": {use.value: node.count(use) for use in Use},
        "reservations": [r.id for r in node.reservations],
    }


def _holder_to_dict(holder: Holder) -> dict[str, Any]:
    return _compact(
        reservationId=holder.reservation_id,
        owner=holder.owner,
        tenant=holder.tenant,
        nodeName=holder.node_name,
        state=holder.state.value,
        devices=[str(d) for d in holder.devices],
        expiresAt=_time(holder.expires_at),
    )


def placement_to_dict(placement: Placement) -> dict[str, Any]:
    explanation = placement.explanation
    return {
        "apiVersion": API_VERSION,
        "kind": "Placement",
        **_compact(
            outcome=placement.outcome.value,
            nodeName=placement.node_name,
            score=placement.score or None,
            claims=[claim_allocation_to_dict(a) for a in placement.allocations],
            gang=[
                {
                    "nodeName": m.node_name,
                    "claims": [claim_allocation_to_dict(a) for a in m.allocations],
                }
                for m in placement.gang
            ],
            reservations=[reservation_to_dict(r) for r in placement.reservations],
            holders=[_holder_to_dict(h) for h in placement.holders],
            flavors=list(placement.flavors),
            explanation=None
            if explanation is None
            else _compact(
                messages=list(explanation.messages),
                nodes=[
                    _compact(
                        nodeName=n.node_name, message=n.message, missingDevices=n.missing_devices
                    )
                    for n in explanation.nodes
                ],
            ),
            inventoryGeneration=placement.inventory_generation,
        ),
    }


def change_to_dict(change: ReservationChange) -> dict[str, Any]:
    """A WatchReservations change as a watch event: `type` (RESERVED, ..., PREEMPTED) and the
    reservation's fields in Kubernetes spelling."""
    return {
        "type": change.kind.upper(),
        **_compact(
            reservationId=change.reservation_id,
            owner=change.owner,
            nodeName=change.node_name,
            fencingToken=change.fencing_token,
            preemptedBy=change.preempted_by,
        ),
    }


def capacity_to_dict(capacity: Capacity) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Capacity",
        "total": capacity.total,
        "exact": capacity.exact,
        "nodes": dict(capacity.nodes),
        "models": dict(capacity.models),
        "inventoryGeneration": capacity.inventory_generation,
    }


def label_text(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def reservation_ids(document: Any, where: str) -> list[str]:
    """The ids of the Reservations in one document of `get reservations -o yaml|json` or
    `allocate --reserve -o yaml|json` (a List, a Reservation, a Placement's reservations);
    ValueError saying what else is there."""
    if not isinstance(document, dict):
        raise ValueError(f"{where}: not an object of {API_VERSION}")
    kind, version = document.get("kind"), document.get("apiVersion")
    if kind == "List":
        return _ids_of_each(document, "items", where)
    if version != API_VERSION or kind not in ("Reservation", "Placement"):
        raise ValueError(
            f"{where}: kind {kind!r} of {version!r}: expected Reservation or Placement of "
            f"{API_VERSION} (what get reservations and allocate print)"
        )
    if kind == "Placement":
        return _ids_of_each(document, "reservations", where)
    reservation_id = document.get("id")
    if not isinstance(reservation_id, str) or not reservation_id:
        raise ValueError(f"{where}.id: a reservation id is required")
    return [reservation_id]


def _ids_of_each(document: dict[str, Any], field: str, where: str) -> list[str]:
    items = document.get(field) or []
    if not isinstance(items, list):
        raise ValueError(f"{where}.{field}: a list")
    return [
        i for n, item in enumerate(items) for i in reservation_ids(item, f"{where}.{field}[{n}]")
    ]
