"""Flavor assignment for one call: Kueue's flavorassigner, with placement and quota together.

For a grant its tenant's quota charges to a flavored resource (`gpus/hopper`), the flavors of
that resource are tried in the order the tenant lists them. Each attempt pins the query to the
flavor (`pin`: its node labels as a node selector; its device classes, CEL selectors and
tolerations on every request the resource counts; subrequests whose tolerations do not
tolerate its nodeTaints dropped) and asks, on this call's view:

- the solver, on the live state: are devices of the flavor free? then the quota: within
  nominal, borrowing, or short (core/flavors.py `quota_standing`);
- when not: the solver on an empty fleet (no devices of the flavor: NoFit), the quota with
  nothing held (more than it could ever grant: NoFit), then the preemption planner on the
  pinned query (app/preemption_plans.py): victims all other tenants' (Reclaim), some the
  tenant's own (Preempt), or none (NoCandidates).

The core's `choose_flavor` decides with the tenant's flavorFungibility. A request counting
several flavored resources gets their flavors one resource after the other, in the order the
policy declares the resources, each attempt pinned to the flavors chosen before it (Kueue
assigns resource groups in turn, and does not go back either). The attempts are kept, so
Explain can say why each flavor was not taken.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from services.allocator.app.flavor_pins import Pin, pin, pin_of, taint_text
from services.allocator.app.messages import Answer, LeaseOptions, Outcome, Query
from services.allocator.app.preemption_plans import Proposal, Standing, Trials, propose
from services.allocator.core import (
    FlavorAttempt,
    FlavorChoice,
    FlavorMode,
    FlavorReason,
    QuotaStanding,
    admit,
    choose_flavor,
    quota_standing,
)
from services.common.dra.model import (
    DeviceClass,
    DeviceTaint,
)
from services.common.quota.model import QuotaModel, QuotaResource, TenantQuota, Usage
from services.common.security.principal import tenant_of_owner

__all__ = ["Found", "flavored_bases", "search_flavors", "units_within_flavors"]


@dataclass(frozen=True)
class Found:
    """What an attempt found on its flavor: the answer there (ALLOCATED, or why not), the query
    pinned to the flavors, the preemption that would make it fit, and the flavors it is
    assigned (flavored resource -> flavor: the pins), which a grant of it is charged to."""

    answer: Answer
    query: Query
    proposal: Proposal | None = None
    assigned: Mapping[str, str] = field(default_factory=dict)


def flavored_bases(model: QuotaModel, amounts: Usage) -> list[str]:
    """The flavored resources `amounts` count, in the order the policy declares them."""
    bases: list[str] = []
    for resource in model.resources:
        if resource.base and amounts.get(resource.name, 0) > 0 and resource.base not in bases:
            bases.append(resource.base)
    return sorted(bases, key=[r.base or r.name for r in model.resources].index)


def search_flavors(
    trials: Trials,
    query: Query,
    lease: LeaseOptions,
    around: Standing,
    classes: Mapping[str, DeviceClass],
    *,
    first: Answer,
    now: float,
    max_consolidation_nodes: int,
) -> FlavorChoice[Found] | None:
    """Kueue's flavor assignment of `query` for `lease.owner` (`first`: the solver's answer
    unpinned, on the live state); None when the tenant is not limited or the grant counts no
    flavored resource."""
    model = around.model
    tenant = tenant_of_owner(lease.owner)
    quota = model.quota_of(tenant)
    if quota is None or not any(r.base for r in model.resources):
        return None
    placed = first if first.outcome is Outcome.ALLOCATED else trials.on_empty_fleet(query)
    bases = flavored_bases(model, trials.counts(placed)) if placed is not None else []
    if not bases:
        return None
    search = _Search(trials, query, lease, around, quota, classes, now, max_consolidation_nodes)
    if first.outcome is Outcome.ALLOCATED:
        search.reuse = first
    pins: list[Pin] = []
    tried: list[FlavorAttempt[Found]] = []
    chosen: FlavorAttempt[Found] | None = None
    assigned: set[str] = set()
    while bases:
        base = bases[0]
        assigned.add(base)
        order = {r.flavor: r for r in model.flavor_order(tenant, base)}
        choice = choose_flavor(
            order, functools.partial(search.attempt, tuple(pins), base, order), quota.fungibility
        )
        tried.extend(choice.tried)
        chosen = choice.chosen
        if chosen is None or chosen.found is None:
            break
        pins.append(pin_of(model, tenant, order[chosen.flavor]))
        # the next resource: one the placement on the flavors chosen so far counts
        now_placed = chosen.found.answer
        if now_placed.outcome is not Outcome.ALLOCATED:
            now_placed = trials.on_empty_fleet(chosen.found.query) or now_placed
        counted = trials.counts(now_placed) if now_placed.outcome is Outcome.ALLOCATED else {}
        bases = [b for b in flavored_bases(model, counted) if b not in assigned]
    return FlavorChoice(chosen, tuple(tried))


@dataclass(frozen=True)
class _Try:
    """One flavor's attempt in the making: its quota resource, the pins (the flavors chosen
    before and it), the query pinned to them, and what a placement counts of their
    resources, charged to the pinned flavors (Kueue counts a workload on the flavor it
    assigned, not the first that would select its devices)."""

    resource: QuotaResource
    pins: Sequence[Pin]
    pinned: Query
    counts: Callable[[Answer], dict[str, int]]

    @property
    def assigned(self) -> dict[str, str]:
        return {p.resource.base: p.resource.flavor for p in self.pins}

    def found(self, answer: Answer, proposal: Proposal | None = None) -> Found:
        return Found(answer, self.pinned, proposal, self.assigned)


class _Search:
    """One search's attempts: the call's trials, the quota around the caller, its policy."""

    def __init__(
        self,
        trials: Trials,
        query: Query,
        lease: LeaseOptions,
        around: Standing,
        quota: TenantQuota,
        classes: Mapping[str, DeviceClass],
        now: float,
        max_consolidation_nodes: int,
    ) -> None:
        self.trials, self.query, self.lease, self.around = trials, query, lease, around
        self.quota, self.classes, self.now = quota, classes, now
        self.max_consolidation_nodes = max_consolidation_nodes
        self.reuse: Answer | None = None  # the unpinned answer, when it fits

    def attempt(
        self,
        pins: Sequence[Pin],
        base: str,
        flavors: Mapping[str, QuotaResource],
        name: str,
    ) -> FlavorAttempt[Found]:
        """One attempt of flavor `name` of resource `base` (`flavors`: the tenant's, by name),
        pinned to `pins` (the flavors chosen for the resources before) and to it: on the live
        state, else once victims go."""
        model, resource = self.around.model, flavors[name]
        here = [*pins, pin_of(model, self.quota.tenant, resource)]
        pinned = pin(self.query, here, self.quota.tolerations, self.classes)
        made = functools.partial(FlavorAttempt[Found], base, resource.flavor)
        if isinstance(pinned, DeviceTaint):
            why = f"untolerated taint {taint_text(pinned)} in flavor {resource.flavor}"
            return made(FlavorMode.NO_FIT, 0, FlavorReason.UNTOLERATED_TAINT, why)
        assigned = {p.resource.base: p.resource.flavor for p in here}
        tried = _Try(
            resource,
            here,
            pinned,
            _only(self.trials.counts_on(assigned), model, set(assigned)),
        )
        live = self._on_live_state(tried, reuse=not pins and self._reused_on(resource))
        return live if isinstance(live, FlavorAttempt) else self._once_victims_go(tried, *live)

    def _on_live_state(
        self, tried: _Try, *, reuse: bool
    ) -> FlavorAttempt[Found] | tuple[Answer, FlavorReason, str]:
        """The attempt when the flavor fits now (or is charged elsewhere); else the answer
        there and why it does not fit."""
        model, tenant, flavor = self.around.model, self.quota.tenant, tried.resource.flavor
        answer = self._solve(tried.pinned, reuse)
        if answer.outcome is not Outcome.ALLOCATED:
            why = f"no free devices of flavor {flavor} fit the request"
            return answer, FlavorReason.DEVICES_IN_USE, why
        amounts = tried.counts(answer)
        made = functools.partial(FlavorAttempt[Found], tried.resource.base, flavor)
        elsewhere = _charged_elsewhere(model, amounts, tried.pins)
        if elsewhere:
            why = (
                f"the devices found are charged to flavor {elsewhere} (the first in the "
                "tenant's order that selects them)"
            )
            return made(FlavorMode.NO_FIT, 0, FlavorReason.CHARGED_ELSEWHERE, why)
        standing = quota_standing(model, tenant, amounts, self.around.usage)
        if standing >= QuotaStanding.BORROWING:
            borrows = int(standing is QuotaStanding.BORROWING)
            return made(FlavorMode.FIT, borrows, found=tried.found(answer))
        refusals = admit(model, tenant, amounts, self.around.usage)
        refused = replace(answer, outcome=Outcome.QUOTA_EXCEEDED, quota=refusals)
        return refused, FlavorReason.QUOTA, "; ".join(map(str, refusals))

    def _once_victims_go(
        self, tried: _Try, answer: Answer, reason: FlavorReason, message: str
    ) -> FlavorAttempt[Found]:
        """NoFit (no devices of the flavor even all free, or more than the quota could ever
        grant), else the preemption planner on the pinned query: Reclaim, Preempt or
        NoCandidates."""
        model, tenant, flavor = self.around.model, self.quota.tenant, tried.resource.flavor
        made = functools.partial(FlavorAttempt[Found], tried.resource.base, flavor)
        empty = self.trials.on_empty_fleet(tried.pinned)
        if empty is None:
            why = f"no devices of flavor {flavor} fit the request, even with all of them free"
            return made(FlavorMode.NO_FIT, 0, FlavorReason.NO_DEVICES, why, tried.found(answer))
        wanted = tried.counts(empty)
        if quota_standing(model, tenant, wanted, self.around.usage) is QuotaStanding.ABOVE_MAX:
            refusals = admit(model, tenant, wanted, {})
            why = "; ".join(map(str, refusals)) or "more than the quota can ever grant"
            return made(FlavorMode.NO_FIT, 0, FlavorReason.ABOVE_MAX, why, tried.found(answer))
        proposal = propose(
            replace(self.trials, counts=tried.counts),
            tried.pinned,
            self.lease,
            self.around,
            now=self.now,
            max_consolidation_nodes=self.max_consolidation_nodes,
            empty=empty,
        )
        found = tried.found(answer, proposal)
        if proposal is None:
            return made(FlavorMode.NO_CANDIDATES, 0, reason, message, found)
        left = _without(self.around, proposal)
        borrows = int(quota_standing(model, tenant, wanted, left) < QuotaStanding.WITHIN_NOMINAL)
        mode = FlavorMode.RECLAIM if proposal.reclaims_only else FlavorMode.PREEMPT
        return made(mode, borrows, reason, message, found)

    def _reused_on(self, resource: QuotaResource) -> bool:
        """Whether the unpinned answer is all on `resource`'s flavor (no solve needed)."""
        if self.reuse is None:
            return False
        amounts = self.trials.counts(self.reuse)
        others = [r.name for r in self.around.model.resources if r.base == resource.base]
        return amounts.get(resource.name, 0) > 0 and not any(
            amounts.get(name, 0) for name in others if name != resource.name
        )

    def _solve(self, pinned: Query, reuse: bool) -> Answer:
        if reuse and self.reuse is not None:
            return self.reuse
        return self.trials.solve(pinned, self.trials.state)


def _only(
    counts: Callable[[Answer], dict[str, int]], model: QuotaModel, bases: set[str]
) -> Callable[[Answer], dict[str, int]]:
    """`counts` limited to the unflavored resources and the flavored ones of `bases` (those
    whose flavors are chosen so far: Kueue rules a resource group on its own resources)."""

    def counted(answer: Answer) -> dict[str, int]:
        base = {r.name: r.base for r in model.resources}
        return {
            name: amount
            for name, amount in counts(answer).items()
            if not base.get(name) or base[name] in bases
        }

    return counted


def _charged_elsewhere(model: QuotaModel, amounts: Usage, pins: Sequence[Pin]) -> str:
    """The flavor a pinned placement is charged to instead of its pin's ("": none), when an
    earlier flavor of the resource selects the same devices."""
    for p in pins:
        for resource in model.resources:
            same = resource.base == p.resource.base and resource.name != p.resource.name
            if same and amounts.get(resource.name, 0) > 0:
                return resource.flavor
    return ""


def _without(around: Standing, proposal: Proposal) -> dict[str, dict[str, int]]:
    """The cohort's usage once the proposal's victims are revoked (a move keeps its usage)."""
    left = {tenant: dict(usage) for tenant, usage in around.usage.items()}
    moved = {m.reservation.id for m in proposal.moves}
    for reservation in proposal.reservations:
        if reservation.id in moved:
            continue
        mine = left.setdefault(tenant_of_owner(reservation.owner), {})
        for name, amount in around.amounts.get(reservation.id, {}).items():
            mine[name] = mine.get(name, 0) - amount
    return left


def units_within_flavors(
    trials: Trials,
    query: Query,
    tenant: TenantQuota,
    model: QuotaModel,
    classes: Mapping[str, DeviceClass],
    left: Mapping[str, int],
    count: Callable[[Query], int],
) -> int | None:
    """How many units a flavored tenant's quota headroom allows (Capacity's
    totalWithinQuota): per flavor of the resource a unit counts, the units that fit pinned
    to it (`count`), at most what that flavor's `left` allows of what one counts there,
    summed over the tenant's flavors (their devices are disjoint: each is charged to one).
    None when a unit counts no flavored resource, or several (then the first placement's
    bound applies)."""
    placed = trials.on_empty_fleet(query)
    bases = flavored_bases(model, trials.counts(placed)) if placed is not None else []
    if len(bases) != 1:
        return None
    within = 0
    for resource in model.flavor_order(tenant.tenant, bases[0]):
        pinned = pin(query, [pin_of(model, tenant.tenant, resource)], tenant.tolerations, classes)
        if isinstance(pinned, DeviceTaint):
            continue
        units = count(pinned)
        one = trials.on_empty_fleet(pinned) if units else None
        if one is None:
            continue
        unit = trials.counts_on({resource.base: resource.flavor})(one)
        bounds = [left.get(name, 0) // amount for name, amount in unit.items() if amount > 0]
        within += min([units, *bounds])
    return within
