"""One view, checked: no device and no counter is held twice, whoever holds it.

The audit reads what every system holds (all reservations, whoever the owner) against the
inventory, and checks the two things that would mean two schedulers collided:

- a device in two reservations (two jobs on one GPU or MIG device);
- a counter set overdrawn: the devices held on a GPU consume more of a shared counter than
  the GPU has (a MIG slice given to Kubernetes while Slurm holds the whole GPU, or two
  overlapping MIG placements), summed from each held device's `consumesCounters`.

It also groups the holdings by system (`slurm/...`, `kueue/...`), which is what the demo
prints. It is a pure function of values, so tests and `make demo` run the same check.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.client.inventory import NodeInventory
from services.client.results import Reservation
from services.common.dra.model import DeviceID
from services.common.dra.quantity import Quantity

__all__ = ["AuditReport", "audit", "system_of"]


def system_of(owner: str) -> str:
    """`slurm` for `slurm/job/17`, `kueue` for `kueue/team-a/job-x`, the owner otherwise."""
    return owner.split("/", 1)[0]


@dataclass(frozen=True)
class AuditReport:
    reservations: int
    devices_held: int
    double_held: dict[DeviceID, tuple[str, ...]] = field(default_factory=dict)
    overdrawn: tuple[str, ...] = ()
    unknown_devices: tuple[DeviceID, ...] = ()
    by_system: dict[str, tuple[DeviceID, ...]] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.double_held and not self.overdrawn and not self.unknown_devices

    def lines(self) -> list[str]:
        """A human summary, one finding per line."""
        systems = ", ".join(f"{s} {len(d)}" for s, d in sorted(self.by_system.items()))
        out = [
            f"{self.reservations} reservations hold {self.devices_held} devices"
            + (f" ({systems})" if systems else "")
        ]
        out.extend(
            f"HELD TWICE {d}: {', '.join(ids)}" for d, ids in sorted(self.double_held.items())
        )
        out.extend(f"OVERDRAWN {line}" for line in self.overdrawn)
        out.extend(f"NOT IN INVENTORY {d}" for d in self.unknown_devices)
        if self.clean:
            out.append("no device or counter is held twice")
        return out


def audit(reservations: Sequence[Reservation], nodes: Sequence[NodeInventory]) -> AuditReport:
    holders: dict[DeviceID, list[str]] = defaultdict(list)
    by_system: dict[str, list[DeviceID]] = defaultdict(list)
    for reservation in reservations:
        for device in reservation.devices:
            holders[device].append(reservation.id)
            by_system[system_of(reservation.owner)].append(device)
    devices = {d.id: d for node in nodes for d in node.devices}
    totals = {(c.driver, c.pool, c.name): c.counters for node in nodes for c in node.counter_sets}
    used: dict[tuple[str, str, str, str], Quantity] = {}
    unknown = []
    for device_id in sorted(holders):
        found = devices.get(device_id)
        if found is None:
            unknown.append(device_id)
            continue
        for consumption in found.device.consumes_counters:
            for counter, amount in consumption.counters.items():
                key = (device_id.driver, device_id.pool, consumption.counter_set, counter)
                used[key] = used[key] + amount if key in used else amount
    overdrawn = []
    for (driver, pool, counter_set, counter), amount in sorted(used.items()):
        total = totals.get((driver, pool, counter_set), {}).get(counter)
        if total is None or total < amount:
            overdrawn.append(
                f"{driver}/{pool}/{counter_set}/{counter}: {amount} used of {total or 0}"
            )
    return AuditReport(
        reservations=len(reservations),
        devices_held=len(holders),
        double_held={d: tuple(ids) for d, ids in holders.items() if len(ids) > 1},
        overdrawn=tuple(overdrawn),
        unknown_devices=tuple(unknown),
        by_system={s: tuple(sorted(d)) for s, d in by_system.items()},
    )
