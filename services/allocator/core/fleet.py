"""How the fleet stands now, GPU by GPU: what the metrics' fleet gauges report.

A GPU is a unit a whole-GPU request would take: a device that consumes no counters, or one
counter set of a slice (the NVIDIA driver publishes a GPU and its MIG partitions as devices
drawing on one counter set per GPU). Per GPU:

- free: nothing holds it (none of its devices in use, none of its set's counters drawn) and
  none of its devices is tainted;
- tainted: nothing holds it, but a device of it has a taint (NoSchedule or NoExecute: an
  unhealthy GPU), so no new allocation gets it unless it tolerates the taint;
- otherwise held, `committed` when one of its holders is committed, else `reserved` (a lease,
  or a placement being reserved right now); a GPU of which one MIG slice is held is held.

Partitions free: per MIG profile (the device attribute `profile`, as the NVIDIA driver names
it: `1g.10gb`), the partition devices that could be allocated now, each on its own (not in use,
not tainted, their counters still fit). Placements of one profile never overlap on a GPU, so
that is also how many of the profile fit together.

Held GPU equivalents per holder: a whole device counts 1, a partition its share of the GPU
(`DeviceEntry.size`), so a tenant holding seven 1g slices of one A100 holds one GPU's worth.

Fragmentation per node: `fragmentation.node_fragmentation`, a tainted device counted as taken
(as the web view's: app/fleet_view.py).

Everything is one pass over the snapshot's devices; node-local slices are counted under their
node, other slices (network-attached devices) under node "".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from services.allocator.core.fragmentation import node_fragmentation
from services.allocator.core.snapshot import ClusterSnapshot, CounterID, DeviceEntry
from services.allocator.core.state import AllocatedState

__all__ = ["FleetCount", "GpuKey", "count_fleet", "device_model"]

GpuKey = tuple[str, str, str]  # node, pool, model
UNKNOWN_MODEL = "unknown"
PROFILE_ATTRIBUTE = "profile"
FREE, RESERVED, COMMITTED, TAINTED = "free", "reserved", "committed", "tainted"
STATES = (FREE, RESERVED, COMMITTED, TAINTED)


@dataclass
class FleetCount:
    """The counts: GPUs per (node, pool, model) and state; partitions free per (node, pool,
    model, profile); held GPU equivalents per (holder, model); fragmentation per node."""

    gpus: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    partitions_free: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    held: dict[tuple[str, str], Fraction] = field(default_factory=dict)
    fragmentation: dict[str, Fraction] = field(default_factory=dict)

    def capacity(self) -> dict[GpuKey, int]:
        """GPUs per (node, pool, model), whatever their state."""
        totals: dict[GpuKey, int] = {}
        for (node, pool, model, _), count in self.gpus.items():
            totals[(node, pool, model)] = totals.get((node, pool, model), 0) + count
        return totals


def device_model(entry: DeviceEntry) -> str:
    """The product name the driver publishes (`productName`, in its domain or not)."""
    attributes = entry.device.attributes
    value = attributes.get("productName") or attributes.get(f"{entry.id.driver}/productName")
    return str(value.value) if value is not None else UNKNOWN_MODEL


def count_fleet(
    snapshot: ClusterSnapshot, state: AllocatedState, committed: Callable[[str], bool]
) -> FleetCount:
    """The fleet's counts; `committed(owner)`: whether a holder of `state` is committed."""
    count = FleetCount()
    by_node: dict[str, list[DeviceEntry]] = {}
    for entry in snapshot.all_devices():
        by_node.setdefault(entry.slice.slice.node_name or "", []).append(entry)
    for node, entries in sorted(by_node.items()):
        _count_node(count, node, entries, state, committed)
        count.fragmentation[node] = node_fragmentation(
            entries, lambda e: _taken(state, e), state.counter_amount
        )
    return count


def _count_node(
    count: FleetCount,
    node: str,
    entries: list[DeviceEntry],
    state: AllocatedState,
    committed: Callable[[str], bool],
) -> None:
    for gpu in _gpus(entries):
        model = next((m for m in map(device_model, gpu) if m != UNKNOWN_MODEL), UNKNOWN_MODEL)
        pool = gpu[0].id.pool
        owners = {owner for entry in gpu for owner in state.owners(entry.id)}
        drawn = any(state.counter_amount(c) for c in _set_counters(gpu))
        if not owners and not drawn:
            status = TAINTED if any(entry.device.taints for entry in gpu) else FREE
        else:
            status = COMMITTED if any(committed(o) for o in owners) else RESERVED
        key = (node, pool, model, status)
        count.gpus[key] = count.gpus.get(key, 0) + 1
        for entry in gpu:
            profile = entry.device.attributes.get(PROFILE_ATTRIBUTE)
            if profile is not None and entry.counters:
                key = (node, pool, model, str(profile.value))
                count.partitions_free[key] = count.partitions_free.get(key, 0) + _free(state, entry)
            for owner in state.owners(entry.id):
                share = entry.size if entry.counters else Fraction(1)
                held = (owner, model)
                count.held[held] = count.held.get(held, Fraction(0)) + share


def _gpus(entries: Iterable[DeviceEntry]) -> list[list[DeviceEntry]]:
    """The node's GPUs: each device without counters alone, the devices of one counter set
    together (by the set of their first counter)."""
    plain: list[list[DeviceEntry]] = []
    sets: dict[tuple[str, str, str], list[DeviceEntry]] = {}
    for entry in entries:
        if not entry.counters:
            plain.append([entry])
        else:
            counter = entry.counters[0][0]
            key = (counter.driver, counter.pool, counter.counter_set)
            sets.setdefault(key, []).append(entry)
    return [*plain, *sets.values()]


def _set_counters(gpu: list[DeviceEntry]) -> set[CounterID]:
    return {counter for entry in gpu for counter, _ in entry.counters}


def _taken(state: AllocatedState, entry: DeviceEntry) -> bool:
    """Unavailable to another request whole: tainted, in use, or a shared device held
    exclusively."""
    if entry.device.taints:
        return True
    return state.in_use(entry.id) if not entry.multi else state.is_exclusive(entry.id)


def _free(state: AllocatedState, entry: DeviceEntry) -> int:
    """1 when the partition could be allocated now: not in use, not tainted, its counters
    still fit."""
    if state.in_use(entry.id) or entry.device.taints:
        return 0
    totals = entry.slice.totals
    fits = all(
        state.counter_amount(counter) + amount <= totals[counter]
        for (counter, _), amount in zip(entry.counters, entry.amounts, strict=True)
    )
    return 1 if fits else 0
