"""Pinning a query to resource flavors: what the solver is told the quota allows.

A flavor the query is pinned to becomes, for the solver: its node labels a node selector (and
the node labels of the flavors the tenant lists before it a NotIn, so that a later flavor is
not given the devices of an earlier one); on every request and subrequest of a device class
the flavor's resource counts, its CEL selectors, its device classes (as one more selector,
when the request's class is not among them), the negation of the device-level flavors the
tenant lists before it, and its tolerations. A subrequest that does not tolerate the flavor's
nodeTaints (with its tenant's and the flavor's own tolerations, as Kueue's flavor check counts
them) is dropped; a request none of whose alternatives tolerates them makes the flavor NoFit
(app/flavor_search.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from services.allocator.app.messages import Query
from services.allocator.core import tolerates
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
from services.common.quota.model import QuotaModel, QuotaResource, ResourceFlavor

__all__ = ["Pin", "pin", "pin_of", "spec_of", "taint_text"]


@dataclass(frozen=True)
class Pin:
    """A flavor the query is pinned to: its quota resource (`gpus/hopper`), the flavor, and
    the flavors the tenant lists before it (their devices are left out where a node selector
    or a device selector can say so)."""

    resource: QuotaResource
    flavor: ResourceFlavor
    before: tuple[ResourceFlavor, ...] = ()


def pin_of(model: QuotaModel, tenant: str, resource: QuotaResource) -> Pin:
    """`resource`'s flavor pinned for `tenant` (one of the flavors it lists)."""
    flavors = model.charge_order(tenant, resource.base)
    index = [r.name for r in flavors].index(resource.name)
    return Pin(resource, spec_of(resource), tuple(spec_of(r) for r in flavors[:index]))


def spec_of(resource: QuotaResource) -> ResourceFlavor:
    assert resource.spec is not None
    return resource.spec


def pin(
    query: Query,
    pins: Sequence[Pin],
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
    pins: Sequence[Pin],
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
    pinned: Pin, device_class: str, classes: Mapping[str, DeviceClass]
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


def taint_text(taint: DeviceTaint) -> str:
    value = f"={taint.value}" if taint.value else ""
    return f"{taint.key}{value}:{taint.effect}"
