"""The quota rule, pure, next to the preemption planner: the rule's half of tenant quotas.

`rule` (`admit`: whether a grant fits a tenant's quota at every level of its cohort tree;
`tenant_status`/`cohort_status`: where each stands; `share_of`), `levels` (one resource's
quota and usage at every node of a tree: available, potential, borrowing, lent) and
`fair_sharing` (dominant resource shares, Kueue's preemption strategies, usage decay). They
take the model, services/common/quota/ (what the access policy declares), and usage values,
and return values. Imported from outside the core only through its door,
services/allocator/core/__init__.py.
"""
