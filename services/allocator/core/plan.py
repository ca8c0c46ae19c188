"""The validation pass: claims -> a plan of requests and their alternatives, or a typed error.

Upstream validates everything before searching (`Allocate`, `validateDeviceRequest`): per claim,
per request, per subrequest — selectors have CEL, a class name is set and the class exists, the
allocation mode is known — then the claim's minimum device count against the 32-result limit,
then the constraints. First error wins, in claim and request order. Errors carry the field path
of the offending value and upstream's message.

What depends on the node (the device lists of `All` requests, pool completeness) is checked
per node by `candidates.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from services.common.dra.model import (
    AllocationMode,
    DeviceClass,
    DeviceConstraint,
    DeviceSelector,
    DeviceToleration,
    ResourceClaim,
)
from services.common.dra.quantity import Quantity
from services.common.dra.suggest import did_you_mean
from services.common.errors import InvalidArgument

__all__ = [
    "MAX_DEVICES_PER_CLAIM",
    "Alternative",
    "ClaimPlan",
    "ConstraintKind",
    "ConstraintSpec",
    "Plan",
    "RequestPlan",
    "build_plan",
]

MAX_DEVICES_PER_CLAIM = 32  # resource/v1 AllocationResultsMaxSize


class ConstraintKind(StrEnum):
    MATCH = "matchAttribute"
    DISTINCT = "distinctAttribute"


@dataclass(frozen=True)
class ConstraintSpec:
    index: int
    kind: ConstraintKind
    attribute: str
    requests: tuple[str, ...]  # empty: every request of the claim

    def applies_to(self, request: str, subrequest: str | None) -> bool:
        if not self.requests:
            return True
        return request in self.requests or (
            subrequest is not None and f"{request}/{subrequest}" in self.requests
        )


@dataclass(frozen=True, eq=False)
class Alternative:
    """One way to satisfy a request: the request itself (`exactly`) or one of its subrequests."""

    key: int  # unique within the plan, for per-solve caches
    claim_index: int
    request_index: int
    sub_index: int | None
    request: str  # the request's name
    subrequest: str | None
    device_class: DeviceClass
    selectors: tuple[DeviceSelector, ...]
    mode: AllocationMode
    count: int
    admin: bool
    tolerations: tuple[DeviceToleration, ...]
    capacity: Mapping[str, Quantity]
    path: str  # field path of the (sub)request
    constraints: tuple[int, ...]  # indices into the claim's constraints that cover it

    @property
    def result_name(self) -> str:
        """The `request` of its results: `req` or `req/sub`."""
        return self.request if self.subrequest is None else f"{self.request}/{self.subrequest}"

    @property
    def name(self) -> str:
        """Upstream's `request.name()` in messages: the subrequest's own name when there is one."""
        return self.subrequest if self.subrequest is not None else self.request


@dataclass(frozen=True, eq=False)
class RequestPlan:
    name: str
    alternatives: tuple[Alternative, ...]


@dataclass(frozen=True, eq=False)
class ClaimPlan:
    index: int
    claim: ResourceClaim
    label: str  # namespace/name, as upstream's klog.KObj
    requests: tuple[RequestPlan, ...]
    constraints: tuple[ConstraintSpec, ...]


@dataclass(frozen=True, eq=False)
class Plan:
    claims: tuple[ClaimPlan, ...]
    _alternatives: tuple[Alternative, ...] = field(init=False, repr=False)
    by_key: Mapping[int, Alternative] = field(init=False, repr=False)  # alternatives by key

    def __post_init__(self) -> None:
        every = tuple(a for c in self.claims for r in c.requests for a in r.alternatives)
        object.__setattr__(self, "_alternatives", every)
        object.__setattr__(self, "by_key", {a.key: a for a in every})

    def alternatives(self) -> tuple[Alternative, ...]:
        """Every alternative of every request, claim by claim (read by every node's search:
        listed once)."""
        return self._alternatives


def build_plan(claims: Sequence[ResourceClaim], classes: Mapping[str, DeviceClass]) -> Plan:
    """Validate `claims` against `classes`; raise InvalidArgument at the first problem."""
    builder = _PlanBuilder(classes)
    return Plan(tuple(builder.claim(i, claim) for i, claim in enumerate(claims)))


class _PlanBuilder:
    def __init__(self, classes: Mapping[str, DeviceClass]) -> None:
        self.classes = classes
        self.next_key = 0

    def claim(self, index: int, claim: ResourceClaim) -> ClaimPlan:
        label = f"{claim.namespace}/{claim.name}"
        path = f"claims[{index}].spec.devices"
        specs = [_constraint_spec(c) for c in claim.constraints]
        requests = tuple(
            self.request(claim, index, j, label, f"{path}.requests[{j}]", specs)
            for j in range(len(claim.requests))
        )
        minimum = sum(min(_static_count(a) for a in r.alternatives) for r in requests)
        if minimum > MAX_DEVICES_PER_CLAIM:
            raise InvalidArgument.at(
                f"{path}.requests",
                f"claim {label}: number of requested devices {minimum} exceeds the claim limit "
                f"of {MAX_DEVICES_PER_CLAIM}",
            )
        constraints = []
        for i, (constraint, spec) in enumerate(zip(claim.constraints, specs, strict=True)):
            if spec is None:
                raise InvalidArgument.at(
                    f"{path}.constraints[{i}]",
                    f"claim {label}, constraint #{i}: "
                    "empty constraint (unsupported constraint type?)",
                )
            constraints.append(ConstraintSpec(i, spec[0], spec[1], constraint.requests))
        return ClaimPlan(index, claim, label, requests, tuple(constraints))

    def request(
        self,
        claim: ResourceClaim,
        claim_index: int,
        request_index: int,
        label: str,
        path: str,
        specs: Sequence[tuple[ConstraintKind, str] | None],
    ) -> RequestPlan:
        request = claim.requests[request_index]

        def covering(sub: str | None) -> tuple[int, ...]:
            return tuple(
                i
                for i, (constraint, spec) in enumerate(zip(claim.constraints, specs, strict=True))
                if spec is not None and _covers(constraint.requests, request.name, sub)
            )

        if request.exactly is not None and request.first_available:
            raise InvalidArgument.at(path, "exactly one of exactly and firstAvailable may be set")
        if request.exactly is None and not request.first_available:
            raise InvalidArgument.at(path, "exactly one of exactly and firstAvailable must be set")
        where = (claim_index, request_index, request.name, label)
        if request.exactly is not None:
            exact = request.exactly
            spec = _Spec(
                None,
                None,
                f"{path}.exactly",
                exact.device_class_name,
                exact.selectors,
                exact.allocation_mode,
                exact.count,
                bool(exact.admin_access),
                exact.tolerations,
                exact.capacity.requests if exact.capacity else {},
                covering(None),
            )
            return RequestPlan(request.name, (self.alternative(*where, spec),))
        alternatives = tuple(
            self.alternative(
                *where,
                _Spec(
                    k,
                    sub.name,
                    f"{path}.firstAvailable[{k}]",
                    sub.device_class_name,
                    sub.selectors,
                    sub.allocation_mode,
                    sub.count,
                    False,
                    sub.tolerations,
                    sub.capacity.requests if sub.capacity else {},
                    covering(sub.name),
                ),
            )
            for k, sub in enumerate(request.first_available)
        )
        return RequestPlan(request.name, alternatives)

    def alternative(
        self, claim_index: int, request_index: int, request: str, label: str, spec: _Spec
    ) -> Alternative:
        subrequest, path, class_name, selectors = (
            spec.sub_name,
            spec.path,
            spec.class_name,
            spec.selectors,
        )
        name = subrequest if subrequest is not None else request
        where = f"claim {label}, request {name}"
        for i, selector in enumerate(selectors):
            if not selector.cel:
                raise InvalidArgument.at(
                    f"{path}.selectors[{i}].cel.expression",
                    f"{where}, selector #{i}: CEL expression empty (unsupported selector type?)",
                )
        if not class_name:
            raise InvalidArgument.at(
                f"{path}.deviceClassName",
                f"{where}: missing device class name (unsupported request type?)",
            )
        device_class = self.classes.get(class_name)
        if device_class is None:
            raise InvalidArgument.at(
                f"{path}.deviceClassName",
                f"{where}: could not retrieve device class {class_name}"
                + did_you_mean(class_name, self.classes),
            )
        for i, selector in enumerate(device_class.selectors):
            if not selector.cel:
                raise InvalidArgument.at(
                    f'classes["{class_name}"].spec.selectors[{i}].cel.expression',
                    f"class {class_name}: selector #{i}: CEL expression empty",
                )
        try:
            mode = AllocationMode(spec.mode)
        except ValueError:
            raise InvalidArgument.at(
                f"{path}.allocationMode", f"{where}: unsupported count mode {spec.mode}"
            ) from None
        count = spec.count
        if mode is AllocationMode.EXACT_COUNT and count < 0:
            raise InvalidArgument.at(f"{path}.count", f"{where}: count must not be negative")
        self.next_key += 1
        return Alternative(
            key=self.next_key - 1,
            claim_index=claim_index,
            request_index=request_index,
            sub_index=spec.sub_index,
            request=request,
            subrequest=subrequest,
            device_class=device_class,
            selectors=selectors,
            mode=mode,
            count=count if mode is AllocationMode.EXACT_COUNT else 0,
            admin=spec.admin,
            tolerations=spec.tolerations,
            capacity=dict(spec.capacity),
            path=path,
            constraints=spec.constraints,
        )


@dataclass(frozen=True)
class _Spec:
    """The fields an exact request and a subrequest have in common."""

    sub_index: int | None
    sub_name: str | None
    path: str
    class_name: str
    selectors: tuple[DeviceSelector, ...]
    mode: AllocationMode | str
    count: int
    admin: bool
    tolerations: tuple[DeviceToleration, ...]
    capacity: Mapping[str, Quantity]
    constraints: tuple[int, ...]


def _constraint_spec(constraint: DeviceConstraint) -> tuple[ConstraintKind, str] | None:
    # Upstream's switch: matchAttribute wins when both are set.
    if constraint.match_attribute is not None:
        return ConstraintKind.MATCH, constraint.match_attribute
    if constraint.distinct_attribute is not None:
        return ConstraintKind.DISTINCT, constraint.distinct_attribute
    return None


def _covers(requests: tuple[str, ...], request: str, subrequest: str | None) -> bool:
    if not requests:
        return True
    return request in requests or (subrequest is not None and f"{request}/{subrequest}" in requests)


def _static_count(alternative: Alternative) -> int:
    """Devices an alternative needs for sure: its count; `All` counts per node, later."""
    return alternative.count if alternative.mode is AllocationMode.EXACT_COUNT else 0
