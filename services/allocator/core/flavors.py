"""Flavor assignment: which of its flavors a grant takes (Kueue's flavorassigner).

A tenant lists the flavors of a quota resource in its order. Each flavor tried gets a mode:

- FIT: the devices are free and the quota admits the grant (`borrows` > 0 when only by
  borrowing from the cohort);
- RECLAIM / PREEMPT: it fits once some reservations go (all of them other tenants' borrowings,
  or some of the tenant's own);
- NO_CANDIDATES: it could fit (its devices exist, the quota could grant it) but no victim the
  policy allows makes room now;
- NO_FIT: it can never fit as things are (no devices of the flavor serve the request even on
  an empty fleet, an untolerated taint, more than the quota can ever grant).

The tenant's `flavorFungibility` decides when the search stops (`should_try_next`) and which
attempt wins when it does not stop (`preferred`), as Kueue's `shouldTryNextFlavor` and
`isPreferred` do. A flavor needing neither borrowing nor preemption always wins.

The caller makes each attempt (a solve pinned to the flavor, the quota's check, the
preemption planner on the flavor); this module only decides. Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum
from typing import Generic, TypeVar

from services.allocator.core.quota.rule import admit
from services.common.quota.model import (
    FlavorFungibility,
    FlavorPreference,
    QuotaModel,
    Usage,
    WhenCanBorrow,
    WhenCanPreempt,
)

__all__ = [
    "FlavorAttempt",
    "FlavorChoice",
    "FlavorMode",
    "FlavorReason",
    "QuotaStanding",
    "choose_flavor",
    "preferred",
    "quota_standing",
    "should_try_next",
]

T = TypeVar("T")


class FlavorMode(IntEnum):
    """Kueue's granular flavor modes, worst first (the order `preferred` compares them in)."""

    NO_FIT = 0
    NO_CANDIDATES = 1
    PREEMPT = 2
    RECLAIM = 3
    FIT = 4

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    FlavorMode.NO_FIT: "NoFit",
    FlavorMode.NO_CANDIDATES: "NoCandidates",
    FlavorMode.PREEMPT: "Preempt",
    FlavorMode.RECLAIM: "Reclaim",
    FlavorMode.FIT: "Fit",
}


class FlavorReason(StrEnum):
    """Why a flavor is not FIT (a closed set: Explain tells them apart by value)."""

    UNTOLERATED_TAINT = "untolerated-taint"  # the flavor's nodeTaints; the request tolerates not
    NO_DEVICES = "no-devices"  # no devices of the flavor serve the request, even all free
    CHARGED_ELSEWHERE = "charged-elsewhere"  # its devices are an earlier flavor's (overlap)
    ABOVE_MAX = "above-max"  # more than the tenant's quota could ever grant on the flavor
    DEVICES_IN_USE = "devices-in-use"  # the devices are held now
    QUOTA = "quota"  # the quota refuses it now


@dataclass(frozen=True)
class FlavorAttempt(Generic[T]):
    """One flavor tried: its mode, how far it borrows (0: within nominal, 1: from its cohort),
    why it is not FIT (None when it is), a message, and what the caller found there (a
    placement, a preemption plan)."""

    resource: str  # the quota resource the flavor is of (its base: `gpus`)
    flavor: str
    mode: FlavorMode
    borrows: int = 0
    reason: FlavorReason | None = None
    message: str = ""
    found: T | None = None
    chosen: bool = False  # the search took it

    def bare(self) -> FlavorAttempt[None]:
        """The attempt without what the caller found (for an answer)."""
        return FlavorAttempt(
            self.resource,
            self.flavor,
            self.mode,
            self.borrows,
            self.reason,
            self.message,
            chosen=self.chosen,
        )


@dataclass(frozen=True)
class FlavorChoice(Generic[T]):
    """The search's outcome: the attempt chosen (None when every flavor is NO_FIT) and every
    attempt made, in order."""

    chosen: FlavorAttempt[T] | None
    tried: tuple[FlavorAttempt[T], ...]


def should_try_next(attempt: FlavorAttempt[T], fungibility: FlavorFungibility) -> bool:
    """Kueue's shouldTryNextFlavor: go on after a flavor that does not fit, has no victims, or
    needs preemption (whenCanPreempt TryNextFlavor) or borrowing (whenCanBorrow TryNextFlavor)."""
    if attempt.mode in (FlavorMode.NO_FIT, FlavorMode.NO_CANDIDATES):
        return True
    preempts = attempt.mode in (FlavorMode.PREEMPT, FlavorMode.RECLAIM)
    if preempts and fungibility.when_can_preempt is WhenCanPreempt.TRY_NEXT_FLAVOR:
        return True
    return attempt.borrows > 0 and fungibility.when_can_borrow is WhenCanBorrow.TRY_NEXT_FLAVOR


def preferred(
    a: FlavorAttempt[T], b: FlavorAttempt[T] | None, fungibility: FlavorFungibility
) -> bool:
    """Kueue's isPreferred: whether `a` is better than `b` (None: nothing yet). NO_FIT never
    is; a flavor with victims beats one without; then BorrowingOverPreemption (the default)
    compares the mode, then the borrowing, PreemptionOverBorrowing the other way round. A tie
    keeps the earlier flavor."""
    if a.mode is FlavorMode.NO_FIT:
        return False
    if b is None or b.mode is FlavorMode.NO_FIT:
        return True
    a_none, b_none = a.mode is FlavorMode.NO_CANDIDATES, b.mode is FlavorMode.NO_CANDIDATES
    if a_none != b_none:
        return not a_none
    if fungibility.preference is FlavorPreference.PREEMPTION_OVER_BORROWING:
        if a.borrows != b.borrows:
            return a.borrows < b.borrows
        return a.mode > b.mode
    if a.mode != b.mode:
        return a.mode > b.mode
    return a.borrows < b.borrows


def choose_flavor(
    flavors: Iterable[str],
    attempt: Callable[[str], FlavorAttempt[T]],
    fungibility: FlavorFungibility,
) -> FlavorChoice[T]:
    """Try `flavors` in order (`attempt(flavor)` makes one attempt) until one ends the search
    (`should_try_next` false: it is taken), else the `preferred` of those tried; None chosen
    when every one is NO_FIT. The one chosen is marked `chosen` among those tried."""
    best: int | None = None
    tried: list[FlavorAttempt[T]] = []
    for flavor in flavors:
        made = attempt(flavor)
        tried.append(made)
        if not should_try_next(made, fungibility):
            best = len(tried) - 1
            break
        if preferred(made, tried[best] if best is not None else None, fungibility):
            best = len(tried) - 1
    if best is None:
        return FlavorChoice(None, tuple(tried))
    tried[best] = replace(tried[best], chosen=True)
    return FlavorChoice(tried[best], tuple(tried))


# --- the quota's part of a flavor's mode -------------------------------------------------------


class QuotaStanding(IntEnum):
    """What the quota alone says of a grant on a flavor."""

    ABOVE_MAX = 0  # more than the tenant could ever be granted, everything else released
    SHORT = 1  # not now: only if reservations go
    BORROWING = 2  # now, borrowing from its cohort
    WITHIN_NOMINAL = 3  # now, within its nominal quota


def quota_standing(
    model: QuotaModel, tenant: str, amounts: Usage, usage: Mapping[str, Usage]
) -> QuotaStanding:
    """The quota's standing of granting `amounts` to `tenant` on top of `usage` (Kueue's
    fitsResourceQuota: Fit with or without borrowing, preemption may help, or more than the
    tenant's maximum capacity)."""
    if not admit(model, tenant, amounts, usage, within_nominal=True):
        return QuotaStanding.WITHIN_NOMINAL
    if not admit(model, tenant, amounts, usage):
        return QuotaStanding.BORROWING
    if admit(model, tenant, amounts, _nothing_held(usage)):
        return QuotaStanding.ABOVE_MAX
    return QuotaStanding.SHORT


def _nothing_held(usage: Mapping[str, Usage]) -> dict[str, Usage]:
    return {tenant: {} for tenant in usage}
