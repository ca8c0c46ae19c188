"""The allocator's pure core: Kubernetes DRA allocation with node choice and explanations.

    snapshot = ClusterSnapshot.build(slices, nodes, topologies=by_node)  # per inventory version
    state = AllocatedState.build(snapshot, held)             # (owner, AllocationResult) pairs
    result = solve(snapshot, state, classes, claims, selectors=SelectorCache(),
                   policy=Policy.BINPACK, topology_constraints=[...])
    match result:
        case Allocated(node=node, allocations=allocations): ...
        case Unsatisfiable(explanation=why): ...

The quota rule (quota/: `admit`, `tenant_status`, `cohort_status`, `share_of`, usage decay)
lives here too, pure, beside the preemption planner that asks it (preemptor.py's
`preemption_targets`, its one entry: preemption.py's passes, then consolidation.py's moves);
the model it decides over is services/common/quota/ (what the access policy declares).

This package is the solver's one door: nothing outside it imports its modules. It may import
services.cel's door and services.common only; pure (no grpc, redis, protobuf, clock, environment).

Bad input raises `services.common.errors` types (InvalidArgument with a field path,
FailedPrecondition, NotFound for an unknown pinned node, DeadlineExceeded when cancelled).
"""

from services.allocator.core.batch import solve_many
from services.allocator.core.candidates import (
    SolveFacts,
    taint_detail,
    tolerates,
    untolerated_taint,
)
from services.allocator.core.consolidation import (
    ConsolidationPlan,
    consolidation_order,
    fewest_moves,
    movable_candidates,
    plan_consolidation,
)
from services.allocator.core.counting import (
    UNKNOWN_MODEL,
    NodeUnits,
    UnitCount,
    count_units,
    gangs_that_fit,
)
from services.allocator.core.explain import (
    NO_SUMMARY,
    ConstraintExplanation,
    Explanation,
    NodeChoice,
    NodeMiss,
    ReasonCode,
    RejectionGroup,
    RequestExplanation,
    Summary,
    SummaryKind,
    detail_text,
    holders,
    summary_text,
)
from services.allocator.core.flavors import (
    FlavorAttempt,
    FlavorChoice,
    FlavorMode,
    FlavorReason,
    QuotaStanding,
    choose_flavor,
    preferred,
    quota_standing,
    should_try_next,
)
from services.allocator.core.fleet import COMMITTED, RESERVED, STATES, FleetCount, count_fleet
from services.allocator.core.fragmentation import DEFAULT_MIX, FragmentationMix, node_usable
from services.allocator.core.gang import solve_gang
from services.allocator.core.groups import GroupKey
from services.allocator.core.moves import (
    IDENTITY,
    Movable,
    Move,
    device_group,
    movable_device,
    place_moves,
)
from services.allocator.core.nodeselect import NodeAccess, allocation_node_selector
from services.allocator.core.outcome import (
    Allocated,
    NodePlacement,
    SearchBudget,
    SolveResult,
    Stats,
    Unsatisfiable,
)
from services.allocator.core.plan import Plan, build_plan
from services.allocator.core.preemption import (
    Candidate,
    Holding,
    NodeVictims,
    PreemptionContext,
    PreemptionPlan,
    PreemptionReason,
    fewest_victims,
    plan_preemption,
    preemption_candidates,
    victims_by_node,
)
from services.allocator.core.preemptor import (
    Consolidating,
    Target,
    Targets,
    preemption_targets,
)
from services.allocator.core.quota.fair_sharing import (
    NO_SHARE,
    ConsumedUsage,
    Share,
    decay,
    decayed_score,
    dominant_share,
    resample,
    sample_due,
    strategy_allows,
)
from services.allocator.core.quota.levels import Levels, tree_levels
from services.allocator.core.quota.rule import (
    CohortStatus,
    QuotaRefusal,
    TenantStatus,
    add_usage,
    admit,
    cohort_status,
    counted_only,
    quota_levels,
    resource_levels,
    share_of,
    tenant_status,
)
from services.allocator.core.results import ShareIdFactory, default_share_id
from services.allocator.core.scoring import Policy, Score, free_capacity
from services.allocator.core.snapshot import ClusterSnapshot, CounterID, DeviceEntry, NodeView
from services.allocator.core.solver import solve
from services.allocator.core.state import AllocatedState
from services.allocator.core.templates import node_templates
from services.allocator.core.topology import GpuPlace, NicInfo, NodeTopology, PcieRelation
from services.allocator.core.topology_constraints import (
    RequestRef,
    TopologyConstraint,
    TopologyKind,
    constraints_from_annotations,
)
from services.cel import CelDevice, CelError, CompiledSelector, SelectorCache

__all__ = [
    "tolerates",
    "IDENTITY",
    "ConsolidationPlan",
    "Movable",
    "Move",
    "device_group",
    "movable_device",
    "place_moves",
    "plan_consolidation",
    "FlavorAttempt",
    "FlavorChoice",
    "FlavorMode",
    "FlavorReason",
    "QuotaStanding",
    "choose_flavor",
    "preferred",
    "quota_standing",
    "should_try_next",
    "Candidate",
    "Holding",
    "NodeVictims",
    "PreemptionContext",
    "PreemptionPlan",
    "PreemptionReason",
    "consolidation_order",
    "fewest_moves",
    "fewest_victims",
    "movable_candidates",
    "plan_preemption",
    "preemption_candidates",
    "Consolidating",
    "Target",
    "Targets",
    "preemption_targets",
    "victims_by_node",
    "allocation_node_selector",
    "NO_SUMMARY",
    "Summary",
    "SummaryKind",
    "summary_text",
    "AllocatedState",
    "FragmentationMix",
    "GpuPlace",
    "NicInfo",
    "NodeTopology",
    "PcieRelation",
    "RequestRef",
    "TopologyConstraint",
    "TopologyKind",
    "constraints_from_annotations",
    "Allocated",
    "CelDevice",
    "CelError",
    "ClusterSnapshot",
    "CompiledSelector",
    "ConstraintExplanation",
    "CounterID",
    "DeviceEntry",
    "Explanation",
    "NodeChoice",
    "NodeMiss",
    "NodePlacement",
    "NodeView",
    "Plan",
    "Policy",
    "ReasonCode",
    "RejectionGroup",
    "RequestExplanation",
    "Score",
    "SearchBudget",
    "SelectorCache",
    "ShareIdFactory",
    "SolveFacts",
    "SolveResult",
    "Stats",
    "Unsatisfiable",
    "build_plan",
    "default_share_id",
    "solve",
    "taint_detail",
    "untolerated_taint",
    "detail_text",
    "holders",
    "COMMITTED",
    "FleetCount",
    "RESERVED",
    "STATES",
    "count_fleet",
    "DEFAULT_MIX",
    "node_usable",
    "solve_gang",
    "solve_many",
    "UNKNOWN_MODEL",
    "NodeUnits",
    "UnitCount",
    "count_units",
    "gangs_that_fit",
    "GroupKey",
    "NodeAccess",
    "free_capacity",
    "node_templates",
    "NO_SHARE",
    "ConsumedUsage",
    "Share",
    "decay",
    "decayed_score",
    "dominant_share",
    "resample",
    "sample_due",
    "strategy_allows",
    "Levels",
    "tree_levels",
    "CohortStatus",
    "QuotaRefusal",
    "TenantStatus",
    "add_usage",
    "admit",
    "cohort_status",
    "counted_only",
    "quota_levels",
    "resource_levels",
    "share_of",
    "tenant_status",
]
