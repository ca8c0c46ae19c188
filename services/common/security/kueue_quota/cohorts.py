"""A Cohort read as Kueue's CRD and webhook check it (its parent, quotas of its own and
fair-sharing weight: the native `quota.cohorts[]`), and the checks over the tree of cohorts
that Kueue accepts as objects but cannot run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common.dra.names import dns1123_subdomain_errors
from services.common.errors import FieldViolation
from services.common.security.kueue_quota.fields import Checker, FieldError
from services.common.security.kueue_quota.queues import (
    Queue,
    fair_sharing_weight,
    resource_groups,
)


def read_cohort(checker: Checker, document: Mapping[str, Any]) -> Queue:
    """A Cohort: its parent, quotas of its own and fair-sharing weight (native
    `quota.cohorts[]`), read as a queue."""
    spec = checker.mapping(
        document.get("spec", {}), "spec", {"parentName", "resourceGroups", "fairSharing"}
    )
    parent = checker.string(spec.get("parentName", ""), "spec.parentName", required=False)
    for problem in dns1123_subdomain_errors(parent) if parent else ():
        checker.fail(FieldError.INVALID, "spec.parentName", problem)
    fields: dict[str, Any] = {"parent": parent} if parent else {}
    cohort = Queue(checker.ref, fields, [])
    before = len(checker.errors)
    groups = spec.get("resourceGroups", [])
    resource_groups(checker, groups, bool(parent), cohort, of_cohort=True)
    weight = fair_sharing_weight(checker, spec.get("fairSharing"), "spec.fairSharing")
    if weight is not None:
        fields["fairSharing"] = {"weight": weight}
    cohort.valid = len(checker.errors) == before
    return cohort


def check_cohort_tree(
    errors: list[FieldViolation], cohorts: dict[str, Queue], queues: Mapping[str, Queue]
) -> None:
    """What Kueue accepts as objects but cannot run: a cycle of parents (Kueue disables
    every member until it is gone) and a Cohort named as a ClusterQueue (gpualloc's
    tenants and cohorts share one namespace). Refused."""
    for name, cohort in cohorts.items():
        if name in queues:
            Checker(errors, cohort.ref).fail(
                FieldError.REFUSED,
                "metadata.name",
                f"a ClusterQueue is named {name} too: gpualloc's tenants and cohorts share names",
            )
    reported: set[str] = set()
    for name in cohorts:
        chain, at = [name], cohorts[name].fields.get("parent")
        while at in cohorts and at not in chain:
            chain.append(at)
            at = cohorts[at].fields.get("parent")
        if at in chain and at not in reported:
            loop = [*chain[chain.index(at) :], at]
            reported.update(loop)
            Checker(errors, cohorts[at].ref).fail(
                FieldError.REFUSED,
                "spec.parentName",
                "Cohorts form a cycle (Kueue stops every member until it is removed): "
                + " -> ".join(loop),
            )
