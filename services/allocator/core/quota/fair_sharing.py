"""Fair sharing as Kueue defines it: dominant resource shares, preemption strategies, usage decay.

The rule's half of fair sharing; its settings (`FairSharing`, `AdmissionFairSharing`, the
`PreemptionStrategy` values), as the policy's `spec.quota` declares them, are the model's,
services/common/quota/model.py.

- **Dominant resource share** (Kueue's DRS, pkg/cache/scheduler/fair_sharing.go): a tenant's
  or a cohort's share is, over resources, the largest ratio of what it uses above its subtree
  quota (summed over the resource's flavors) to what its parent's tree could lend it at most
  (Kueue's potentialAvailable of the parent, summed over the flavors), times 1000, divided by
  its `fairSharing.weight`. A node that borrows nothing has share 0; a weight of 0 makes a
  borrowing node's share infinite. A root has share 0. Preemption with fair sharing compares
  shares (core/fair_preemption.py), and QuotaStatus shows them so a bridge can order its queue.
- **Preemption strategies** (Kueue's Configuration fairSharing.preemptionStrategies):
  `LessThanOrEqualToFinalShare` (the preemptor's share with its grant may not pass the
  victim's share once the victim is gone) and `LessThanInitialShare` (the preemptor's share
  with its grant must stay below the victim's share before); Kueue's default is both, in that
  order.
- **Admission fair sharing** (Kueue's AdmissionFairSharing; Slurm's PriorityDecayHalfLife):
  each tenant's usage decayed with a half-life. At every sample, decayed = old * (1 - a) +
  held now * a, with a = 1 - 0.5 ** (elapsed / half-life) (a half-life of 0 keeps only the
  present). The edge supplies the samples and the times; these functions only compute.

Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from services.allocator.core.quota.levels import Levels
from services.common.quota.model import PreemptionStrategy
from services.common.quota.tree import CohortTree, NodeKey

__all__ = [
    "NO_SHARE",
    "ConsumedUsage",
    "Share",
    "decay",
    "decayed_score",
    "dominant_share",
    "resample",
    "sample_due",
    "strategy_allows",
]


# --- dominant resource share -------------------------------------------------------------------


@dataclass(frozen=True)
class Share:
    """A node's dominant resource share: `ratio` (borrowed over lendable, times 1000, of its
    dominant resource) before its `weight` divides it."""

    ratio: Fraction = Fraction(0)
    weight: Fraction = Fraction(1)
    dominant: str = ""
    borrowing: bool = False  # uses more than its subtree quota of some resource

    @property
    def zero(self) -> bool:
        return self.ratio == 0

    @property
    def infinite(self) -> bool:
        """A weight of 0 while borrowing: preferred last for admission, first as a victim."""
        return self.weight == 0 and not self.zero

    @property
    def weighted(self) -> Fraction | None:
        """ratio / weight; None for an infinite share."""
        if self.zero:
            return Fraction(0)
        if self.weight == 0:
            return None
        return self.ratio / self.weight

    def key(self) -> tuple[int, Fraction]:
        """Orders shares as Kueue's CompareDRS does: infinite shares above every finite one
        (among them by ratio), the others by weighted share."""
        weighted = self.weighted
        if weighted is None:
            return (1, self.ratio)
        return (0, weighted)

    def rounded(self) -> int:
        """Kueue's status `weightedShare`: the weighted share rounded up; an infinite one is
        the largest int64."""
        weighted = self.weighted
        if weighted is None:
            return 2**63 - 1
        return math.ceil(weighted)


NO_SHARE = Share(Fraction(-1))  # below every real share: the start of a search for the highest


def dominant_share(
    tree: CohortTree,
    key: NodeKey,
    levels: Mapping[str, Levels],
    base_of: Mapping[str, str],
    extra: Mapping[str, int] | None = None,
) -> Share:
    """The node's share from `levels` (resource -> that resource's Levels of the node's tree;
    every resource of the model), with `extra` added to its usage (a grant's amounts)."""
    weight = tree.node(key).weight
    if tree.parent(key) is None:
        return Share(weight=weight)
    parent = tree.parent(key)
    assert parent is not None
    borrowed: dict[str, int] = {}
    lendable: dict[str, int] = {}
    for resource, level in levels.items():
        base = base_of.get(resource, resource)
        over = (extra or {}).get(resource, 0) + level.usage[key] - level.subtree[key]
        if over > 0:
            borrowed[base] = borrowed.get(base, 0) + over
        lendable[base] = lendable.get(base, 0) + level.potential(parent)
    if not borrowed:
        return Share(weight=weight)
    ratio, dominant = Fraction(0), ""
    for base in sorted(borrowed):
        most = lendable.get(base, 0)
        if most > 0:
            value = Fraction(borrowed[base] * 1000, most)
            if value > ratio:
                ratio, dominant = value, base
    return Share(ratio, weight, dominant, borrowing=True)


def strategy_allows(
    strategy: PreemptionStrategy, preemptor_new: Share, target_old: Share, target_new: Share
) -> bool:
    """Whether `strategy` lets a preemptor whose share with its grant is `preemptor_new` take
    a victim whose side's share is `target_old` before and `target_new` after it goes."""
    if strategy is PreemptionStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE:
        return preemptor_new.key() <= target_new.key()
    return preemptor_new.key() < target_old.key()


# --- admission fair sharing: usage with a half-life -------------------------------------------


@dataclass(frozen=True)
class ConsumedUsage:
    """One tenant's decayed usage per resource (milli-units, fractional) as of `at` (seconds,
    by the store's clock)."""

    amounts: Mapping[str, float]
    at: float


def decay(
    old: Mapping[str, float], held: Mapping[str, int], elapsed: float, half_life: float
) -> dict[str, float]:
    """Kueue's CalculateDecayedConsumed: old * (1 - a) + held * a, a = 1 - 0.5 ** (elapsed /
    half_life); a half-life of 0 keeps only `held`; a negative `elapsed` counts as 0."""
    elapsed = max(0.0, elapsed)
    alpha = 1.0 if half_life <= 0 else 1.0 - 0.5 ** (elapsed / half_life)
    names = set(old) | set(held)
    found = {}
    for name in sorted(names):
        value = old.get(name, 0.0) * (1.0 - alpha) + held.get(name, 0) * alpha
        if value > 0:
            found[name] = value
    return found


def decayed_score(
    amounts: Mapping[str, float],
    weights: Mapping[str, Fraction],
    base_of: Mapping[str, str],
    tenant_weight: Fraction,
) -> float | None:
    """A tenant's decayed usage as one number (Kueue's LocalQueue FS usage): the sum over
    resources of weight * decayed usage (in units, not milli-units), over the tenant's
    fair-sharing weight; None for a weight of 0 (infinite)."""
    total = 0.0
    for name in sorted(amounts):
        weight = weights.get(base_of.get(name, name), Fraction(1))
        total += float(weight) * amounts[name] / 1000
    if tenant_weight == 0:
        return None if total > 0 else 0.0
    return total / float(tenant_weight)


def sample_due(at: float | None, now: float, interval: float) -> bool:
    """Whether a new sample is due: never sampled, or `interval` passed since."""
    return at is None or now - at >= interval


def resample(
    consumed: Mapping[str, ConsumedUsage],
    held: Mapping[str, Mapping[str, int]],
    tenants: Iterable[str],
    now: float,
    half_life: float,
) -> dict[str, ConsumedUsage]:
    """Every tenant's decayed usage sampled at `now` with what it holds now (`held`)."""
    found = {}
    for tenant in sorted(tenants):
        before = consumed.get(tenant)
        old = before.amounts if before is not None else {}
        elapsed = now - before.at if before is not None else 0.0
        # a tenant never sampled starts from nothing (Kueue seeds a new LocalQueue empty)
        at = now if before is None else max(now, before.at)  # never back in time
        found[tenant] = ConsumedUsage(decay(old, held.get(tenant, {}), elapsed, half_life), at)
    return found
