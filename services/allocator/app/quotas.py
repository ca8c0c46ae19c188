"""Quotas on the grant path: what a placement counts, and the two-step grant that enforces it.

The quota model and its rule are pure (the model, services/common/quota/model.py, is what the
access policy file declares, so it reloads with it; the rule, `admit` and the status rows, is
the core's, services/allocator/core/quota/rule.py). This module applies them to reservations:

- `usage` counts what one store request (one node's part of a placement) holds, per quota
  resource: each device of a mapped DeviceClass counts 1 (1000 milli-units), or, for a counter
  resource, the amount of that counter the device consumes (charged once per device); a
  flavored resource on the flavor the grant's flavor search assigned (`Assigned`), else on the
  first of its tenant's flavors that selects the device. The ledger entry keeps the amounts,
  so whatever reads the ledger (QuotaStatus, cohorts, preemption) counts them as charged.
- step one of a grant (app/quota_grants.py, `QuotaTally`: one grant, or a batch's at once):
  the tenant's amounts are checked against the ledger of its cohort tree and added to it as a
  *ticket* in one compare-and-set (reservations/quota_ledger.py), with the lease plus a grace
  period as expiry. Then the store takes the devices (step two: another hash slot on Redis
  Cluster, so no script can do both). On success `bind` turns the ticket into one entry per
  reservation; on failure `abandon` drops it.

Why no tenant ever goes over quota, across replicas and crashes: every live reservation is
covered by a live ledger entry (the ticket exists before the grant and outlives the lease it
covers by the grace period; commit and renew change the ledger before the store, release after
it), and every entry was added by a compare-and-set against the usage the rule was checked on.
What can go wrong only over-counts, never under-counts: a replica that dies between the steps
leaves a ticket that expires (lease + grace); a release whose ledger step fails leaves an entry
that the reconciler drops once the store no longer knows the reservation (`reconcile`). A
policy that shrinks a quota below what is held refuses new grants until usage falls under it;
nothing held is taken away (preemption is not built yet).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from services.allocator.core import (
    ClusterSnapshot,
    CohortStatus,
    ConsumedUsage,
    DeviceEntry,
    QuotaRefusal,
    SelectorCache,
    TenantStatus,
    admit,
    cohort_status,
    counted_only,
    resample,
    sample_due,
    tenant_status,
)
from services.allocator.reservations.hold_kinds import HoldKind
from services.allocator.reservations.holds import scope_of
from services.allocator.reservations.model import Reservation, ReservationState, ReservationStore
from services.allocator.reservations.quota_ledger import (
    QuotaEntry,
    QuotaLedger,
    Ticket,
    usage_by_tenant,
)
from services.cel import CelError
from services.common.dra.model import AllocationResult, DeviceClass
from services.common.errors import (
    GpuallocError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from services.common.quota.model import (
    NO_FLAVOR,
    UNCOUNTED,
    QuotaModel,
    QuotaResource,
    ResourceFlavor,
    Usage,
)
from services.common.quota.tree import cohort_node
from services.common.security.principal import tenant_of_owner
from services.common.telemetry import Labelled, Telemetry

__all__ = [
    "Assigned",
    "Grant",
    "QuotaExceeded",
    "QuotaGuard",
    "QuotaSettings",
    "assigned_by",
    "check_flavor_selectors",
]

log = logging.getLogger("gpualloc.quota")

Assigned = Mapping[str, str]
"""The flavors a grant's flavor search assigned: flavored resource (`gpus`) -> flavor
(`hopper`). A device of such a resource is charged to its assigned flavor (Kueue counts a
workload on the flavor it was admitted on), not to the first that selects it."""


class QuotaExceeded(ResourceExhausted):
    """A grant refused by the tenant's quota: RESOURCE_EXHAUSTED for Reserve, a normal
    QUOTA_EXCEEDED answer for Allocate."""

    def __init__(self, refusals: Sequence[QuotaRefusal]) -> None:
        super().__init__("quota exceeded: " + "; ".join(str(r) for r in refusals))
        self.refusals = tuple(refusals)


@dataclass(frozen=True)
class QuotaSettings:
    grace_seconds: float = 10.0  # how much longer a ledger entry lives than the lease it covers
    take_attempts: int = 32  # compare-and-set rounds before the ledger counts as busy
    reconcile_interval: float = 30.0


@dataclass(frozen=True)
class Grant:
    """Step one done: `ticket` holds `amounts` (one per store request) in `cohort`."""

    ticket: str
    cohort: str
    tenant: str
    amounts: tuple[Usage, ...]
    lease_seconds: float


class QuotaGuard:
    def __init__(
        self,
        model: Callable[[], QuotaModel],
        ledger: QuotaLedger,
        classes: Callable[[], dict[str, DeviceClass]],
        selectors: SelectorCache,
        settings: QuotaSettings = QuotaSettings(),
    ) -> None:
        self._model = model
        self.ledger = ledger
        self._classes = classes
        self._selectors = selectors
        self.settings = settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._settle_lock = threading.Lock()
        self._settled: QuotaModel | None = None
        self._ledger_of: dict[str, str] | None = None  # tenant -> its ledger, as last settled

    @property
    def model(self) -> QuotaModel:
        model = self._model()
        if model is not self._settled:
            self._settle(model)
        return model

    def _settle(self, model: QuotaModel) -> None:
        """A reload that moves tenants to another tree moves their ledger entries with them,
        before this replica rules on the new tree (else the new ledger would not count what
        they hold); entries of tenants no longer limited are dropped. The reconciler catches
        what this misses (another replica's grants meanwhile, a failure here)."""
        with self._settle_lock:
            if model is self._settled:
                return
            now = {t: model.ledger_key(q) for t, q in model.tenants.items()}
            before, self._ledger_of, self._settled = self._ledger_of, now, model
        if before is None:
            return
        leaving: dict[str, set[str]] = {}
        for tenant, old in before.items():
            if now.get(tenant) != old:
                leaving.setdefault(old, set()).add(tenant)
        for old, tenants in sorted(leaving.items()):
            try:
                self._move(old, tenants, now)
            except GpuallocError as error:
                log.warning("quota entries of %s left in %s: %s", sorted(tenants), old, error)

    def _move(self, old: str, tenants: set[str], ledger_of: Mapping[str, str]) -> None:
        gone = []
        for entry in self.ledger.read(old).entries:
            if entry.tenant not in tenants:
                continue
            new = ledger_of.get(entry.tenant)
            if new is not None:
                lease = self.settings.grace_seconds
                if entry.expires_at is not None:
                    lease = max(0.001, entry.expires_at - time.time())
                moved = QuotaEntry(entry.id, entry.tenant, dict(entry.amounts), None)
                self._take_entry(new, moved, lease, lambda entries: ())
                if entry.expires_at is None:
                    self.ledger.commit(new, entry.id)
            gone.append(entry.id)
        if gone:
            self.ledger.drop(old, gone)
        log.info("quota entries moved from %s: %d of %s", old, len(gone), sorted(tenants))

    # --- what a placement counts ------------------------------------------------------------

    def usage(
        self,
        snapshot: ClusterSnapshot,
        scope: str,
        allocations: Sequence[AllocationResult],
        owner: str,
        assigned: Assigned | None = None,
    ) -> dict[str, int]:
        """Per quota resource, what the part of `allocations` taken under `scope` (a store
        request's or a reservation's node: reservations/holds.py) holds for `owner`. A flavored
        resource counts a device on the flavor `assigned` names for it (the flavor the grant's
        flavor search was pinned to) when that flavor selects the device, else on the first
        flavor in the owner's tenant's order that selects it (`flavor_of`: where no assignment
        is known). With `refuse_uncounted`, the devices no resource counts as UNCOUNTED (which
        the rule refuses a tenant with quotas and no ledger entry keeps)."""
        model = self.model
        amounts: dict[str, int] = {}
        if not model.enabled:
            return amounts
        tenant = tenant_of_owner(owner)
        specs = {
            base: r
            for base, flavor in (assigned or {}).items()
            for r in model.flavors_of(base)
            if r.flavor == flavor
        }
        charged: set[tuple[str, object]] = set()
        for allocation in allocations:
            for result in allocation.results:
                if result.admin_access:
                    continue
                entry = snapshot.device(result.device_id)
                if entry is None or scope_of(entry) != scope:
                    continue
                flavors: dict[str, str] = {}
                counted = False
                for resource in model.resources:
                    key = (resource.name, entry.id)
                    by_amount = resource.counter or resource.gpu_share
                    if by_amount and key in charged:
                        counted = True
                        continue  # counted once
                    if resource.base:
                        if resource.base not in flavors:
                            flavors[resource.base] = self._charged_to(
                                model, tenant, resource.base, specs, snapshot, entry
                            )
                        if flavors[resource.base] != resource.flavor:
                            continue  # of another flavor
                    if not self._counts(resource, entry):
                        continue
                    charged.add(key)
                    counted = True
                    amounts[resource.name] = amounts.get(resource.name, 0) + _amount(
                        resource, entry
                    )
                if not counted and model.refuse_uncounted and (UNCOUNTED, entry.id) not in charged:
                    charged.add((UNCOUNTED, entry.id))  # one device: 1, however many results
                    amounts[UNCOUNTED] = amounts.get(UNCOUNTED, 0) + 1000
        return amounts

    def _charged_to(
        self,
        model: QuotaModel,
        tenant: str,
        base: str,
        specs: Mapping[str, QuotaResource],
        snapshot: ClusterSnapshot,
        entry: DeviceEntry,
    ) -> str:
        """The flavor of resource `base` a device is charged to: its assigned flavor (`specs`)
        when that selects it, else `flavor_of`."""
        found = specs.get(base)
        labels = _node_labels(snapshot, entry) if found is not None else {}
        if found is not None and found.spec is not None and self.selects(found.spec, entry, labels):
            return found.flavor
        return self.flavor_of(model, tenant, base, snapshot, entry)

    def flavor_of(
        self,
        model: QuotaModel,
        tenant: str,
        base: str,
        snapshot: ClusterSnapshot,
        entry: DeviceEntry,
    ) -> str:
        """The flavor of resource `base` a device `tenant` holds is charged to: the first in
        the tenant's charge order (its own flavors first, `QuotaModel.charge_order`) that
        selects it (its node's labels, its device classes, its CEL selectors), else (none)."""
        labels = _node_labels(snapshot, entry)
        for resource in model.charge_order(tenant, base):
            if resource.spec is not None and self.selects(resource.spec, entry, labels):
                return resource.flavor
        return NO_FLAVOR

    def selects(
        self, flavor: ResourceFlavor, entry: DeviceEntry, labels: Mapping[str, str]
    ) -> bool:
        """Whether `entry` (on a node with `labels`) is a device of `flavor`."""
        if not all(labels.get(key) == value for key, value in flavor.node_labels):
            return False
        if flavor.device_classes:
            classes = self._classes()
            if not any(
                (found := classes.get(name)) is not None and self._matches(found, entry)
                for name in flavor.device_classes
            ):
                return False
        try:
            return all(
                self._selectors.compile(expression).matches(entry.cel)
                for expression in flavor.selectors
            )
        except CelError:  # checked when the policy loaded; an error at run time selects nothing
            return False

    def _counts(self, resource: QuotaResource, entry: DeviceEntry) -> bool:
        classes = self._classes()
        for name in resource.device_classes:
            device_class = classes.get(name)
            if device_class is not None and self._matches(device_class, entry):
                break
        else:
            return False
        try:  # and the resource's own selectors (compiled when the policy was loaded)
            return all(
                self._selectors.compile(expression).matches(entry.cel)
                for expression in resource.selectors
            )
        except CelError:
            return False

    def _matches(self, device_class: DeviceClass, entry: DeviceEntry) -> bool:
        try:
            return all(
                self._selectors.compile(selector.cel).matches(entry.cel)
                for selector in device_class.selectors
            )
        except CelError:  # the class cannot select it, so it does not count
            return False

    # --- step one of a grant, and what follows ---------------------------------------------

    def check(self, owner: str, amounts: Usage) -> tuple[QuotaRefusal, ...]:
        """Read-only: the refusals `take` would answer now (Explain)."""
        model = self.model
        quota = model.quota_of(tenant_of_owner(owner))
        if quota is None:
            return ()
        read = self.ledger.read(model.ledger_key(quota))
        return admit(model, quota.tenant, amounts, usage_by_tenant(read.entries))

    def usage_around(self, owner: str) -> dict[str, dict[str, int]]:
        """tenant -> usage, for the cohort of `owner`'s tenant ({} when it is not limited)."""
        return usage_by_tenant(self.entries_around(owner))

    def entries_around(self, owner: str) -> tuple[QuotaEntry, ...]:
        """The live entries of the ledger of `owner`'s tenant's tree, each with the amounts
        its grant was charged (() when the tenant is not limited)."""
        model = self.model
        quota = model.quota_of(tenant_of_owner(owner))
        if quota is None:
            return ()
        return self.ledger.read(model.ledger_key(quota)).entries

    def recorded(self, reservation: Reservation) -> Usage | None:
        """The amounts the ledger holds for `reservation` (what its grant was charged), or
        None when no entry covers it."""
        for entry in self.entries_around(reservation.owner):
            if entry.id == reservation.id:
                return entry.amounts
        return None

    def _take_entry(
        self,
        cohort: str,
        entry: QuotaEntry,
        lease_seconds: float,
        refuse: Callable[[Sequence[QuotaEntry]], tuple[QuotaRefusal, ...]],
    ) -> tuple[QuotaRefusal, ...]:
        """Add `entry` by compare-and-set: read, ask `refuse`, take if nothing was taken in
        between, else read again (with a short random pause). () once added, or the refusals;
        Unavailable when the ledger stays contended."""
        for attempt in range(self.settings.take_attempts):
            read = self.ledger.read(cohort)
            refusals = refuse(read.entries)
            if refusals:
                return refusals
            if self.ledger.take(cohort, read.version, [Ticket(entry, lease_seconds)]):
                return ()
            time.sleep(random.uniform(0, 0.0005 * 2 ** min(attempt, 6)))
        raise Unavailable(
            f"quota ledger of {cohort} is contended: {self.settings.take_attempts} attempts "
            "lost to other grants; retry"
        )

    def committing(self, reservation: Reservation) -> None:
        """Before the store commits: the reservation's entry stops expiring."""
        cohort = self._cohort_of(reservation.owner)
        if cohort is not None:
            self.ledger.commit(cohort, reservation.id)

    def renewing(self, reservation_id: str, owner: str, lease_seconds: float) -> None:
        """Before the store renews: the entry outlives the new lease."""
        cohort = self._cohort_of(owner)
        if cohort is not None:
            self.ledger.extend(cohort, reservation_id, lease_seconds + self.settings.grace_seconds)

    def released(self, reservation_ids: Iterable[str], owner: str) -> None:
        """After the store released: drop the entries (a failure leaves them to reconcile)."""
        cohort = self._cohort_of(owner)
        if cohort is None:
            return
        try:
            self.ledger.drop(cohort, list(reservation_ids))
        except GpuallocError as error:
            log.warning("quota entries of %s left to the reconciler: %s", owner, error)

    def _cohort_of(self, owner: str) -> str | None:
        model = self.model
        quota = model.quota_of(tenant_of_owner(owner))
        return model.ledger_key(quota) if quota is not None else None

    # --- visibility and repair --------------------------------------------------------------

    def status(self, tenants: Iterable[str] = ()) -> list[TenantStatus]:
        model = self.model
        wanted = list(tenants) or list(model.tenants)
        usage: dict[str, dict[str, int]] = {}
        consumed: dict[str, ConsumedUsage] | None = None
        if model.admission_fair_sharing is not None:
            consumed = {}
        for cohort in sorted({model.ledger_key(q) for t in wanted if (q := model.quota_of(t))}):
            usage.update(usage_by_tenant(self.ledger.read(cohort).entries))
            if consumed is not None:
                consumed.update(self.ledger.read_consumed(cohort).tenants)
        return tenant_status(model, usage, wanted, consumed=consumed)

    def cohort_status(self, tenants: Iterable[str] = ()) -> list[CohortStatus]:
        """The cohorts on the given tenants' paths (every cohort when none are given), from
        one read of each ledger (tree) they are in."""
        model = self.model
        wanted = list(tenants)
        if wanted:
            names = sorted({name for t in wanted for name in model.path(t)})
        else:
            names = list(model.cohort_names())
        usage: dict[str, dict[str, int]] = {}
        for ledger in sorted({model.ledger_of(cohort_node(name)) for name in names}):
            usage.update(usage_by_tenant(self.ledger.read(ledger).entries))
        return cohort_status(model, usage, names) if names else []

    def register(self, telemetry: Telemetry) -> None:
        """`gpualloc.quota` (tenant, resource, cohort, kind: nominal, used, borrowed, lent,
        left; in the resource's units: devices, or the counter's, bytes for memory), read from
        the ledger at each collection: one read per cohort the policy names."""

        def read() -> Labelled:
            try:
                rows = self.status() if self.model.enabled else []
            except GpuallocError as error:  # an unreachable ledger: no series, not a failure
                log.warning("quota gauges: %s", error)
                return []
            series = []
            for row in rows:
                labels = {"tenant": row.tenant, "resource": row.resource, "cohort": row.cohort}
                for kind in ("nominal", "used", "borrowed", "lent", "left"):
                    value = getattr(row, kind) / 1000
                    series.append((value, {**labels, "kind": kind}))
            return series

        telemetry.observe_labelled("gpualloc.quota", read, description="tenant quotas")

    def reconcile(
        self,
        store: ReservationStore,
        live: Callable[[], Sequence[Reservation]],
        usage_of: Callable[[Reservation], Usage],
    ) -> tuple[int, int]:
        """Make the ledger match the reservations; returns (entries dropped, entries added).

        Dropped: entries of reservations the store no longer has (a release whose ledger step
        failed). Added: live reservations of limited tenants that no entry covers (granted
        before quotas were on, or before the tenant had quotas), with their lease plus the
        grace period; they count from now on, even over quota (nothing held is taken away).
        `live()`: this process's copy of the live reservations; tickets are left to expire,
        since their grant may still be under way."""
        model = self.model
        reservations = {r.id: r for r in live()}
        dropped = added = 0
        misplaced: dict[str, list[str]] = {}
        for cohort in model.ledgers():
            read = self.ledger.read(cohort)
            covered = {entry.id for entry in read.entries}
            gone = []
            for entry in read.entries:
                if HoldKind.of(entry.id) is HoldKind.TICKET:
                    continue
                quota = model.quota_of(entry.tenant)
                if quota is None or model.ledger_key(quota) != cohort:
                    misplaced.setdefault(cohort, []).append(entry.id)  # its tenant moved
                    continue
                if entry.id in reservations:
                    continue
                try:
                    store.get(entry.id)
                except NotFound:
                    gone.append(entry.id)
            if gone:
                self.ledger.drop(cohort, gone)
                dropped += len(gone)
            for reservation in reservations.values():
                quota = model.quota_of(tenant_of_owner(reservation.owner))
                if quota is None or model.ledger_key(quota) != cohort or reservation.id in covered:
                    continue
                if self._backfill(cohort, quota.tenant, reservation, usage_of(reservation)):
                    added += 1
        for cohort, ids in misplaced.items():  # backfilled in their tenants' ledgers above
            self.ledger.drop(cohort, ids)
            dropped += len(ids)
        return dropped, added

    def _backfill(self, cohort: str, tenant: str, reservation: Reservation, amounts: Usage) -> bool:
        if not any(amount > 0 for amount in amounts.values()):
            return False
        lease = self.settings.grace_seconds
        if reservation.expires_at is not None:
            lease += max(0.0, reservation.expires_at - time.time())
        entry = QuotaEntry(reservation.id, tenant, counted_only(amounts), None)
        try:  # already held: counted whatever the quota says
            self._take_entry(cohort, entry, lease, lambda entries: ())
        except Unavailable:
            return False
        if reservation.state is ReservationState.COMMITTED:
            self.ledger.commit(cohort, reservation.id)
        return True

    def start(
        self,
        store: ReservationStore,
        live: Callable[[], Sequence[Reservation]],
        usage_of: Callable[[Reservation], Usage],
    ) -> None:
        """Reconcile now and then every reconcile_interval, in a thread, until `close`."""

        def run() -> None:
            due = 0.0  # the next reconcile, by this process's monotonic clock
            while True:
                if time.monotonic() >= due:
                    due = time.monotonic() + self.settings.reconcile_interval
                    try:
                        dropped, added = self.reconcile(store, live, usage_of)
                    except GpuallocError as error:
                        log.warning("quota reconcile failed: %s", error)
                    else:
                        if dropped or added:
                            log.info(
                                "quota reconcile: %d stale entries dropped, %d reservations added",
                                dropped,
                                added,
                            )
                try:
                    self.sample_usage()
                except GpuallocError as error:
                    log.warning("quota usage sample failed: %s", error)
                if self._stop.wait(self._next_wait()):
                    return

        self._thread = threading.Thread(target=run, name="gpualloc-quota-reconcile", daemon=True)
        self._thread.start()

    def _next_wait(self) -> float:
        """Until the next look: the reconcile interval, or half the usage sampling interval
        when usage decays (a sample is due by the ledger's clock, whoever takes it)."""
        decay = self.model.admission_fair_sharing
        if decay is None:
            return self.settings.reconcile_interval
        return max(0.05, min(self.settings.reconcile_interval, decay.sampling_seconds / 2))

    def sample_usage(self) -> int:
        """Admission fair sharing: in each tree whose last sample is older than the sampling
        interval (by the ledger's clock), every tenant's decayed usage sampled with what it
        holds now, written by compare-and-set so that replicas sampling at once write one
        sample. Returns how many trees were sampled."""
        model = self.model
        decay = model.admission_fair_sharing
        if decay is None:
            return 0
        sampled = 0
        for ledger in model.ledgers():
            consumed = self.ledger.read_consumed(ledger)
            last = max((c.at for c in consumed.tenants.values()), default=None)
            if not sample_due(last, consumed.now, decay.sampling_seconds):
                continue
            held = usage_by_tenant(self.ledger.read(ledger).entries)
            tenants = [t for t, q in model.tenants.items() if model.ledger_key(q) == ledger]
            fresh = resample(consumed.tenants, held, tenants, consumed.now, decay.half_life_seconds)
            if self.ledger.put_consumed(ledger, consumed.version, fresh):
                sampled += 1
        return sampled

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.ledger.close()


def check_flavor_selectors(model: QuotaModel, selectors: SelectorCache) -> QuotaModel:
    """`model`, once every resource flavor's and quota resource's CEL selector compiles
    (InvalidArgument naming the flavor or resource and the selector otherwise: the policy is
    then not loaded, the last good quotas stay)."""
    seen: set[str] = set()
    for resource in model.resources:
        flavor = resource.spec
        if flavor is None or flavor.name in seen:
            continue
        seen.add(flavor.name)
        for i, expression in enumerate(flavor.selectors):
            try:
                selectors.compile(expression)
            except CelError as error:
                raise InvalidArgument.at(
                    f"spec.quota.resourceFlavors[{flavor.name}].selectors[{i}].cel.expression",
                    str(error),
                ) from None
    for resource in model.resources:  # a resource's own selectors (one MIG profile's)
        for i, expression in enumerate(resource.selectors):
            try:
                selectors.compile(expression)
            except CelError as error:
                raise InvalidArgument.at(
                    f"spec.quota.resources[{resource.base or resource.name}].selectors[{i}]"
                    ".cel.expression",
                    str(error),
                ) from None
    return model


def assigned_by(model: QuotaModel, amounts: Usage) -> dict[str, str]:
    """The flavors a grant charged `amounts` was assigned (flavored resource -> flavor), to
    charge its replacement alike: of each flavored resource it holds on one flavor only, that
    flavor (one held on several, as firstAvailable alternatives of device-level flavors can
    be, is left to the selection rule)."""
    flavors = {r.name: r for r in model.resources if r.base and r.spec is not None}
    held: dict[str, set[str]] = {}
    for name, amount in amounts.items():
        if amount > 0 and name in flavors:
            held.setdefault(flavors[name].base, set()).add(flavors[name].flavor)
    return {base: next(iter(names)) for base, names in held.items() if len(names) == 1}


def _node_labels(snapshot: ClusterSnapshot, entry: DeviceEntry) -> Mapping[str, str]:
    """The labels of the node a device is on ({} for one reachable from several nodes)."""
    name = entry.access.node_name
    if not name or name not in snapshot.node_names:
        return {}
    node = snapshot.view(name).node
    return node.labels if node is not None else {}


MEMORY_SLICE = "memory-slice-"  # the DRA driver's per-slice MIG counters (memory-slice-<i>)


def _amount(resource: QuotaResource, entry: DeviceEntry) -> int:
    if resource.gpu_share:
        return _gpu_share(entry)
    if not resource.counter:
        return 1000
    return sum(
        math.ceil(amount * 1000)
        for counter, amount in entry.counters
        if counter.counter == resource.counter
    )


def _gpu_share(entry: DeviceEntry) -> int:
    """The GPU share a device takes, in milli-GPUs: the memory slices it consumes over those
    of its counter set (its GPU); a device that consumes none is a whole device (1000)."""
    taken: dict[str, int] = {}
    for counter, amount in entry.counters:
        if counter.counter.startswith(MEMORY_SLICE):
            taken[counter.counter_set] = taken.get(counter.counter_set, 0) + int(amount)
    if not taken:
        return 1000
    totals = {name: 0 for name in taken}
    for counter in entry.slice.counter_totals:
        if counter.counter_set in totals and counter.counter.startswith(MEMORY_SLICE):
            totals[counter.counter_set] += 1
    return sum(math.ceil(1000 * taken[name] / max(1, totals[name])) for name in taken)
