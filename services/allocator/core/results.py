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

from services.allocator.core.nodeselect import NodeAccess, allocation_node_selector
from services.allocator.core.plan import Alternative, ClaimPlan
from services.allocator.core.search import Pick
from services.allocator.core.snapshot import DeviceEntry
from services.common.dra.model import (
    AllocationResult,
    ConfigSource,
    DeviceAllocationConfiguration,
    DeviceID,
    DeviceRequestAllocationResult,
    NodeSelector,
    ResourceClaim,
)
from services.common.dra.quantity import Quantity

__all__ = [
    "ResultParts",
    "ShareIdFactory",
    "allocation_result",
    "default_share_id",
    "kept_allocation_result",
]

ShareIdFactory = Callable[[ResourceClaim, str, DeviceID, int], str]
"""(claim, result request name, device, position of the result in the claim) -> share ID."""

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


def kept_allocation_result(
    claim: ClaimPlan,
    picks: Sequence[tuple[int, int]],
    chosen: tuple[tuple[int, int], ...],
    devices: Sequence[DeviceEntry],
    alternatives: Mapping[int, Alternative],
    node_name: str | None,
    share_id: ShareIdFactory,
    parts: ResultParts | None,
) -> AllocationResult:
    """`allocation_result` of the claim's picks a kept outcome places on a node
    (outcomes.py), without making Picks: `picks` as (alternative key, device index) in pick
    order, `chosen` as (request index, alternative key) per request, as the outcome keeps
    them; the node's `devices` in view order; the plan's `alternatives` by key. A kept pick
    holds no capacity share (its consumed capacity is None)."""
    owner = claim.claim
    results = []
    accesses = []
    for position, (key, index) in enumerate(picks):
        entry = devices[index]
        results.append(_device_result(owner, position, alternatives[key], entry, None, share_id))
        accesses.append(entry.access)
    if parts is None:
        by_request = {request: alternatives[key] for request, key in chosen}
        config = _class_configs(claim, by_request) + _claim_configs(claim, by_request)
        selector = allocation_node_selector(accesses, node_name)
        return AllocationResult(tuple(results), config, selector)
    found = parts.kept_configs.get((claim.index, chosen))
    if found is None:
        keys = tuple([key for _, key in chosen])
        by_request = {request: alternatives[key] for request, key in chosen}
        found = parts.kept_configs[claim.index, chosen] = _kept_configs(
            claim, keys, by_request, parts
        )
    return AllocationResult(tuple(results), found, _selector(accesses, node_name, parts))


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
        return DeviceRequestAllocationResult(
            request,
            device_id.driver,
            device_id.pool,
            device_id.device,
            True if alternative.admin else None,
            alternative.tolerations,  # as upstream: what let a tainted device in
            None,
            {},
            device.binding_conditions,
            device.binding_failure_conditions,
        )
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
