"""When a grant's work was queued (LeaseOptions.queued_at, AllocateRequest.queued_time), and
Kueue's withinClusterQueue LowerOrNewerEqualPriority, through the real AllocatorService on the
embedded store (the fleet of test_flavor_search.py).

Kueue takes, under LowerOrNewerEqualPriority, its queue's workloads of a lower priority, or of
the same priority queued after the preemptor (their queue order timestamps). A request says
when its work was queued (a Kueue Workload's creation, a Slurm job's submit time); one that
does not was queued when it is decided, so it is newer than every reservation held and takes
no equal. A reservation keeps its request's queued time (label `gpualloc.dev/queued-at`);
one without it was queued when it was reserved. Candidates are still ordered by when they
were reserved (Kueue's admission time), lowest priority first."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.allocator.app.messages import LeaseOptions, Outcome, Query
from services.allocator.reservations.queued import QUEUED_AT_LABEL, queued_at
from tests.unit.allocator.test_flavor_search import BY_NODE, PRIORITIES, fleet_of, gpus, model_of

T = 1_700_000_000.0  # a queued time, seconds since the epoch
NEWER_EQUAL = """\
- name: hpc
  quotas: [{resource: gpus, flavor: hopper, nominal: 2}]
  preemption: {withinClusterQueue: POLICY}
"""


@dataclass(frozen=True)
class Row:
    holdings: tuple[tuple[str, str, float | None], ...]  # (name, priority, queued) in order
    queued: float | None  # the preemptor's (standard priority)
    victims: tuple[str, ...]
    policy: str = "LowerOrNewerEqualPriority"


ROWS = {
    "a-request-arriving-now-takes-no-equal": Row((("h1", "", None), ("h2", "", None)), None, ()),
    "a-request-queued-before-takes-the-equal-queued-after-it": Row(
        (("h1", "", T + 10), ("h2", "", T + 20)), T + 15, ("h2",)
    ),
    "an-equal-queued-before-the-request-is-spared": Row(
        (("h1", "", T + 10), ("h2", "", T + 20)), T + 30, ()
    ),
    "the-queued-time-decides-not-the-reservation-time": Row(
        (("queued-late", "", T + 30), ("queued-early", "", T + 5)), T + 10, ("queued-late",)
    ),
    "a-reservation-without-a-queued-time-was-queued-when-reserved": Row(
        (("h1", "", None), ("h2", "", None)), T, ("h2",)
    ),
    "a-lower-priority-goes-first-whatever-the-times": Row(
        (("equal", "", T + 30), ("low", "low", None)), T, ("low",)
    ),
    "lower-priority-policy-never-takes-an-equal": Row(
        (("h1", "", T + 10), ("h2", "", T + 20)), T, (), "LowerPriority"
    ),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_lower_or_newer_equal_priority_table(row: Row) -> None:
    """hpc holds its nominal 2 and asks one more at standard priority; the victims proposed,
    then taken with `preempt`."""
    model = model_of(BY_NODE + PRIORITIES, NEWER_EQUAL.replace("POLICY", row.policy))
    for fleet in fleet_of(model):
        for name, priority, queued in row.holdings:
            lease = LeaseOptions(f"hpc/{name}", priority_class=priority, queued_at=queued)
            made = fleet.service.allocate(Query((gpus(1),), node="hop-1"), lease)
            assert made.outcome is Outcome.ALLOCATED, name
            fleet.held[name] = made.reservations[0].id
            labels = dict(made.reservations[0].labels)
            assert (QUEUED_AT_LABEL in labels) is (queued is not None)
            assert queued_at(made.reservations[0]) == pytest.approx(
                queued if queued is not None else made.reservations[0].created_at
            )
        lease = LeaseOptions("hpc/grant", queued_at=row.queued)
        asked = fleet.service.allocate(Query((gpus(1),)), lease)
        assert asked.outcome is Outcome.QUOTA_EXCEEDED
        assert fleet.names(asked) == list(row.victims)
        if row.victims:
            taken = fleet.service.allocate(Query((gpus(1),)), LeaseOptions(
                "hpc/grant", queued_at=row.queued, preempt=True
            ))  # fmt: skip
            assert taken.outcome is Outcome.ALLOCATED
            assert fleet.names(taken) == list(row.victims)


def test_explain_proposes_by_the_queued_time_given() -> None:
    model = model_of(
        BY_NODE + PRIORITIES, NEWER_EQUAL.replace("POLICY", "LowerOrNewerEqualPriority")
    )
    for fleet in fleet_of(model):
        for name, queued in (("h1", T + 10), ("h2", T + 20)):
            lease = LeaseOptions(f"hpc/{name}", queued_at=queued)
            fleet.held[name] = fleet.service.allocate(Query((gpus(1),)), lease).reservations[0].id
        now = fleet.service.explain(Query((gpus(1),)), owner="hpc/x")
        early = fleet.service.explain(Query((gpus(1),)), owner="hpc/x", queued_at=T)
        assert fleet.names(now) == [] and fleet.names(early) == ["h2"]
