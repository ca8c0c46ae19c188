"""Placement policies as pure key functions: which node wins, which device is tried first.

Upstream has no scoring (first fit; KEP-4970 is open). We keep first fit as `FIRST_FIT` and add:

- `BINPACK` (default): fill what is already in use. Among nodes that fit, the one left with the
  fewest free devices wins, then the one with the least free counter share; within a pool,
  partitions of GPUs that are already partly used are tried first, smallest partition first,
  and multi-allocatable devices that already have shares before fresh ones.
- `SPREAD`: the opposite node order (most free devices left), fresh GPUs first.

Ties always break by node name, then by the snapshot's device order, so results are stable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from services.allocator.core.snapshot import CounterID, DeviceEntry

__all__ = ["Policy", "Score", "candidate_key", "measure", "node_key"]


class Policy(StrEnum):
    FIRST_FIT = "FirstFit"
    BINPACK = "BinPack"
    SPREAD = "Spread"


@dataclass(frozen=True)
class Score:
    """What a placement leaves free on its node; the policy ranks nodes by it."""

    free_devices: int  # devices on the node still allocatable after the placement
    total_devices: int
    free_counters: Fraction  # mean free share of the node's counters after it (1 if none)

    def __str__(self) -> str:
        share = f"{float(self.free_counters):.0%}"
        devices = f"{self.free_devices} of {self.total_devices} devices"
        return f"{devices} free after placement, {share} of counters free"


def node_key(policy: Policy, node: str | None, score: Score) -> tuple[int, Fraction, str]:
    """Smaller is better."""
    name = node or ""
    if policy is Policy.BINPACK:
        return (score.free_devices, score.free_counters, name)
    if policy is Policy.SPREAD:
        return (-score.free_devices, -score.free_counters, name)
    return (0, Fraction(0), name)


def candidate_key(
    policy: Policy,
    entry: DeviceEntry,
    counter_used: Callable[[CounterID], Fraction],
    has_shares: bool,
) -> tuple[int, Fraction, int]:
    """Order of candidates within one pool; smaller is tried first."""
    if policy is Policy.FIRST_FIT:
        return (0, Fraction(0), entry.position)
    if entry.counters:
        in_use = any(counter_used(counter) > 0 for counter, _ in entry.counters)
    else:
        in_use = has_shares
    first = 0 if in_use == (policy is Policy.BINPACK) else 1
    return (first, entry.size, entry.position)


def measure(
    devices: Iterable[DeviceEntry],
    available: Callable[[DeviceEntry], bool],
    counter_used: Callable[[CounterID], Fraction],
) -> Score:
    """Score a node from its devices and what is still available after a placement."""
    total = free = 0
    shares: list[Fraction] = []
    seen_slices: set[int] = set()
    for entry in devices:
        total += 1
        free += available(entry)
        if entry.slice.index in seen_slices:
            continue
        seen_slices.add(entry.slice.index)
        for counter, limit in entry.slice.counter_totals.items():
            if limit > 0:
                left = max(Fraction(0), limit - counter_used(counter))
                shares.append(left / limit)
    free_counters = sum(shares, Fraction(0)) / len(shares) if shares else Fraction(1)
    return Score(free, total, free_counters)
