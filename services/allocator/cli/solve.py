"""`gpualloc solve`: an offline what-if allocation on Kubernetes objects, no server needed.

    gpualloc solve -f examples/cluster -f examples/deviceclasses.yaml \\
                   -f examples/claims/one-h100.yaml [--node NAME] [--policy P] [-o json|yaml|text]
                   [--gang N [--gang-label LABEL]] [--capacity] [--emit claims -o yaml|json]
    gpualloc solve --gang 2 --gang-label topology.kubernetes.io/zone -f examples/cluster \\
                   -f examples/deviceclasses.yaml -f examples/claims/eight-h100.yaml

Inputs are any mix of ResourceSlice, DeviceClass, ResourceClaim and Node objects, plus files of
`gpualloc.io/v1alpha1 NodeTopology` objects (adapters/inventory/topology_files.py; e.g. `-f
examples/topology`). Claims without `status.allocation` are allocated together (one node, all or
nothing) in input order; claims with one hold their devices already. A claim's annotation
`gpualloc.io/topology-constraints` adds topology constraints over its requests (see
docs/placement.md). With `--gang N`, the claims go on each of N distinct nodes instead, all
sharing one value of the node label `--gang-label` (without it, any N nodes), all or nothing
(docs/placement.md, "Gangs"). `--capacity` counts how many more copies of the claims (or
gangs of them) fit now, per node and GPU model, as the service's Capacity does. With no claim
left to allocate (every one has status.allocation), the answer is an empty result, as
upstream's allocator gives. `--emit claims` prints, instead of the report, every input claim as
a ResourceClaim (a `v1 List`), the new ones with their `status.allocation`: the state to replay
in a later `solve -f`. Exit codes: 0 allocated (with --capacity: at least one fits), 3
unsatisfiable (the explanation says why), 2 invalid input or an allocation error such as a CEL
error (message on stderr, with the file and line of the claim it is about).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import yaml

from services.allocator.adapters.inventory.topology_files import split_topologies
from services.allocator.app.capacity_count import count_capacity
from services.allocator.app.messages import GangSpec, Query
from services.allocator.app.placing import Deadline, PlacementSearch
from services.allocator.config import ALLOCATOR_SETTINGS
from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Explanation,
    Policy,
    Score,
    SearchBudget,
    SelectorCache,
    Stats,
    constraints_from_annotations,
    default_share_id,
    detail_text,
    solve,
    summary_text,
)
from services.common.config import read_document_limits
from services.common.dra.limits import DocumentLimits
from services.common.dra.model import (
    AllocationResult,
    DeviceClass,
    Node,
    ResourceClaim,
    ResourceSlice,
)
from services.common.dra.parse import Where
from services.common.dra.serialize import allocation_result_to_dict, resource_claim_to_dict
from services.common.errors import FieldViolation, GpuallocError, InvalidArgument
from services.common.manifests import add_validate_flag, load_located_manifests

__all__ = ["EXIT_ALLOCATED", "EXIT_INVALID", "EXIT_UNSATISFIABLE", "register", "run_solve"]

EXIT_ALLOCATED = 0
EXIT_INVALID = 2
EXIT_UNSATISFIABLE = 3

_POLICIES = {
    "first-fit": Policy.FIRST_FIT,
    "binpack": Policy.BINPACK,
    "spread": Policy.SPREAD,
    "fragmentation-aware": Policy.FRAGMENTATION_AWARE,
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "solve",
        help="allocate claims offline from Kubernetes objects (what-if)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="file, directory or - (stdin): ResourceSlices, DeviceClasses, ResourceClaims, Nodes",
    )
    parser.add_argument("--node", help="allocate on this node only (labels from a Node object)")
    parser.add_argument(
        "--policy",
        choices=sorted(_POLICIES),
        default="binpack",
        help="how to choose the node: first-fit (upstream-like), binpack (default), spread, "
        "fragmentation-aware (docs/placement.md)",
    )
    parser.add_argument(
        "--gang",
        type=int,
        metavar="N",
        help="a multi-node job: the claims on each of N distinct nodes, all or nothing",
    )
    parser.add_argument(
        "--gang-label",
        metavar="LABEL",
        default="",
        help="with --gang: every node of the gang has the same value of this node label "
        "(e.g. nvidia.com/gpu.clique, a rack label); nodes without it are not used",
    )
    parser.add_argument(
        "--capacity",
        action="store_true",
        help="count how many more copies of the claims fit now (per node and GPU model; with "
        "--gang, how many gangs) instead of allocating them once",
    )
    parser.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    add_validate_flag(parser)
    parser.add_argument(
        "--emit",
        choices=("report", "claims"),
        default="report",
        help="what to print: the report (default), or the claims as ResourceClaims with their "
        "status.allocation, to replay (needs -o yaml or -o json)",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=SearchBudget().max_steps,
        help="search step budget (default %(default)s)",
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        limits = read_document_limits(os.environ)  # GPUALLOC_MAX_DOCUMENT_*
        binding = ALLOCATOR_SETTINGS["device_binding_conditions"].read(os.environ)
    except InvalidArgument as error:
        print(f"gpualloc solve: {error}", file=sys.stderr)
        return EXIT_INVALID
    return run_solve(
        args.filename,
        node=args.node,
        policy=_POLICIES[args.policy],
        output=args.output,
        max_steps=args.max_steps,
        gang=args.gang,
        gang_label=args.gang_label,
        capacity=args.capacity,
        limits=limits,
        emit=args.emit,
        strict=args.validate == "strict",
        binding_conditions=binding,
    )


def run_solve(
    paths: Sequence[str],
    *,
    node: str | None = None,
    policy: Policy = Policy.BINPACK,
    output: str = "text",
    max_steps: int = SearchBudget().max_steps,
    gang: int | None = None,
    gang_label: str = "",
    capacity: bool = False,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stdin: TextIO | None = None,
    limits: DocumentLimits | None = None,
    emit: str = "report",
    strict: bool = True,
    binding_conditions: bool = True,
) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    try:
        spec = _gang_spec(gang, gang_label, node)
        _check_emit(emit, output, spec, capacity)
        inputs = _load(paths, stdin, limits, strict, binding_conditions)
        try:
            if capacity:
                report = _capacity(inputs, node, policy, max_steps, spec)
            else:
                report = _solve(inputs, node, policy, max_steps, spec)
        except InvalidArgument as error:
            raise inputs.locate(error) from None
    except GpuallocError as error:
        print(f"gpualloc solve: {error}", file=err)
        return EXIT_INVALID
    allocations: list[AllocationResult] = report.pop("allocations", [])
    code = EXIT_ALLOCATED if report["outcome"] == "allocated" else EXIT_UNSATISFIABLE
    if emit == "claims":
        if code != EXIT_ALLOCATED:
            err.write(_text(report))  # nothing to replay: why, where a person reads it
            return code
        report = _claims_list(inputs, allocations)
    if output == "json":
        json.dump(report, out, indent=2)
        out.write("\n")
    elif output == "yaml":
        yaml.safe_dump(report, out, sort_keys=False)
    else:
        out.write(_capacity_text(report) if capacity else _text(report))
    return code


def _check_emit(emit: str, output: str, gang: GangSpec | None, capacity: bool) -> None:
    if emit != "claims":
        return
    if output == "text":
        raise InvalidArgument.at("--emit", "claims are printed as objects: add -o yaml or -o json")
    if gang is not None or capacity:
        flag = "--gang" if gang is not None else "--capacity"
        raise InvalidArgument.at("--emit", f"claims cannot be emitted with {flag}")


def _claims_list(inputs: _Inputs, allocations: Sequence[AllocationResult]) -> dict[str, Any]:
    """Every input claim as a ResourceClaim, in input order; those just allocated with their
    `status.allocation` (so the list, given back to `solve -f`, holds their devices)."""
    solved = dict(zip(map(id, inputs.pending), allocations, strict=True))
    items = [
        resource_claim_to_dict(
            dataclasses.replace(claim, allocation=solved[id(claim)])
            if id(claim) in solved
            else claim
        )
        for claim in inputs.claims
    ]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _gang_spec(count: int | None, label: str, node: str | None) -> GangSpec | None:
    if count is None:
        if label:
            raise InvalidArgument.at("--gang-label", "needs --gang")
        return None
    if count < 1:
        raise InvalidArgument.at("--gang", f"must be at least 1, got {count}")
    if node:
        raise InvalidArgument.at("--node", "cannot be combined with --gang")
    return GangSpec(count, label)


_CLAIM_PATH = re.compile(r"claims\[(\d+)\]\.(.*)")


@dataclasses.dataclass
class _Inputs:
    """The cluster, its state (claims with an allocation hold their devices), the classes, every
    claim and those to place (with where each came from)."""

    snapshot: ClusterSnapshot
    state: AllocatedState
    classes: dict[str, DeviceClass]
    claims: list[ResourceClaim]
    pending: list[ResourceClaim]
    where: list[Where]  # of each pending claim

    def parts(
        self,
    ) -> tuple[ClusterSnapshot, AllocatedState, dict[str, DeviceClass], list[ResourceClaim]]:
        """What a solve takes: the snapshot, its state, the classes and the pending claims."""
        return self.snapshot, self.state, self.classes, self.pending

    def locate(self, error: InvalidArgument) -> InvalidArgument:
        """An error about `claims[i].<path>` (the allocator's words) as one about the file and
        line of that claim, as decoding errors read; any other error as it is."""
        match = _CLAIM_PATH.fullmatch(error.field_path)
        if match is None or int(match[1]) >= len(self.where):
            return error
        violation = FieldViolation(match[2], error.violations[0].description)
        return self.where[int(match[1])].fail([violation, *error.violations[1:]])


def _load(
    paths: Sequence[str],
    stdin: TextIO | None,
    limits: DocumentLimits | None,
    strict: bool,
    binding_conditions: bool = True,
) -> _Inputs:
    manifests, topologies = split_topologies(paths)
    located = load_located_manifests(manifests, stdin, limits, strict=strict) if manifests else []
    objects = [o for o, _ in located]
    slices = [o for o in objects if isinstance(o, ResourceSlice)]
    nodes = [o for o in objects if isinstance(o, Node)]
    classes = {o.name: o for o in objects if isinstance(o, DeviceClass)}
    claims = [o for o in objects if isinstance(o, ResourceClaim)]
    pending = [(o, w) for o, w in located if isinstance(o, ResourceClaim) and o.allocation is None]
    snapshot = ClusterSnapshot.build(
        slices, nodes, topologies=topologies, binding_conditions=binding_conditions
    )
    return _Inputs(
        snapshot,
        AllocatedState.from_claims(snapshot, claims),
        classes,
        claims,
        [c for c, _ in pending],
        [w for _, w in pending],
    )


def _capacity(
    inputs: _Inputs,
    node: str | None,
    policy: Policy,
    max_steps: int,
    gang: GangSpec | None,
) -> dict[str, Any]:
    """How many more copies of the pending claims (or gangs of them) fit: the service's
    Capacity on files (services/allocator/app/capacity_count.py)."""
    snapshot, state, classes, pending = inputs.parts()
    if not pending:
        raise InvalidArgument.at(
            "--capacity", "no ResourceClaim without status.allocation to count"
        )
    solver = PlacementSearch(SelectorCache(), policy=policy, max_steps=max_steps)
    query = Query(tuple(pending), node=node or "", gang=gang)
    answer = count_capacity(solver, snapshot, state, classes, query, Deadline(None), generation=0)
    report: dict[str, Any] = {
        "outcome": "allocated" if answer.total else "unsatisfiable",
        "capacity": {
            "total": answer.total,
            "accuracy": str(answer.accuracy),
            "nodes": [
                {"node": n.node, "count": n.count, "accuracy": str(n.accuracy)}
                for n in answer.nodes
            ],
            "models": dict(answer.models),
        },
    }
    if gang is not None:
        report["capacity"]["gang"] = {
            "nodeCount": gang.node_count,
            "label": gang.group_by_label or None,
        }
    return report


def _capacity_text(report: dict[str, Any]) -> str:
    capacity = report["capacity"]
    unit = "gangs" if "gang" in capacity else "copies"
    bound = "" if capacity["accuracy"] == "exact" else " at least (the count was cut short)"
    lines = [f"CAPACITY {capacity['total']} more {unit} of the claims fit{bound}"]
    rows = [("NODE", "COPIES")] + [(n["node"], str(n["count"])) for n in capacity["nodes"]]
    lines.extend(_table(rows))
    if capacity["models"]:
        lines.append("")
        lines.extend(_table([("MODEL", "COPIES")] + list(map(_pair, capacity["models"].items()))))
    return "\n".join(lines) + "\n"


def _pair(item: tuple[str, int]) -> tuple[str, str]:
    return item[0], str(item[1])


def _solve(
    inputs: _Inputs,
    node: str | None,
    policy: Policy,
    max_steps: int,
    gang: GangSpec | None = None,
) -> dict[str, Any]:
    snapshot, state, classes, pending = inputs.parts()
    if not pending:
        return _nothing_to_allocate(gang)
    if gang is not None:
        return _solve_gang(snapshot, state, classes, pending, policy, max_steps, gang)
    result = solve(
        snapshot,
        state,
        classes,
        pending,
        node=node,
        policy=policy,
        selectors=SelectorCache(),
        budget=SearchBudget(max_steps=max_steps),
        explain=True,
        topology_constraints=constraints_from_annotations(pending),
    )
    report: dict[str, Any] = {
        "outcome": "allocated" if isinstance(result, Allocated) else "unsatisfiable",
        "node": result.node if isinstance(result, Allocated) else None,
        "claims": [],
    }
    if isinstance(result, Allocated):
        report["score"] = score_to_dict(result.score)
        report["claims"] = [
            {"name": f"{c.namespace}/{c.name}", "allocation": allocation_result_to_dict(a)}
            for c, a in zip(pending, result.allocations, strict=True)
        ]
        report["allocations"] = list(result.allocations)  # for --emit claims (run_solve pops)
    else:
        report["budgetExhausted"] = result.budget_exhausted
    if result.explanation is not None:
        report["explanation"] = explanation_to_dict(result.explanation)
    report["stats"] = stats_to_dict(result.stats)
    return report


def _nothing_to_allocate(gang: GangSpec | None) -> dict[str, Any]:
    """Every claim has status.allocation: an empty result, as upstream's allocator answers."""
    report: dict[str, Any] = {"outcome": "allocated", "node": None, "claims": []}
    if gang is not None:
        report["gang"] = {"nodeCount": gang.node_count, "label": gang.group_by_label or None}
        report["gang"] |= {"domain": None, "members": []}
    report["allocations"] = []
    report["stats"] = stats_to_dict(Stats(0, 0, 0, 0, 0, 0, False))
    return report


def _solve_gang(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    pending: Sequence[ResourceClaim],
    policy: Policy,
    max_steps: int,
    gang: GangSpec,
) -> dict[str, Any]:
    """The gang's report: `gang.members` (one per node, claims in input order) or why not."""
    solver = PlacementSearch(SelectorCache(), policy=policy, max_steps=max_steps)
    query = Query(tuple(pending), gang=gang)
    result = solver.place(
        snapshot, state, classes, query, Deadline(None), explain=True, share_id=default_share_id
    )
    allocated = isinstance(result, Allocated)
    report: dict[str, Any] = {
        "outcome": "allocated" if allocated else "unsatisfiable",
        "node": None,
        "claims": [],
        "gang": {"nodeCount": gang.node_count, "label": gang.group_by_label or None},
    }
    if isinstance(result, Allocated):
        report["gang"]["domain"] = result.domain
        report["gang"]["members"] = [
            {
                "node": member.node,
                "score": score_to_dict(member.score) if member.score is not None else None,
                "claims": [
                    {"name": f"{c.namespace}/{c.name}", "allocation": allocation_result_to_dict(a)}
                    for c, a in zip(pending, member.allocations, strict=True)
                ],
            }
            for member in result.placements
        ]
    else:
        report["budgetExhausted"] = result.budget_exhausted
    explanation = result.explanation
    assert explanation is not None  # explained: the gang's domain and nodes, or why not
    report["explanation"] = explanation_to_dict(explanation)
    report["stats"] = stats_to_dict(result.stats)
    return report


def explanation_to_dict(explanation: Explanation) -> dict[str, Any]:
    """The explanation as JSON-ready data: the readable lines plus the structured parts."""
    data: dict[str, Any] = {
        "summary": summary_text(explanation.summary),
        "lines": list(explanation.lines()),
    }
    if explanation.choice is not None:
        choice = explanation.choice
        data["choice"] = {
            "node": choice.node,
            "policy": choice.policy,
            "feasibleNodes": choice.feasible_nodes,
            "score": str(choice.score),
            "runnerUp": choice.runner_up,
        }
    data["nodes"] = [
        {"node": m.node, "placed": m.placed, "needed": m.needed, "message": m.message()}
        for m in explanation.nodes
    ]
    data["requests"] = [
        {
            "claim": r.claim,
            "request": r.request,
            "considered": r.considered,
            "rejections": [
                {
                    "reason": str(g.code),
                    "detail": detail_text(g),
                    "count": g.count,
                    "examples": list(g.examples),
                }
                for g in r.rejections
            ],
        }
        for r in explanation.requests
    ]
    data["constraints"] = [
        {
            "claim": c.claim,
            "index": c.index,
            "kind": c.kind,
            "attribute": c.attribute,
            "message": c.message(),
        }
        for c in explanation.constraints
    ]
    data["budgetExhausted"] = explanation.budget_exhausted
    return data


def score_to_dict(score: Score) -> dict[str, Any]:
    """What the placement leaves free and how its devices are wired (docs/placement.md)."""
    return {
        "freeDevices": score.free_devices,
        "totalDevices": score.total_devices,
        "freeCapacity": round(float(score.free_capacity), 4),
        "subrequestRanks": list(score.ranks),
        "preferredMissed": score.preferred_missed,
        "nvlinkPreferencesMissed": score.implicit_missed,
        "nvlinks": score.nvlink_links,
        "numaNodes": score.numa_nodes,
        "fragmentation": round(float(score.fragmentation), 4),
    }


def stats_to_dict(stats: Stats) -> dict[str, Any]:
    return {
        "steps": stats.steps,
        "celEvaluations": stats.cel_evaluations,
        "nodesTotal": stats.nodes_total,
        "nodesPruned": stats.nodes_pruned,
        "nodesSearched": stats.nodes_searched,
        "nodesFeasible": stats.nodes_feasible,
    }


def _text(report: dict[str, Any]) -> str:
    lines: list[str] = []
    gang_members = report.get("gang", {}).get("members")
    if report["outcome"] == "allocated" and not report["claims"] and not gang_members:
        lines.append("ALLOCATED nothing: every ResourceClaim has status.allocation already")
    elif report["outcome"] == "allocated" and "gang" in report:
        lines.extend(_gang_text(report["gang"]))
    elif report["outcome"] == "allocated":
        lines.append(f"ALLOCATED on node {report['node']}")
        score = report["score"]
        wiring = f", {score['nvlinks']} NVLinks, {score['numaNodes']} NUMA nodes"
        lines.append(
            f"free after placement: {score['freeDevices']} of {score['totalDevices']} devices, "
            f"{score['freeCapacity']:g} GPU-equivalents" + (wiring if score["numaNodes"] else "")
        )
        results = [
            (claim["name"], result)
            for claim in report["claims"]
            for result in claim["allocation"]["devices"]["results"]
        ]
        binding = any("bindingConditions" in result for _, result in results)
        rows = [("CLAIM", "REQUEST", "DRIVER", "POOL", "DEVICE", "BINDING")[: 6 if binding else 5]]
        for name, result in results:
            row = (name, result["request"], result["driver"], result["pool"], result["device"])
            rows.append(row + (_binding_text(result),) if binding else row)
        lines.extend(_table(rows))
    else:
        lines.append(
            "UNSATISFIABLE"
            + (" (search budget exhausted)" if report.get("budgetExhausted") else "")
        )
    explanation = report.get("explanation")
    if explanation:
        lines.append("")
        lines.extend(explanation["lines"])
    stats = report["stats"]
    lines.append("")
    lines.append(
        f"{stats['nodesSearched']} nodes searched, {stats['steps']} steps, "
        f"{stats['celEvaluations']} CEL evaluations"
    )
    return "\n".join(lines) + "\n"


def _binding_text(result: dict[str, Any]) -> str:
    """A result's binding conditions: `-` when none, else `until A,B unless F`."""
    conditions = result.get("bindingConditions", [])
    if not conditions:
        return "-"
    failures = result.get("bindingFailureConditions", [])
    return f"until {','.join(conditions)}" + (f" unless {','.join(failures)}" if failures else "")


def _gang_text(gang: dict[str, Any]) -> list[str]:
    where = f" in {gang['label']}={gang['domain']}" if gang["label"] else ""
    lines = [f"ALLOCATED gang of {gang['nodeCount']} nodes{where}"]
    rows = [("NODE", "CLAIM", "REQUEST", "DRIVER", "POOL", "DEVICE")]
    for member in gang["members"]:
        for claim in member["claims"]:
            for result in claim["allocation"]["devices"]["results"]:
                rows.append(
                    (
                        member["node"],
                        claim["name"],
                        result["request"],
                        result["driver"],
                        result["pool"],
                        result["device"],
                    )
                )
    return [*lines, *_table(rows)]


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
