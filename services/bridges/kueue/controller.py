"""The AdmissionCheck controller: Kueue admits a Workload only once gpualloc holds its GPUs.

Kueue's admission checks (site/content/en/docs/concepts/admission_check/_index.md): after Kueue
reserves quota for a Workload, every check of its ClusterQueue must turn `Ready` before the
Workload is admitted. This controller owns the checks whose `spec.controllerName` is
`gpualloc.io/admission` and, on every pass (level-triggered, idempotent):

- marks those AdmissionChecks Active (else Kueue keeps their ClusterQueues inactive);
- Workload with quota reserved, check `Pending`: translates its pod sets (translate.py),
  narrows each to the nodes of the ResourceFlavors Kueue assigned it (their nodeLabels, which
  Kueue adds to the pods), allocates and reserves each pod set on one node (owner
  `kueue/<ns>/<name>`, idempotency key `kueue-<uid>-<podset>`, so a retry or a restart finds
  the same devices) — every pod set of every such Workload of a pass in ONE AllocateBatch per
  tenant, in the order Kueue lists them (each seeing the reservations of the ones before it, as
  a scheduling cycle; a Workload with a pod set that does not fit gives the others back once
  the batch answered) — then sets the check
  - `Ready`, with `podSetUpdates[].nodeSelector` `kubernetes.io/hostname: <node>` so the pods
    land where the devices are held;
  - `Retry`, with Explain's message (and who holds the devices), when it does not fit now;
  - `Rejected` when it can never fit (not even on an empty cluster), or cannot be translated;
- check `Ready`, not yet admitted: renews the leases (a lease lost meanwhile sends the
  Workload back to `Pending` handling); Workload `Admitted`: commits the reservations;
- Workload finished, evicted, deactivated, without quota, or deleted: releases its devices;
- a reservation gone from under a Ready or admitted Workload (lease lost, or revoked by a
  gpualloc preemption), even one pod set's of several: the check goes back to `Retry`, which
  makes Kueue evict the Workload and requeue it, and the pod sets' other reservations are
  released. The pod sets the check's `podSetUpdates` name must each have a reservation (a
  restart of the controller loses nothing); a reservation seen on the last pass and gone now
  is asked about (Renew), so the message says who preempted it and gpualloc stops counting it
  as a preemption pending for the tenant (QuotaStatus).

Reservations are made with the controller's priority class and, when it is configured to,
with preemption (GPUALLOC_KUEUE_PRIORITY_CLASS, GPUALLOC_KUEUE_PREEMPT; docs/tenancy.md).

Tenants (`TenantMode`). By default every Workload is charged to the tenant the access policy
binds the controller's identity to. With `cluster-queue`, each Workload is placed acting for
the tenant named as its ClusterQueue (status.admission.clusterQueue, set once Kueue reserved
quota, which is when a Workload is placed; the name is the tenant's, as a policy given as
Kueue's objects names it), so Slurm work and Kueue work of one ClusterQueue share one quota.
Each pass then lists the reservations of every such tenant (and of the identity's own), and a
reservation is renewed, committed or released acting for the tenant that holds it (its owner's
prefix). A tenant the policy does not let the controller act for sends its Workloads to
`Retry` with the policy's reason; the other tenants' go on.

A reservation that outlives its Workload (deleted while the controller was down) is released
on the next pass: every `kueue/...` owner without a live Workload is garbage.

Mirrors (`mirror_namespace`, with `cluster-queue` tenants; mirror.py): each pass also makes
Kueue's count see every reservation of a ClusterQueue's tenant that is not a Kueue Workload's
(a Slurm job's, an API caller's), as a mirror Workload in that namespace on the flavor gpualloc
charged, whose check it sets `Ready` at once without placing anything, and deletes the mirror
once the reservation is gone. Without them Kueue keeps assigning a ClusterQueue's first flavor
to a Workload while Slurm holds that flavor's quota in gpualloc, and never its next one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from services.bridges.kueue.mirror import (
    MIRROR_ANNOTATION,
    OWNER_ANNOTATION,
    gpu_flavors,
    is_mirror,
    local_queue,
    mirror_name,
    wanted_mirrors,
)
from services.bridges.kueue.objects import (
    AdmissionCheck,
    AdmissionCheckState,
    CheckState,
    ClusterQueue,
    PodSetUpdate,
    Workload,
)
from services.bridges.kueue.port import KueueApi
from services.bridges.kueue.translate import PodSetClaims, with_node_labels, workload_claims
from services.bridges.placing import Placer, kueue_owner, kueue_owner_of
from services.bridges.preemptions import PreemptionFollower
from services.client.client import AllocateItem, AllocatorClient
from services.client.results import Placement, Reservation, ReservationState
from services.common.errors import (
    FailedPrecondition,
    GpuallocError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Preempted,
)

__all__ = ["CONTROLLER_NAME", "HOSTNAME_LABEL", "AdmissionController", "Decision", "TenantMode"]

CONTROLLER_NAME = "gpualloc.io/admission"
HOSTNAME_LABEL = "kubernetes.io/hostname"
POD_SET_LABEL = "kueue.podset"
OWNER_PREFIX = "kueue/"
MAX_MESSAGE = 1024

log = logging.getLogger("gpualloc.kueue")


class TenantMode(StrEnum):
    """Which tenant a Workload's reservations are charged to."""

    BINDING = "binding"  # the tenant the policy binds the controller's identity to
    CLUSTER_QUEUE = "cluster-queue"  # the tenant named as the Workload's ClusterQueue


@dataclass(frozen=True)
class Decision:
    """What one pass did to one Workload (for logs and tests)."""

    workload: str
    action: str  # ready, retry, rejected, committed, renewed, released, unchanged
    state: CheckState | None = None
    message: str = ""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


class AdmissionController:
    def __init__(
        self,
        api: KueueApi,
        placer: Placer,
        *,
        controller_name: str = CONTROLLER_NAME,
        lease_ttl_seconds: float = 300.0,
        clock: Callable[[], str] = _now,
        priority_class: str = "",
        preempt: bool = False,
        tenants: TenantMode = TenantMode.BINDING,
        mirror_namespace: str = "",
    ) -> None:
        """`priority_class`, `preempt`: how workloads' reservations are made (gpualloc's
        priority classes and preemption rules, docs/tenancy.md); `tenants`: which tenant they
        are charged to; `mirror_namespace`: where the mirrors of grants made outside Kueue
        live ("": none; only with `cluster-queue` tenants) (module docstring)."""
        if mirror_namespace and tenants is not TenantMode.CLUSTER_QUEUE:
            raise InvalidArgument("mirrors need the cluster-queue tenant mode")
        self.mirror_namespace = mirror_namespace
        self._grants: dict[str, list[Reservation]] = {}  # ClusterQueue -> non-Kueue grants
        self._mirror_queues: set[str] = set()  # ClusterQueues whose mirror LocalQueue exists
        self.api = api
        self.placer = placer
        self.tenants = tenants
        self._placers: dict[str, Placer] = {"": placer}
        self._denied: dict[str, str] = {}  # tenant -> why the policy refused acting for it
        self._followers: dict[str, PreemptionFollower] = {}  # run(): tenant -> its watch
        self._wake: Callable[[], None] | None = None
        self.controller_name = controller_name
        self.lease_ttl_seconds = lease_ttl_seconds
        self.priority_class = priority_class
        self.preempt = preempt
        self._clock = clock
        self._known: dict[str, Reservation] = {}  # id -> a reservation held on the last pass
        self._passing = threading.Lock()
        self.watching = threading.Event()  # run(): set while preemptions wake it (see there)

    # --- one pass -----------------------------------------------------------------------------

    def reconcile_all(self) -> list[Decision]:
        """One level-triggered pass over every AdmissionCheck and Workload (passes from
        several threads take turns)."""
        with self._passing:
            return self._reconcile_all()

    def _reconcile_all(self) -> list[Decision]:
        checks = self._our_checks()
        raw_queues = self.api.list_cluster_queues()
        queues = {
            q.name
            for q in map(ClusterQueue.from_dict, raw_queues)
            if checks & set(q.admission_checks)
        }
        raw_workloads = self.api.list_workloads()
        workloads = [Workload.from_dict(w) for w in raw_workloads]
        tenants = self._tenants_of(queues)
        held = self._held(tenants)
        self._follow(t for t in tenants if t not in self._denied)
        lost = self._revoked_since_last_pass(held)
        decisions: list[Decision] = []
        mirrors: dict[str, dict[str, Any]] = {}  # name -> a mirror Workload of a live grant
        if self.mirror_namespace:
            mirrors = self._sync_mirrors(raw_queues, raw_workloads, decisions)
        pending: list[_Pending] = []  # placed together after the loop: one batch per tenant
        live = set()
        for raw, workload in zip(raw_workloads, workloads, strict=True):
            owner = kueue_owner(workload.namespace, workload.name)
            live.add(owner)
            check = next((c for c in workload.admission_checks if c.name in checks), None)
            if check is None or (workload.cluster_queue and workload.cluster_queue not in queues):
                continue
            if workload.namespace == self.mirror_namespace and is_mirror(raw):
                if workload.name in mirrors:  # a stale one was deleted: nothing to decide
                    decisions.append(self._mirror_ready(workload, check, mirrors[workload.name]))
                continue
            denied = self._denied.get(self._tenant_of(workload))
            if denied is not None and workload.quota_reserved:
                decisions.append(self._refused(workload, check, denied))
            elif _to_place(workload, check):
                pending.append(_Pending(len(decisions), workload, check))
                decisions.append(Decision(workload.key, "unchanged", check.state))
            else:
                held_now, lost_now = held.get(owner, []), lost.get(owner, "")
                decisions.append(self.reconcile(workload, check, held_now, lost_now))
        for index, decision in self._place_all(pending):
            decisions[index] = decision
        for decision in decisions:
            if decision.action != "unchanged":
                log.info("%s: %s %s", decision.workload, decision.action, decision.message)
        for owner, reservations in sorted(held.items()):
            if owner not in live:
                self._release(owner, reservations)
                decisions.append(
                    Decision(owner.removeprefix(OWNER_PREFIX), "released", None, "deleted")
                )
        return decisions

    def reconcile(
        self,
        workload: Workload,
        check: AdmissionCheckState,
        held: Sequence[Reservation],
        lost: str = "",
    ) -> Decision:
        """One Workload's pass. `held`: its live reservations; `lost`: what became of one it
        held on the last pass and no longer does ("" if none)."""
        owner = kueue_owner(workload.namespace, workload.name)
        gone = workload.finished or workload.evicted or workload.deleting or not workload.active
        if gone or not workload.quota_reserved:
            if held:
                self._release(owner, held)
                return Decision(workload.key, "released", check.state, "no longer needs its GPUs")
            if _stale_retry(workload, check):
                message = "gpualloc: Retry reset, the Workload was evicted for another reason"
                return self._set(workload, check, CheckState.PENDING, message)
            return Decision(workload.key, "unchanged", check.state)
        if check.state in (CheckState.RETRY, CheckState.REJECTED):
            if held:
                self._release(owner, held)
                return Decision(workload.key, "released", check.state)
            return Decision(workload.key, "unchanged", check.state)
        if check.state is CheckState.READY:
            return self._keep(workload, check, held, lost)
        [(_, decision)] = self._place_all([_Pending(0, workload, check)])
        return decision

    # --- Pending: place -----------------------------------------------------------------------

    def _place_all(self, pending: Sequence[_Pending]) -> list[tuple[int, Decision]]:
        """Place the pass's Pending Workloads: every pod set of every Workload of a tenant in
        ONE AllocateBatch (Placer.allocate_many: in order, each seeing the reservations of the
        ones before it, as a scheduling cycle), then each Workload decided from its pod sets'
        answers. A Workload with a pod set that does not fit gives the others back at once
        (so later Workloads of the same batch may have seen them held: the next pass places
        them). Returns (the `_Pending` index, its decision) per Workload."""
        decided: list[tuple[int, Decision]] = []
        by_tenant: dict[str, list[_Pending]] = {}
        for entry in pending:
            by_tenant.setdefault(self._tenant_of(entry.workload), []).append(entry)
        for tenant, group in by_tenant.items():
            placer = self._placer_for(tenant)
            asks: list[_Pending] = []
            for entry in group:
                try:
                    entry.units = self._pod_sets(entry.workload)
                except InvalidArgument as error:
                    message = f"gpualloc: {error}"
                    decided.append(self._decided(entry, CheckState.REJECTED, message))
                    continue
                except NotFound as error:  # a ResourceFlavor Kueue assigned is gone
                    message = f"gpualloc: {error.message}"
                    decided.append(self._decided(entry, CheckState.RETRY, message))
                    continue
                asks.append(entry)
            items = [self._item(entry.workload, unit) for entry in asks for unit in entry.units]
            try:
                results = placer.allocate_many(items) if items else []
            except PermissionDenied as error:  # the policy does not let it act for the tenant
                for entry in asks:
                    decided.append(
                        (entry.index, self._refused(entry.workload, entry.check, error.message))
                    )
                continue
            at = 0
            for entry in asks:
                mine = results[at : at + len(entry.units)]
                at += len(entry.units)
                decided.append((entry.index, self._placed(entry, mine, placer)))
        return decided

    def _item(self, workload: Workload, unit: PodSetClaims) -> AllocateItem:
        return AllocateItem(
            unit.claims,
            node_selector=unit.node_selector,
            reserve=True,
            lease_ttl_seconds=self.lease_ttl_seconds,
            owner=kueue_owner(workload.namespace, workload.name),
            idempotency_key=f"kueue-{workload.uid}-{unit.pod_set}",
            labels={"kueue.workload": workload.key, POD_SET_LABEL: unit.pod_set},
            priority_class=self.priority_class,
            preempt=self.preempt,
            queued_at=workload.created_at,  # Kueue's queue order: the Workload's creation
        )

    def _decided(self, entry: _Pending, state: CheckState, message: str) -> tuple[int, Decision]:
        return entry.index, self._set(entry.workload, entry.check, state, message)

    def _placed(
        self, entry: _Pending, results: Sequence[Placement | GpuallocError], placer: Placer
    ) -> Decision:
        """A Workload decided from its pod sets' answers, in order."""
        workload, check = entry.workload, entry.check
        owner = kueue_owner(workload.namespace, workload.name)
        mine = [
            r for result in results if isinstance(result, Placement) for r in result.reservations
        ]
        self._known.update((r.id, r) for r in mine)
        updates: list[PodSetUpdate] = []
        for unit, result in zip(entry.units, results, strict=True):
            if isinstance(result, PermissionDenied):
                self._release(owner, mine)
                return self._refused(workload, check, result.message)
            if isinstance(result, NotFound):
                self._release(owner, mine)
                return self._set(workload, check, CheckState.RETRY, f"gpualloc: {result.message}")
            if isinstance(result, GpuallocError):  # a lost race, an unreachable store: next pass
                self._release(owner, mine)
                log.warning("%s: pod set %s not placed: %s", workload.key, unit.pod_set, result)
                return Decision(workload.key, "unchanged", check.state, str(result))
            if not result.fits:
                self._release(owner, mine)
                return self._not_now(workload, check, unit, result.reason(), placer)
            updates.append(PodSetUpdate(unit.pod_set, {HOSTNAME_LABEL: result.node_name}))
        return self._ready(workload, check, mine, updates)

    def _ready(
        self,
        workload: Workload,
        check: AdmissionCheckState,
        placed: Sequence[Reservation],
        updates: Sequence[PodSetUpdate],
    ) -> Decision:
        """Every pod set holds its devices: Ready (once bound), with where the pods go."""
        owner = kueue_owner(workload.namespace, workload.name)
        summary = (
            "; ".join(f"{u.name} on {u.node_selector[HOSTNAME_LABEL]}" for u in updates)
            or "no GPUs requested"
        )
        ids = ", ".join(r.id for r in placed)
        message = f"gpualloc reserved {sum(len(r.devices) for r in placed)} devices: {summary}"
        waiting = self._binding(owner, placed)
        if waiting is None:
            message = "gpualloc: a device's binding failed; placing again"
            return self._set(workload, check, CheckState.RETRY, message)
        if waiting:  # Ready only once bound: Kueue then admits, and the pods start
            message += f"; waiting for the binding of {', '.join(waiting)}"
            return self._set(workload, check, CheckState.PENDING, message, tuple(updates))
        return self._set(
            workload,
            check,
            CheckState.READY,
            message + (f" ({ids})" if ids else ""),
            tuple(updates),
        )

    def _pod_sets(self, workload: Workload) -> list[PodSetClaims]:
        """The Workload's pod sets that ask for GPUs (translate.py), each on the nodes of the
        ResourceFlavors Kueue assigned it (their nodeLabels, which Kueue adds to the pods when
        it admits the Workload): gpualloc's flavor search then charges the flavor Kueue chose
        or refuses, and Kueue's requeue moves on to its next flavor. InvalidArgument: a pod
        set that cannot be translated; NotFound: an assigned ResourceFlavor is gone."""
        units = workload_claims(workload, self.api.get_resource_claim_template)
        pinned = []
        for unit in units:
            labels: dict[str, str] = {}
            for name in workload.assigned_flavors.get(unit.pod_set, ()):
                flavor = self.api.get_resource_flavor(name)
                if flavor is None:
                    raise NotFound(f"ResourceFlavor {name}, which Kueue assigned, is gone")
                node_labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
                labels.update({str(k): str(v) for k, v in node_labels.items()})
            selector = with_node_labels(unit.node_selector, labels)
            pinned.append(replace(unit, node_selector=selector))
        return pinned

    def _binding(self, owner: str, placed: Sequence[Reservation]) -> list[str] | None:
        """The ids of the placed reservations still binding (DRA binding conditions), read
        fresh by renewing them; None when one's binding failed (all are released then)."""
        waiting = []
        try:
            for reservation in placed:
                if reservation.binding != "binding":
                    continue
                fresh = self._client_of(reservation).renew(
                    reservation,
                    owner=owner,
                    lease_ttl_seconds=self.lease_ttl_seconds,
                    fencing_token=reservation.fencing_token,
                )
                if fresh.binding == "binding":
                    waiting.append(fresh.id)
        except (NotFound, Preempted):
            self._release(owner, placed)
            return None
        return waiting

    def _not_now(
        self,
        workload: Workload,
        check: AdmissionCheckState,
        unit: PodSetClaims,
        reason: str,
        placer: Placer,
    ) -> Decision:
        """Retry when the pod set could fit an empty cluster, Rejected when it never can."""
        where = f"pod set {unit.pod_set} ({unit.count} pods)"
        if not placer.fits_anywhere(unit.claims, unit.node_selector):
            message = f"gpualloc: {where} can never fit on one node: {reason}"
            return self._set(workload, check, CheckState.REJECTED, message)
        return self._set(workload, check, CheckState.RETRY, f"gpualloc: {where}: {reason}")

    # --- Ready: keep, commit ------------------------------------------------------------------

    def _keep(
        self,
        workload: Workload,
        check: AdmissionCheckState,
        held: Sequence[Reservation],
        lost: str,
    ) -> Decision:
        owner = kueue_owner(workload.namespace, workload.name)
        try:
            if lost:
                raise NotFound(lost)
            missing = _pod_sets_without_reservation(check, held)
            if missing:
                raise NotFound(f"pod set {', '.join(missing)}: its reservation is gone")
            if workload.admitted:
                pending = [r for r in held if r.state is not ReservationState.COMMITTED]
                for reservation in pending:
                    self._client_of(reservation).commit(
                        reservation, owner=owner, fencing_token=reservation.fencing_token
                    )
                if not held:
                    raise NotFound(f"no reservation of {owner}")
                return Decision(workload.key, "committed" if pending else "unchanged", check.state)
            for reservation in held:
                self._client_of(reservation).renew(
                    reservation, owner=owner, lease_ttl_seconds=self.lease_ttl_seconds
                )
            if not held:
                raise NotFound(f"no reservation of {owner}")
            return Decision(workload.key, "renewed", check.state)
        except (NotFound, Preempted) as error:
            # The lease ran out, a preemption revoked it, or the allocator lost it: the devices
            # may be someone else's. Retry makes Kueue evict an admitted Workload and requeue it.
            message = f"gpualloc: the reservation was lost or preempted ({error}); placing again"
            self._release(owner, held)
            return self._set(workload, check, CheckState.RETRY, message)

    # --- writes -------------------------------------------------------------------------------

    def _set(
        self,
        workload: Workload,
        check: AdmissionCheckState,
        state: CheckState,
        message: str,
        updates: tuple[PodSetUpdate, ...] = (),
    ) -> Decision:
        wanted = AdmissionCheckState(check.name, state, _short(message), updates)
        if wanted == check:
            return Decision(workload.key, "unchanged", state, message)
        self.api.set_admission_check_state(
            workload.namespace, workload.name, wanted.to_dict(self._clock())
        )
        return Decision(workload.key, state.value.lower(), state, message)

    def _refused(self, workload: Workload, check: AdmissionCheckState, why: str) -> Decision:
        """The policy does not let the controller act for the Workload's tenant: Retry with
        the policy's reason (Kueue requeues it; a fixed policy then places it), unless the
        check is already Retry or Rejected."""
        if check.state in (CheckState.RETRY, CheckState.REJECTED):
            return Decision(workload.key, "unchanged", check.state)
        tenant = self._tenant_of(workload)
        where = f" acting for tenant {tenant} (the Workload's ClusterQueue)" if tenant else ""
        message = f"gpualloc: refused{where}: {why}"
        return self._set(workload, check, CheckState.RETRY, message)

    def _release(self, owner: str, held: Sequence[Reservation]) -> None:
        for reservation in held:
            self._client_of(reservation).release(reservation, owner=owner, allow_missing=True)
            self._known.pop(reservation.id, None)

    # --- mirrors (mirror.py) -------------------------------------------------------------------

    def _sync_mirrors(
        self,
        raw_queues: Sequence[dict[str, Any]],
        raw_workloads: Sequence[dict[str, Any]],
        decisions: list[Decision],
    ) -> dict[str, dict[str, Any]]:
        """Create the mirror Workload of each grant outside Kueue that has none, delete those
        whose grant is gone (or that name another reservation than the live one of their
        name); returns the live grants' mirrors that exist, by name. A failure
        here is logged and leaves placement alone (the next pass tries again)."""
        namespace = self.mirror_namespace
        existing = {
            str(w["metadata"]["name"]): w
            for w in raw_workloads
            if is_mirror(w) and (w.get("metadata") or {}).get("namespace") == namespace
        }
        live = {mirror_name(r.id): r.id for grants in self._grants.values() for r in grants}
        kept = {
            name: w
            for name, w in existing.items()
            if name in live and _annotations(w).get(MIRROR_ANNOTATION) == live[name]
        }
        try:
            for name in sorted(set(existing) - set(kept)):
                self.api.delete_workload(namespace, name)
                note = "its grant is gone"
                decisions.append(Decision(f"{namespace}/{name}", "unmirrored", None, note))
            missing = {
                queue: [r for r in grants if mirror_name(r.id) not in existing]
                for queue, grants in self._grants.items()
            }
            if any(missing.values()):
                self._create_mirrors(raw_queues, missing, decisions)
        except Exception as error:  # the kubernetes client's errors: placement goes on
            log.warning("mirrors in %s: %s", namespace, error)
        return kept

    def _create_mirrors(
        self,
        raw_queues: Sequence[dict[str, Any]],
        missing: dict[str, list[Reservation]],
        decisions: list[Decision],
    ) -> None:
        namespace = self.mirror_namespace
        flavors_of = {}
        for queue in raw_queues:
            name = str(queue["metadata"]["name"])
            if not missing.get(name):
                continue
            labels_of: dict[str, dict[str, str]] = {}
            for group in (queue.get("spec") or {}).get("resourceGroups") or []:
                for flavor in group.get("flavors") or []:
                    found = self.api.get_resource_flavor(str(flavor.get("name", "")))
                    if found is not None:
                        node_labels = (found.get("spec") or {}).get("nodeLabels") or {}
                        labels_of[str(flavor["name"])] = {
                            str(k): str(v) for k, v in node_labels.items()
                        }
            flavors_of[name] = gpu_flavors(queue, labels_of)
        nodes = {n.name: dict(n.labels) for n in self.placer.inventory.nodes()}
        for name, mirror in wanted_mirrors(missing, flavors_of, nodes).items():
            if mirror.cluster_queue not in self._mirror_queues:
                self.api.apply_namespaced(local_queue(namespace, mirror.cluster_queue))
                self._mirror_queues.add(mirror.cluster_queue)
            self.api.apply_namespaced(mirror.workload(namespace))
            held = f"{mirror.reservation.owner}'s {len(mirror.reservation.devices)} devices"
            note = f"{held} on {mirror.flavor} in ClusterQueue {mirror.cluster_queue}"
            decisions.append(Decision(f"{namespace}/{name}", "mirrored", None, note))

    def _mirror_ready(
        self, workload: Workload, check: AdmissionCheckState, raw: dict[str, Any]
    ) -> Decision:
        """A mirror's check turns Ready as soon as Kueue reserved quota for it: its devices
        are held already (by the grant it mirrors), nothing is placed."""
        gone = workload.finished or workload.evicted or workload.deleting or not workload.active
        if gone or not workload.quota_reserved or check.state is CheckState.READY:
            return Decision(workload.key, "unchanged", check.state)
        annotations = _annotations(raw)
        message = (
            f"gpualloc: mirrors reservation {annotations.get(MIRROR_ANNOTATION, '?')} of "
            f"{annotations.get(OWNER_ANNOTATION, '?')}, granted outside Kueue; nothing placed"
        )
        return self._set(workload, check, CheckState.READY, message)

    # --- tenants ------------------------------------------------------------------------------

    def _tenant_of(self, workload: Workload) -> str:
        """The tenant a Workload is placed for ("": the identity's own)."""
        return workload.cluster_queue if self.tenants is TenantMode.CLUSTER_QUEUE else ""

    def _tenants_of(self, queues: Iterable[str]) -> list[str]:
        """The tenants whose reservations a pass lists: the identity's own (""), and with
        `cluster-queue` every ClusterQueue that uses our checks."""
        if self.tenants is TenantMode.BINDING:
            return [""]
        return ["", *sorted(queues)]

    def _placer_for(self, tenant: str) -> Placer:
        if tenant not in self._placers:
            self._placers[tenant] = self.placer.for_tenant(tenant)
        return self._placers[tenant]

    def _client_of(self, reservation: Reservation) -> AllocatorClient:
        """The client acting for the tenant that holds `reservation`: its owner's prefix
        under a policy (`<tenant>/kueue/...`); the identity's own in `binding` mode."""
        tenant = ""
        if self.tenants is TenantMode.CLUSTER_QUEUE and not reservation.owner.startswith(
            OWNER_PREFIX
        ):
            tenant = reservation.owner.partition("/")[0]
        return self._placer_for(tenant).client

    def _revoked_since_last_pass(self, held: dict[str, list[Reservation]]) -> dict[str, str]:
        """Per owner, what became of a reservation it held on the last pass that is gone
        from the list now: gpualloc is asked (a Renew as its owner), which answers "preempted
        by ..." for a revoked one and, by answering so, tells gpualloc its holder knows. Gone
        for another reason (expired, released by someone else), it is only said to be lost."""
        current = {r.id: r for reservations in held.values() for r in reservations}
        lost: dict[str, str] = {}
        for reservation_id, reservation in sorted(self._known.items()):
            owner = kueue_owner_of(reservation.owner)
            if reservation_id in current or owner is None:
                continue
            try:
                self._client_of(reservation).renew(
                    reservation, owner=reservation.owner, lease_ttl_seconds=self.lease_ttl_seconds
                )
            except Preempted as preempted:
                lost[owner] = f"{_pod_set_of(reservation)}: {preempted}"
                continue
            except (NotFound, FailedPrecondition):
                pass
            lost.setdefault(
                owner, f"{_pod_set_of(reservation)}: reservation {reservation_id} is gone"
            )
        self._known = current
        return lost

    def _held(self, tenants: Sequence[str]) -> dict[str, list[Reservation]]:
        """The live reservations of Workloads in `tenants`, by the controller's owner of each
        (an access policy's server lists them with the tenant's prefix). A tenant the policy
        does not let the controller act for is remembered in `_denied` (its Workloads go to
        Retry); a reservation two tenants' lists show (a development server ignores the
        tenant) counts once."""
        held: dict[str, list[Reservation]] = {}
        seen: set[str] = set()
        self._denied = {}
        self._grants = {}
        for tenant in tenants:
            try:
                listed = self._placer_for(tenant).client.list()
            except PermissionDenied as error:
                if not tenant:
                    raise
                self._denied[tenant] = error.message
                log.warning("tenant %s: %s", tenant, error.message)
                continue
            for reservation in listed:
                owner = kueue_owner_of(reservation.owner)
                if owner is not None and reservation.id not in seen:
                    seen.add(reservation.id)
                    held.setdefault(owner, []).append(reservation)
                elif owner is None and tenant and reservation.owner.startswith(f"{tenant}/"):
                    self._grants.setdefault(tenant, []).append(reservation)  # Slurm's, the API's
        return held

    def _our_checks(self) -> set[str]:
        ours = set()
        for check in map(AdmissionCheck.from_dict, self.api.list_admission_checks()):
            if check.controller_name != self.controller_name:
                continue
            ours.add(check.name)
            if not check.active:
                self.api.set_admission_check_active(check.name, "gpualloc admission is running")
        return ours

    # --- the loop -----------------------------------------------------------------------------

    def run(self, stop: threading.Event, resync_seconds: float = 10.0) -> None:
        """Reconcile on every Workload change, at least every `resync_seconds`, and as soon as
        gpualloc revokes a Workload's reservation (WatchReservations, bridges/preemptions.py:
        the pass runs on the watching thread), until `stop`; errors of one pass are logged and
        the next pass tries again."""
        woken = threading.Event()
        self._wake = woken.set
        on_preemption = threading.Thread(
            target=self._pass_when_woken, args=(woken, stop), name="gpualloc-kueue-preempted"
        )
        with self._passing:
            self._follow([""])
        on_preemption.start()
        try:
            while not stop.is_set():
                self._pass()
                self.api.wait_for_change(resync_seconds)
        finally:
            with self._passing:  # no pass starts a follower meanwhile
                self._wake = None
                self._follow([])
            woken.set()
            on_preemption.join(timeout=30)

    def _follow(self, tenants: Iterable[str]) -> None:
        """While run() runs, the tenants followed become `tenants`: a WatchReservations
        stream each (the identity's own, "", is `watching`'s), waking a pass when one of our
        reservations is revoked; the streams of tenants no longer listed are closed."""
        wanted = set(tenants) if self._wake is not None else set()
        for tenant in [t for t in self._followers if t not in wanted]:
            self._followers.pop(tenant).close()
        wake = self._wake
        if wake is None:
            return
        for tenant in sorted(wanted):
            if tenant in self._followers:
                continue
            self._followers[tenant] = PreemptionFollower(
                self._placer_for(tenant).client,
                lambda o: kueue_owner_of(o) is not None,
                wake,
                watching=self.watching if not tenant else None,
            ).start()

    def watching_tenants(self) -> set[str]:
        """The tenants whose watch is registered with the allocator now ("": the own)."""
        return {t for t, f in dict(self._followers).items() if f.watching.is_set()}

    def _pass_when_woken(self, woken: threading.Event, stop: threading.Event) -> None:
        """A pass each time `woken` is set (a burst of preemptions makes one or two), until
        `stop`: the loop itself waits on Kueue's changes."""
        while True:
            woken.wait()
            if stop.is_set():
                return
            woken.clear()
            self._pass()

    def _pass(self) -> None:
        try:
            self.reconcile_all()
        except GpuallocError as error:
            log.warning("reconcile pass failed: %s", error)


@dataclass
class _Pending:
    """A Workload this pass places: its index among the pass's decisions, and its pod sets."""

    index: int
    workload: Workload
    check: AdmissionCheckState
    units: list[PodSetClaims] = field(default_factory=list)


def _to_place(workload: Workload, check: AdmissionCheckState) -> bool:
    """Whether `reconcile` would place the Workload now (its check Pending, quota reserved)."""
    gone = workload.finished or workload.evicted or workload.deleting or not workload.active
    if gone or not workload.quota_reserved:
        return False
    return check.state not in (CheckState.RETRY, CheckState.REJECTED, CheckState.READY)


def _annotations(raw: dict[str, Any]) -> dict[str, str]:
    return dict((raw.get("metadata") or {}).get("annotations") or {})


def _stale_retry(workload: Workload, check: AdmissionCheckState) -> bool:
    """Our Retry on a Workload that holds no quota and may be queued again: Kueue resets a
    check to Pending when it evicts a Workload for the check, but not when it evicted it for
    another reason first (a Kueue preemption as our Retry was written: reconcileCheckBasedEviction
    skips an evicted Workload), and its scheduler never admits a Workload with a Retry check,
    so the Workload would stay pending for good."""
    queued_again = workload.active and not workload.finished and not workload.deleting
    return check.state is CheckState.RETRY and not workload.quota_reserved and queued_again


def _pod_set_of(reservation: Reservation) -> str:
    return f"pod set {dict(reservation.labels).get(POD_SET_LABEL, '?')}"


def _pod_sets_without_reservation(
    check: AdmissionCheckState, held: Sequence[Reservation]
) -> list[str]:
    """The pod sets the Ready check placed (its podSetUpdates) that hold no reservation now."""
    have = {dict(r.labels).get(POD_SET_LABEL) for r in held}
    return [u.name for u in check.pod_set_updates if u.name not in have]
