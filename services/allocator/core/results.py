"""From the picks of a successful search to one AllocationResult per claim (upstream `Allocate`'s
tail): device results in pick order, configs (v0.34.9 rules), and the node selector.

Share IDs are upstream's fresh UIDs for picks of multi-allocatable devices. Ours are
deterministic by default — a UUIDv5 of the claim (uid, else namespace/name), the result's
request, the device and the result's position — so the same solve gives the same answer; a
caller that needs other IDs passes its own `ShareIdFactory`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence

from services.allocator.core.made import check_made, made
from services.allocator.core.nodeselect import NodeAccess, allocation_node_selector
from services.allocator.core.plan import Alternative, ClaimPlan
from services.allocator.core.search import Pick
from services.allocator.core.snapshot import DeviceEntry
from services.common.dra.model import (
    AllocationResult,
    ConfigSource,
    Device,
    DeviceAllocationConfiguration,
    DeviceID,
    DeviceRequestAllocationResult,
    NodeSelector,
    ResourceClaim,
)
from services.common.dra.quantity import Quantity

__all__ = [
    "KeptResults",
    "ResultParts",
    "ShareIdFactory",
    "allocation_result",
    "default_share_id",
]

ShareIdFactory = Callable[[ResourceClaim, str, DeviceID, int], str]
"""(claim, result request name, device, position of the result in the claim) -> share ID."""

# The results made field by field (made.py): their fields, in order, as written below.
check_made(
    DeviceRequestAllocationResult,
    (
        "request",
        "driver",
        "pool",
        "device",
        "admin_access",
        "tolerations",
        "share_id",
        "consumed_capacity",
        "binding_conditions",
        "binding_failure_conditions",
    ),  # fmt: skip
)
check_made(AllocationResult, ("results", "config", "node_selector"))

_SHARE_ID_NAMESPACE = uuid.UUID("6f0d5b0e-3c1a-5d8e-9b77-2f4a8c1e9d30")


def default_share_id(claim: ResourceClaim, request: str, device: DeviceID, position: int) -> str:
    owner = claim.uid or f"{claim.namespace}/{claim.name}"
    return str(uuid.uuid5(_SHARE_ID_NAMESPACE, f"{owner}|{request}|{device}|{position}"))


class ResultParts:
    """What the results of one solve context's claims share (the items of a batch): a claim's
    configs per chosen alternatives, and the node selector of picks that are all local to
    their node, per node. Values only (frozen), read back as they were made."""

    __slots__ = ("configs", "kept_configs", "pinned")

    def __init__(self) -> None:
        self.configs: dict[tuple[int, tuple[int, ...]], Configs] = {}
        # the same by a kept outcome's chosen (request, alternative key) pairs of the claim
        self.kept_configs: dict[tuple[int, tuple[tuple[int, int], ...]], Configs] = {}
        self.pinned: dict[str | None, NodeSelector | None] = {}


Configs = tuple[DeviceAllocationConfiguration, ...]


def allocation_result(
    claim: ClaimPlan,
    picks: Sequence[Pick],
    chosen: Mapping[int, Alternative],
    node_name: str | None,
    share_id: ShareIdFactory,
    parts: ResultParts | None = None,
) -> AllocationResult:
    """The claim's result; `parts`: what earlier results of the same context worked out."""
    owner = claim.claim
    results = tuple(
        [
            _device_result(owner, i, pick.alternative, pick.entry, pick.consumed, share_id)
            for i, pick in enumerate(picks)
        ]
    )
    accesses = [p.entry.access for p in picks]
    if parts is None:
        config = _class_configs(claim, chosen) + _claim_configs(claim, chosen)
        return AllocationResult(results, config, allocation_node_selector(accesses, node_name))
    keys = tuple([chosen[i].key for i in range(len(claim.requests))])
    return AllocationResult(
        results, _kept_configs(claim, keys, chosen, parts), _selector(accesses, node_name, parts)
    )


class KeptResults:
    """The results of one kept outcome's picks (outcomes.py) for a context's claims, on any
    node of the outcome's template: what every node shares (per claim its owner, configs and
    picks with their alternatives' result fields) worked out once, so that the results on one
    node read only that node's devices (`on`). `picks` per claim as (alternative key, device
    index) in pick order, `chosen` per claim as (request index, alternative key), as the
    outcome keeps them; the plan's `alternatives` by key. A kept pick holds no capacity share
    (its consumed capacity is None)."""

    __slots__ = ("claims",)

    def __init__(
        self,
        claims: Sequence[ClaimPlan],
        picks: Sequence[Sequence[tuple[int, int]]],
        chosen: Sequence[tuple[tuple[int, int], ...]],
        alternatives: Mapping[int, Alternative],
        parts: ResultParts | None,
    ) -> None:
        # per claim: (its claim, its configs, per pick (device index, alternative, result name))
        self.claims: tuple[tuple[ResourceClaim, Configs, tuple[_KeptPick, ...]], ...] = tuple(
            [
                (
                    claim.claim,
                    _chosen_configs(claim, chosen[claim.index], alternatives, parts),
                    tuple(
                        [
                            (index, alternatives[key], alternatives[key].result_name)
                            for key, index in picks[claim.index]
                        ]
                    ),
                )
                for claim in claims
            ]
        )

    def on(
        self,
        devices: Sequence[DeviceEntry],
        node_name: str | None,
        share_id: ShareIdFactory,
        parts: ResultParts | None,
        taken: list[int] | None = None,
    ) -> tuple[tuple[AllocationResult, ...], bool]:
        """One AllocationResult per claim on the node with `devices` (in view order), as
        `allocation_result` makes them from the same picks, and whether no pick holds a share
        of its device. `taken`: gets the device index of every pick that holds its device
        whole (an admin's holds nothing; all of them only when the answer is True)."""
        whole = True
        allocations = []
        for owner, configs, picks in self.claims:
            results = []
            local = True  # every device of the claim node-local: the node's own selector
            for position, (index, alternative, request) in enumerate(picks):
                entry = devices[index]
                device = entry.device
                if device.allow_multiple_allocations:
                    whole = False
                    results.append(
                        _device_result(owner, position, alternative, entry, None, share_id)
                    )
                else:
                    results.append(_whole_device_result(request, alternative, entry.id, device))
                    if taken is not None and not alternative.admin:
                        taken.append(index)
                if local and not entry.access.node_name:
                    local = False
            if parts is not None and local and results:
                selector = parts.pinned.get(node_name, _UNKNOWN)
                if selector is _UNKNOWN:
                    accesses = [devices[index].access for index, _, _ in picks]
                    selector = parts.pinned[node_name] = allocation_node_selector(
                        accesses, node_name
                    )
            else:
                accesses = [devices[index].access for index, _, _ in picks]
                selector = allocation_node_selector(accesses, node_name)
            allocations.append(
                made(
                    AllocationResult,
                    {"results": tuple(results), "config": configs, "node_selector": selector},
                )
            )
        return tuple(allocations), whole


_KeptPick = tuple[int, Alternative, str]  # (device index on the node, alternative, result name)


def _chosen_configs(
    claim: ClaimPlan,
    chosen: tuple[tuple[int, int], ...],
    alternatives: Mapping[int, Alternative],
    parts: ResultParts | None,
) -> Configs:
    """The claim's configs for a kept outcome's chosen (request, alternative key) pairs."""
    by_request = {request: alternatives[key] for request, key in chosen}
    if parts is None:
        return _class_configs(claim, by_request) + _claim_configs(claim, by_request)
    found = parts.kept_configs.get((claim.index, chosen))
    if found is None:
        keys = tuple([key for _, key in chosen])
        found = parts.kept_configs[claim.index, chosen] = _kept_configs(
            claim, keys, by_request, parts
        )
    return found


def _kept_configs(
    claim: ClaimPlan, keys: tuple[int, ...], chosen: Mapping[int, Alternative], parts: ResultParts
) -> Configs:
    """The claim's configs for its chosen alternatives (`keys`: theirs, per request), made
    once per context."""
    found = parts.configs.get((claim.index, keys))
    if found is None:
        found = parts.configs[claim.index, keys] = _class_configs(claim, chosen) + _claim_configs(
            claim, chosen
        )
    return found


def _selector(
    accesses: Sequence[NodeAccess], node_name: str | None, parts: ResultParts
) -> NodeSelector | None:
    """allocation_node_selector; one per node and context when every pick is node-local."""
    if accesses and all([access.node_name for access in accesses]):  # pinned to the node
        selector = parts.pinned.get(node_name, _UNKNOWN)
        if selector is _UNKNOWN:
            selector = parts.pinned[node_name] = allocation_node_selector(accesses, node_name)
        return selector
    return allocation_node_selector(accesses, node_name)


_UNKNOWN = NodeSelector(())  # no node's pinned selector yet (a real one has a term)


def _whole_device_result(
    request: str, alternative: Alternative, device_id: DeviceID, device: Device
) -> DeviceRequestAllocationResult:
    """`_device_result` of a device held whole (not multi-allocatable): no share ID, no
    consumed capacity."""
    return made(
        DeviceRequestAllocationResult,
        {
            "request": request,
            "driver": device_id.driver,
            "pool": device_id.pool,
            "device": device_id.device,
            "admin_access": True if alternative.admin else None,
            "tolerations": alternative.tolerations,  # as upstream: what let a tainted device in
            "share_id": None,
            "consumed_capacity": {},
            "binding_conditions": device.binding_conditions,
            "binding_failure_conditions": device.binding_failure_conditions,
        },
    )


def _device_result(
    claim: ResourceClaim,
    position: int,
    alternative: Alternative,
    entry: DeviceEntry,
    consumed: Mapping[str, Quantity] | None,
    share_id: ShareIdFactory,
) -> DeviceRequestAllocationResult:
    device_id, device = entry.id, entry.device
    request = alternative.result_name
    if not device.allow_multiple_allocations:
        return _whole_device_result(request, alternative, device_id, device)
    return DeviceRequestAllocationResult(
        request=request,
        driver=device_id.driver,
        pool=device_id.pool,
        device=device_id.device,
        admin_access=True if alternative.admin else None,
        tolerations=alternative.tolerations,
        share_id=share_id(claim, request, device_id, position),
        consumed_capacity=dict(consumed) if consumed else {},
        binding_conditions=device.binding_conditions,
        binding_failure_conditions=device.binding_failure_conditions,
    )


def _class_configs(
    claim: ClaimPlan, chosen: Mapping[int, Alternative]
) -> tuple[DeviceAllocationConfiguration, ...]:
    """Each class's configs once, listing every (sub)request that used the class, in order."""
    requests_by_class: dict[str, list[str]] = {}
    classes = []
    for index in range(len(claim.requests)):
        alternative = chosen[index]
        name = alternative.device_class.name
        if name not in requests_by_class:
            requests_by_class[name] = []
            classes.append(alternative.device_class)
        requests_by_class[name].append(alternative.result_name)
    return tuple(
        DeviceAllocationConfiguration(
            ConfigSource.FROM_CLASS, tuple(requests_by_class[device_class.name]), config
        )
        for device_class in classes
        for config in device_class.config
    )


def _claim_configs(
    claim: ClaimPlan, chosen: Mapping[int, Alternative]
) -> tuple[DeviceAllocationConfiguration, ...]:
    """Upstream v0.34.9: a config without requests applies to all; otherwise it is appended
    once per request it names (duplicates included, as upstream) or whose selected
    subrequest it names as `req/sub`; configs naming only unselected subrequests are dropped."""
    configs = []
    for config in claim.claim.config:
        entry = DeviceAllocationConfiguration(
            ConfigSource.FROM_CLAIM, config.requests, config.opaque
        )
        if not config.requests:
            configs.append(entry)
            continue
        for index, request in enumerate(claim.requests):
            alternative = chosen[index]
            if request.name in config.requests or (
                alternative.subrequest is not None and alternative.result_name in config.requests
            ):
                configs.append(entry)
    return tuple(configs)
