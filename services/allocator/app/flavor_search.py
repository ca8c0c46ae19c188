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
from dataclasses import dataclass, replace

from services.allocator.app.messages import Answer, LeaseOptions, Outcome, Query
from services.allocator.app.preemption_plans import Proposal, Standing, Trials, propose
from services.allocator.core import (
    FlavorAttempt,
    FlavorChoice,
    FlavorMode,
    FlavorReason,
    PreemptionReason,
    QuotaStanding,
    choose_flavor,
    quota_standing,
    tolerates,
)
from services.common.dra.model import (
    DeviceClass,
    DeviceRequest,
    DeviceSelector,
    DeviceSubRequest,
    DeviceTaint,
    DeviceToleration,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
)
from services.common.security.principal import tenant_of_owner
from services.common.security.quota import (
    QuotaModel,
    QuotaResource,
    ResourceFlavor,
    TenantQuota,
    Usage,
)

__all__ = ["Found", "flavored_bases", "pin", "search_flavors"]


@dataclass(frozen=True)
class Found:
    """What an attempt found on its flavor: the answer there (ALLOCATED, or why not), the query
    pinned to the flavors, and the preemption that would make it fit."""

    answer: Answer
    query: Query
    proposal: Proposal | None = None


@dataclass(frozen=True)
class _Pin:
    """A flavor the query is pinned to: its quota resource (`gpus/hopper`), the flavor, and
    the flavors its resource lists before it (their devices are charged to them: excluded)."""

    resource: QuotaResource
    flavor: ResourceFlavor
    before: tuple[ResourceFlavor, ...] = ()


def _pin_of(model: QuotaModel, resource: QuotaResource) -> _Pin:
    flavors = model.flavors_of(resource.base)
    index = [r.name for r in flavors].index(resource.name)
    return _Pin(resource, _spec(resource), tuple(_spec(r) for r in flavors[:index]))


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
    pins: list[_Pin] = []
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
        pins.append(_pin_of(model, order[chosen.flavor]))
        # the next resource: one the placement on the flavors chosen so far counts
        now_placed = chosen.found.answer
        if now_placed.outcome is not Outcome.ALLOCATED:
            now_placed = trials.on_empty_fleet(chosen.found.query) or now_placed
        counted = trials.counts(now_placed) if now_placed.outcome is Outcome.ALLOCATED else {}
        bases = [b for b in flavored_bases(model, counted) if b not in assigned]
    return FlavorChoice(chosen, tuple(tried))


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
        pins: Sequence[_Pin],
        base: str,
        flavors: Mapping[str, QuotaResource],
        name: str,
    ) -> FlavorAttempt[Found]:
        """One attempt of flavor `name` of resource `base` (`flavors`: the tenant's, by name),
        pinned to `pins` (the flavors chosen for the resources before) and to it."""
        model, tenant = self.around.model, self.quota.tenant
        resource = flavors[name]
        here = [*pins, _pin_of(model, resource)]
        flavor = resource.flavor

        def made(
            mode: FlavorMode,
            reason: FlavorReason | None = None,
            message: str = "",
            found: Found | None = None,
            borrows: int = 0,
        ) -> FlavorAttempt[Found]:
            return FlavorAttempt(base, flavor, mode, borrows, reason, message, found)

        pinned = pin(self.query, here, self.quota.tolerations, self.classes)
        if isinstance(pinned, DeviceTaint):
            why = f"untolerated taint {_taint_text(pinned)} in flavor {flavor}"
            return made(FlavorMode.NO_FIT, FlavorReason.UNTOLERATED_TAINT, why)
        bases = {p.resource.base for p in here}
        counts = _only(self.trials.counts, model, bases)
        answer = self._solve(pinned, not pins and self._reused_on(resource))
        if answer.outcome is Outcome.ALLOCATED:
            amounts = counts(answer)
            elsewhere = _charged_elsewhere(model, amounts, here)
            if elsewhere:
                why = f"the devices found are charged to flavor {elsewhere} (listed before)"
                return made(FlavorMode.NO_FIT, FlavorReason.CHARGED_ELSEWHERE, why)
            standing = quota_standing(model, tenant, amounts, self.around.usage)
            if standing >= QuotaStanding.BORROWING:
                borrows = int(standing is QuotaStanding.BORROWING)
                return made(FlavorMode.FIT, found=Found(answer, pinned), borrows=borrows)
            refusals = model.admit(tenant, amounts, self.around.usage)
            answer = replace(answer, outcome=Outcome.QUOTA_EXCEEDED, quota=refusals)
            reason, message = FlavorReason.QUOTA, "; ".join(map(str, refusals))
        else:
            reason = FlavorReason.DEVICES_IN_USE
            message = f"no free devices of flavor {flavor} fit the request"
        empty = self.trials.on_empty_fleet(pinned)
        if empty is None:
            why = f"no devices of flavor {flavor} fit the request, even with all of them free"
            return made(FlavorMode.NO_FIT, FlavorReason.NO_DEVICES, why, Found(answer, pinned))
        wanted = counts(empty)
        if quota_standing(model, tenant, wanted, self.around.usage) is QuotaStanding.ABOVE_MAX:
            refusals = model.admit(tenant, wanted, {})
            why = "; ".join(map(str, refusals)) or "more than the quota can ever grant"
            return made(FlavorMode.NO_FIT, FlavorReason.ABOVE_MAX, why, Found(answer, pinned))
        trials = replace(self.trials, counts=counts)
        proposal = propose(
            trials,
            pinned,
            self.lease,
            self.around,
            now=self.now,
            max_consolidation_nodes=self.max_consolidation_nodes,
        )
        found = Found(answer, pinned, proposal)
        if proposal is None:
            return made(FlavorMode.NO_CANDIDATES, reason, message, found)
        reclaims = all(
            v.reason in (PreemptionReason.RECLAIM, PreemptionReason.RECLAIM_WHILE_BORROWING)
            for v in proposal.victims
        )
        mode = FlavorMode.RECLAIM if reclaims else FlavorMode.PREEMPT
        left = _without(self.around, proposal)
        borrows = int(quota_standing(model, tenant, wanted, left) < QuotaStanding.WITHIN_NOMINAL)
        return made(mode, reason, message, found, borrows)

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


def _spec(resource: QuotaResource) -> ResourceFlavor:
    assert resource.spec is not None
    return resource.spec


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


def _charged_elsewhere(model: QuotaModel, amounts: Usage, pins: Sequence[_Pin]) -> str:
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


def _taint_text(taint: DeviceTaint) -> str:
    value = f"={taint.value}" if taint.value else ""
    return f"{taint.key}{value}:{taint.effect}"


# --- pinning a query to flavors ---------------------------------------------------------------


def pin(
    query: Query,
    pins: Sequence[_Pin],
    tenant_tolerations: Sequence[DeviceToleration],
    classes: Mapping[str, DeviceClass],
) -> Query | DeviceTaint:
    """`query` restricted to the pinned flavors: a node selector of their node labels; on each
    request (each subrequest) a quota resource of a pin counts, the flavor's CEL selectors (its
    device classes as one more selector when the request's class is not among them) and its
    tolerations; a subrequest that does not tolerate the flavor's nodeTaints is dropped. The
    taint no alternative of a request tolerates, when one does not."""
    labels = [pair for p in pins for pair in p.flavor.node_labels]
    avoided = [e.node_labels for p in pins for e in p.before if e.node_labels and not e.by_device]
    claims: list[ResourceClaim] = []
    for claim in query.claims:
        requests: list[DeviceRequest] = []
        for request in claim.requests:
            restricted = _request(request, pins, tenant_tolerations, classes)
            if isinstance(restricted, DeviceTaint):
                return restricted
            requests.append(restricted)
        claims.append(replace(claim, requests=tuple(requests)))
    selector = query.node_selector
    if labels or avoided:
        selector = _with_labels(selector, labels, avoided)
    return replace(query, claims=tuple(claims), node_selector=selector)


def _request(
    request: DeviceRequest,
    pins: Sequence[_Pin],
    tenant_tolerations: Sequence[DeviceToleration],
    classes: Mapping[str, DeviceClass],
) -> DeviceRequest | DeviceTaint:
    if request.exactly is not None:
        exactly = request.exactly
        for p in pins:
            if exactly.device_class_name not in p.resource.device_classes:
                continue
            given = (*exactly.tolerations, *tenant_tolerations)
            untolerated = _untolerated(p.flavor, given)
            if untolerated is not None:
                return untolerated
            exactly = replace(
                exactly,
                selectors=(
                    *exactly.selectors,
                    *_selectors(p, exactly.device_class_name, classes),
                ),
                tolerations=(*exactly.tolerations, *p.flavor.tolerations),
            )
        return replace(request, exactly=exactly)
    kept: list[DeviceSubRequest] = []
    refused: DeviceTaint | None = None
    for sub in request.first_available:
        made: DeviceSubRequest | None = sub
        for p in pins:
            if made is None or sub.device_class_name not in p.resource.device_classes:
                continue
            untolerated = _untolerated(p.flavor, (*sub.tolerations, *tenant_tolerations))
            if untolerated is not None:
                refused, made = refused or untolerated, None
                continue
            made = replace(
                made,
                selectors=(*made.selectors, *_selectors(p, sub.device_class_name, classes)),
                tolerations=(*made.tolerations, *p.flavor.tolerations),
            )
        if made is not None:
            kept.append(made)
    if not kept and refused is not None:
        return refused
    return replace(request, first_available=tuple(kept))


def _untolerated(flavor: ResourceFlavor, given: Sequence[DeviceToleration]) -> DeviceTaint | None:
    """The first of the flavor's nodeTaints neither `given` nor the flavor's own tolerations
    tolerate (Kueue's flavor check counts both)."""
    tolerations = (*given, *flavor.tolerations)
    for taint in flavor.node_taints:
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _selectors(
    pinned: _Pin, device_class: str, classes: Mapping[str, DeviceClass]
) -> tuple[DeviceSelector, ...]:
    """The CEL selectors that keep a request of `device_class` to the pinned flavor's devices:
    its own selectors, its device classes (when the request's is not among them), and the
    negation of each flavor listed before it that selects by device only."""
    flavor = pinned.flavor
    selectors = [DeviceSelector(expression) for expression in flavor.selectors]
    if flavor.device_classes and device_class not in flavor.device_classes:
        either = _classes_cel(flavor.device_classes, classes)
        if either is not None:
            selectors.append(DeviceSelector(either))
    for earlier in pinned.before:
        if earlier.node_labels or not earlier.by_device:
            continue  # a node-level flavor is avoided by the node selector
        parts = [f"({expression})" for expression in earlier.selectors]
        if earlier.device_classes:
            either = _classes_cel(earlier.device_classes, classes)
            if either is not None:
                parts.append(f"({either})")
        if parts:
            selectors.append(DeviceSelector(f"!({' && '.join(parts)})"))
    return tuple(selectors)


def _classes_cel(names: Sequence[str], classes: Mapping[str, DeviceClass]) -> str | None:
    """A CEL expression true for the devices one of the classes `names` selects (None: every
    device; "false": none, no class known)."""
    either: list[str] = []
    for name in names:
        found = classes.get(name)
        if found is None:
            continue
        if not found.selectors:
            return None
        either.append(" && ".join(f"({s.cel})" for s in found.selectors))
    return " || ".join(f"({e})" for e in either) or "false"


def _with_labels(
    selector: NodeSelector | None,
    labels: Sequence[tuple[str, str]],
    avoided: Sequence[Sequence[tuple[str, str]]] = (),
) -> NodeSelector:
    """`selector` and also every one of `labels` (the pinned flavors' nodeLabels), and not all
    of any of `avoided` (the node labels of flavors listed before them): each term gains the
    requirements, and is split in one term per label of an avoided flavor (NotIn: a node
    without the label, or with another value)."""
    required = tuple(NodeSelectorRequirement(key, "In", (value,)) for key, value in labels)
    terms = selector.node_selector_terms if selector is not None else (NodeSelectorTerm(),)
    made = [replace(t, match_expressions=(*t.match_expressions, *required)) for t in terms]
    for flavor in avoided:
        made = [
            replace(t, match_expressions=(*t.match_expressions, not_in))
            for t in made
            for not_in in (NodeSelectorRequirement(key, "NotIn", (value,)) for key, value in flavor)
        ]
    return NodeSelector(tuple(made))
