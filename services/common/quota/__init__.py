"""Tenant quotas as the access policy declares them: the model, plain values.

`model` (quota resources and flavors, priority classes, preemption policies, tenants' and
cohorts' quotas, fair-sharing settings, and `QuotaModel` with its lookups) and `tree` (the
cohort tree's shape). The policy parser (services/common/security/policy.py) builds them; the
rule that decides over them lives in the allocator's core (services/allocator/core/quota/).
"""
