"""`gpualloc get|describe|allocate|explain|capacity|commit|renew|release|config`: the live
service from a shell, shaped like kubectl.

    gpualloc get nodes [-o wide|json|yaml|name] [-l topology.kubernetes.io/zone=zone-a]
    gpualloc get devices [--node NAME] [--state free] ;  gpualloc get reservations [--owner O]
    gpualloc describe node h100-node-1 ;  gpualloc describe reservation res-...
    gpualloc allocate -f claim.yaml [--reserve --lease 2m] [--node N] [--policy P]
    gpualloc allocate -f jobs.yaml [--reserve]   (a List of claims: each on its own, one batch)
    gpualloc explain -f claim.yaml ;  gpualloc capacity -f claim.yaml
    gpualloc commit|renew|release RESERVATION-ID
    gpualloc config view|get-contexts|use-context NAME|set-context NAME --server ADDR ...

Where and as whom (every verb): a flag (`--server`, `--inventory`, `--as` for the owner,
`--tls-*`, `--token-file`), else the variable (GPUALLOC_ALLOCATOR_ADDR, GPUALLOC_INVENTORY_ADDR,
GPUALLOC_CLIENT_OWNER, GPUALLOC_CLIENT_TLS_*, GPUALLOC_CLIENT_TOKEN_FILE), else the context
(`--context`, else the config's current-context; services/client/contexts.py), else
127.0.0.1:50051 in plaintext as `cli/$USER`.

Exit codes: 0 done (allocate/explain: it fits), 3 it does not fit (the explanation is printed),
2 invalid input or flags, 4 not found (a node, reservation or context), 1 the server cannot be
reached, refused or failed.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import getpass
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from services.client.cli_flags import add_client_flags, client_environ
from services.client.client import AllocateItem, AllocatorClient, Policy
from services.client.config import ClientSettings
from services.client.contexts import (
    CONTEXT_KEYS,
    config_path,
    context_environ,
    load_config,
    save_config,
)
from services.client.errors import connection_hint
from services.client.fleet import FleetNode, Gpu, Use, fleet_view
from services.client.inventory import InventoryClient, NodeInventory
from services.client.live_output import (
    as_list,
    capacity_to_dict,
    change_to_dict,
    cohort_quota_to_dict,
    device_to_dict,
    expiry,
    fleet_node_to_dict,
    label_text,
    node_headers,
    node_row,
    placement_to_dict,
    reservation_ids,
    reservation_to_dict,
    table,
    tenant_quota_to_dict,
    write_structured,
)
from services.client.results import (
    CohortQuota,
    Placement,
    Reservation,
    ReservationChange,
    ReservationState,
)
from services.client.selectors import parse_selector
from services.common.config import env_duration, read_document_limits
from services.common.dra.model import DeviceClass, ResourceClaim
from services.common.dra.parse import read_documents, read_stdin, read_text
from services.common.errors import (
    GpuallocError,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from services.common.manifests import expand_paths, load_located_manifests

__all__ = [
    "EXIT_FAILED",
    "EXIT_INVALID",
    "EXIT_NOT_FOUND",
    "EXIT_UNSATISFIABLE",
    "GET_RESOURCES",
    "register_allocate",
    "register_capacity",
    "register_commit",
    "register_config",
    "register_describe",
    "register_explain",
    "register_get",
    "register_release",
    "register_renew",
]

EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_UNSATISFIABLE = 3
EXIT_NOT_FOUND = 4
OWNER_VARIABLE = "GPUALLOC_CLIENT_OWNER"


# --- where and as whom --------------------------------------------------------------------


@dataclass(frozen=True)
class Session:
    """The resolved connection of one command (flags > variables > context > defaults)."""

    settings: ClientSettings
    owner: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Session:
        environ = dict(os.environ)
        config = load_config(config_path(environ))
        merged = client_environ(args, context_environ(environ, args.context, config))
        for flag, variable in (
            ("server", "GPUALLOC_ALLOCATOR_ADDR"),
            ("inventory", "GPUALLOC_INVENTORY_ADDR"),
            ("owner", OWNER_VARIABLE),
        ):
            if getattr(args, flag, None):
                merged[variable] = getattr(args, flag)
        owner = merged.get(OWNER_VARIABLE, "").strip() or f"cli/{_user()}"
        return cls(ClientSettings.from_env(merged), owner)

    def _dial(self) -> dict[str, Any]:
        s = self.settings
        return {
            "tls": s.tls,
            "token_file": s.token_file,
            "deadline_seconds": s.deadline_seconds,
            "retry": s.retry,
        }

    @contextmanager
    def allocator(self) -> Iterator[AllocatorClient]:
        with AllocatorClient(self.settings.target, owner=self.owner, **self._dial()) as client:
            yield client

    @contextmanager
    def inventory(self) -> Iterator[InventoryClient]:
        with InventoryClient(self.settings.inventory, **self._dial()) as client:
            yield client


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def _connection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("where and as whom")
    group.add_argument("-s", "--server", metavar="ADDR", help="allocator host:port")
    group.add_argument(
        "--inventory", metavar="ADDR", help="inventory host:port (default: --server)"
    )
    group.add_argument("--context", metavar="NAME", help="the context of the config file to use")
    group.add_argument(
        "--as", dest="owner", metavar="OWNER", help=f"the owner to act as (env {OWNER_VARIABLE})"
    )
    add_client_flags(parser)


def _parser(subparsers: Any, name: str, text: str, **kwargs: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=text,
        description=f"{text}.\n\n{__doc__}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kwargs,
    )
    return parser


Verb = Callable[[argparse.Namespace, Session, TextIO], int]


def _run(verb: str, body: Verb) -> Callable[[argparse.Namespace], int]:
    """The verb with the one error policy: a message naming the kind of error, an exit code."""

    def main(args: argparse.Namespace) -> int:
        session = None
        try:
            session = Session.from_args(args)
            return body(args, session, sys.stdout)
        except InvalidArgument as error:
            return _fail(verb, "invalid", error, EXIT_INVALID)
        except NotFound as error:
            return _fail(verb, "NotFound", error, EXIT_NOT_FOUND)
        except Unavailable as error:
            if session is None:
                return _fail(verb, "cannot reach gpualloc", error, EXIT_FAILED)
            hint = connection_hint(str(error), session.settings.tls)
            kind = f"cannot reach gpualloc at {session.settings.target}"
            return _fail(verb, kind, error, EXIT_FAILED, hint)
        except GpuallocError as error:
            return _fail(verb, type(error).__name__, error, EXIT_FAILED)

    return main


def _fail(verb: str, kind: str, error: GpuallocError, code: int, hint: str = "") -> int:
    """One line: `gpualloc VERB: KIND: message` (`; hint` when there is one)."""
    print(f"gpualloc {verb}: {kind}: {error}{f'; {hint}' if hint else ''}", file=sys.stderr)
    return code


def _bare(name: str, kind: str) -> str:
    """`reservation/ID` (what `-o name` prints, as kubectl takes `kind/name`) or a bare ID."""
    return name.removeprefix(f"{kind}/")


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


# --- get ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GetResource:
    """One kind `gpualloc get` lists: its names (plural first) and how it is fetched/printed."""

    aliases: tuple[str, ...]
    run: Verb


def _outputs(
    args: argparse.Namespace,
    items: list[dict[str, Any]],
    names: list[str],
    headers: Sequence[str],
    rows: list[Sequence[object]],
    out: TextIO,
) -> None:
    if args.output in ("json", "yaml"):
        write_structured(as_list(items), args.output, out)
    elif args.output == "name":
        out.write("".join(f"{n}\n" for n in names))
    elif rows:
        out.write(table(headers, rows))
    else:
        print("No resources found.", file=sys.stderr)


def _fleet(session: Session, names: Sequence[str], topology: bool = False) -> list[FleetNode]:
    """The named nodes (all when none is named) with their holders. One name asks the
    services for that node only; the whole list is read only to suggest a name."""
    only = _bare(names[0], "node") if len(names) == 1 else ""
    with session.inventory() as inventory:
        nodes = _nodes_named(inventory, only, topology) if only else []
        if not any(n.name == only for n in nodes):
            nodes = inventory.nodes(topology=topology and not only)
    with session.allocator() as allocator:
        reservations = allocator.list(node_name=only)
    return fleet_view(_named(nodes, names), reservations)


def _nodes_named(inventory: InventoryClient, name: str, topology: bool) -> list[NodeInventory]:
    try:
        return inventory.nodes(name, topology=topology)
    except NotFound:  # an inventory that answers NOT_FOUND for an unknown node
        return []


def _named(nodes: list[NodeInventory], names: Sequence[str]) -> list[NodeInventory]:
    if not names:
        return nodes
    by_name = {n.name: n for n in nodes}
    names = [_bare(name, "node") for name in names]
    for name in names:
        if name not in by_name:
            raise NotFound(f'node "{name}" not found{_did_you_mean(name, list(by_name))}')
    return [by_name[name] for name in names]


def _get_nodes(args: argparse.Namespace, session: Session, out: TextIO) -> int:
    selector = parse_selector(args.selector or "")
    nodes = [n for n in _fleet(session, args.names) if selector(n.labels)]
    wide = args.output == "wide"
    headers = node_headers(wide=wide)
    if args.show_labels:
        headers.append("LABELS")
    rows: list[Sequence[object]] = []
    for node in nodes:
        row = node_row(node, wide=wide)
        if args.show_labels:
            row.append(label_text(node.labels))
        rows.append(row)
    items = [fleet_node_to_dict(n) for n in nodes]
    _outputs(args, items, [f"node/{n.name}" for n in nodes], headers, rows, out)
    return 0


def _get_devices(args: argparse.Namespace, session: Session, out: TextIO) -> int:
    selector = parse_selector(args.selector or "")
    nodes = [n for n in _fleet(session, args.names or ([args.node] if args.node else []))]
    devices = [
        d
        for n in nodes
        if selector(n.labels)
        for d in n.devices
        if args.state is None or d.use.value == args.state
    ]
    headers = ["NODE", "DEVICE", "TYPE", "MODEL", "MEMORY", "STATE", "HOLDER", "EXPIRES"]
    if args.output == "wide":
        headers += ["DRIVER", "POOL", "UUID", "RESERVATION"]
    rows: list[Sequence[object]] = []
    for d in devices:
        holder = d.holder.owner or d.holder.tenant if d.holder is not None else ""
        expires = expiry(d.holder.expires_at) if d.holder is not None else ""  # never: committed
        row: list[object] = [
            d.node,
            d.id.device,
            d.type,
            d.model,
            d.memory,
            d.use.value,
            holder,
            expires,
        ]
        if args.output == "wide":
            row += [d.id.driver, d.id.pool, d.device.uuid or "", d.holder.id if d.holder else ""]
        rows.append(row)
    names = [f"device/{d.node}/{d.id.device}" for d in devices]
    _outputs(args, [device_to_dict(d) for d in devices], names, headers, rows, out)
    return 0


def _get_reservations(args: argparse.Namespace, session: Session, out: TextIO) -> int:
    selector = parse_selector(args.selector or "")
    state = {"reserved": ReservationState.RESERVED, "committed": ReservationState.COMMITTED}
    with session.allocator() as allocator:
        changes = None
        if args.watch is not None:  # open before the list, so that no change falls between
            if args.names or args.selector or args.state:
                raise InvalidArgument.at(
                    "--watch", "watches by --owner and --node only, not by name, -l or --state"
                )
            changes = allocator.watch(
                owner=args.filter_owner or "",
                node_name=args.node or "",
                seconds=_duration("--watch", args.watch) if args.watch else None,
            )
        if args.names:
            found = [allocator.get(_bare(name, "reservation")) for name in args.names]
        else:
            found = allocator.list(
                owner=args.filter_owner or "",
                node_name=args.node or "",
                state=state.get(args.state or ""),
            )
        reservations = [r for r in found if selector(r.labels)]
        headers = ["ID", "OWNER", "NODE", "STATE", "DEVICES", "EXPIRES"]
        if args.output == "wide":
            headers += ["FENCING", "CREATED", "LABELS"]
        rows: list[Sequence[object]] = []
        for r in reservations:
            row: list[object] = [
                r.id,
                r.owner or f"tenant {r.tenant}",
                r.node_name,
                r.state.value,
                _devices_text(r),
                expiry(r.expires_at),
            ]
            if args.output == "wide":
                created = r.created_at.isoformat(timespec="seconds") if r.created_at else ""
                row += [r.fencing_token, created, label_text(r.labels)]
            rows.append(row)
        items = [reservation_to_dict(r) for r in reservations]
        if changes is not None and args.output == "json":  # a stream: one object a line
            for item in items:
                write_structured(item, "json", out, compact=True)
            if not items:
                print("No resources found.", file=sys.stderr)
        else:
            names = [f"reservation/{r.id}" for r in reservations]
            _outputs(args, items, names, headers, rows, out)
        if changes is not None:
            out.flush()
            _print_changes(args, changes, out)
    return 0


def _print_changes(
    args: argparse.Namespace, changes: Iterator[ReservationChange], out: TextIO
) -> None:
    """One line per change as it comes (heartbeats are not shown): CHANGE ID OWNER NODE and,
    for a preemption, who took it; with -o json one compact camelCase object per line
    (live_output.change_to_dict), with -o yaml a YAML document each."""
    for change in changes:
        if change.kind == "heartbeat":
            continue
        if args.output in ("json", "yaml"):
            if args.output == "yaml":
                out.write("---\n")
            write_structured(change_to_dict(change), args.output, out, compact=True)
        else:
            line = [change.kind.upper(), change.reservation_id, change.owner, change.node_name]
            if change.preempted_by:
                line.append(f"preempted by {change.preempted_by}")
            out.write("  ".join(p for p in line if p) + "\n")
        out.flush()


def _devices_text(reservation: Reservation, shown: int = 3) -> str:
    names = [d.device for d in reservation.devices]
    more = f" +{len(names) - shown}" if len(names) > shown else ""
    return ",".join(names[:shown]) + more


def _get_quotas(args: argparse.Namespace, session: Session, out: TextIO) -> int:
    """Two tables, as `kubectl get` prints two kinds: the tenants' rows (COHORT is the path
    from the root cohort down to the tenant's own), then the cohorts above them, each named
    by its path so that the tree reads top down."""
    with session.allocator() as allocator:
        found = allocator.quota_status(args.names)
    quotas, cohorts = found.tenants, found.cohorts
    decay = any(q.decayed_usage for q in quotas)
    wide = args.output == "wide"
    headers = ["TENANT", "RESOURCE", "COHORT", "NOMINAL", "USED", "BORROWED", "LENT", "LEFT"]
    headers += ["SHARE"] if found.fair_sharing or wide else []
    headers += ["DECAYED"] if decay else []
    headers += ["PENDING"]
    if wide:
        headers += ["BORROWING-LIMIT", "LENDING-LIMIT", "WEIGHT"]
        headers += ["DECAYED-USAGE"] if decay else []
    rows: list[Sequence[object]] = []
    for q in quotas:
        row: list[object] = [
            q.tenant,
            q.resource,
            "/".join(q.cohort_path) or "-",
            q.nominal,
            q.used,
            q.borrowed,
            q.lent,
            q.left,
        ]
        row += [_share_text(q.weighted_share)] if found.fair_sharing or wide else []
        row += [q.decayed_used or "0"] if decay else []
        row += [q.pending_preemptions]
        if wide:
            row += [q.borrowing_limit or "-", q.lending_limit or "-", q.fair_sharing_weight]
            row += [q.decayed_usage or "-"] if decay else []
        rows.append(row)
    if args.output in ("json", "yaml", "name"):
        items = [tenant_quota_to_dict(q) for q in quotas]
        items += [cohort_quota_to_dict(c) for c in cohorts]
        names = [f"quota/{q.tenant}/{q.resource}" for q in quotas]
        names += [f"cohortquota/{c.cohort}/{c.resource}" for c in cohorts]
        _outputs(args, items, names, headers, rows, out)
        return 0
    _outputs(args, [], [], headers, rows, out)
    if cohorts:
        out.write("\n" + table(*_cohort_table(cohorts, found.fair_sharing, wide)))
    return 0


def _cohort_table(
    cohorts: Sequence[CohortQuota], fair_sharing: bool, wide: bool
) -> tuple[list[str], list[Sequence[object]]]:
    headers = ["COHORT", "RESOURCE", "NOMINAL", "SUBTREE", "USED", "BORROWED", "LENT", "LEFT"]
    headers += ["SHARE"] if fair_sharing or wide else []
    if wide:
        headers += ["BORROWING-LIMIT", "LENDING-LIMIT", "WEIGHT"]
    rows: list[Sequence[object]] = []
    for c in sorted(cohorts, key=lambda c: (*c.cohort_path, c.cohort)):
        row: list[object] = ["/".join((*c.cohort_path, c.cohort)), c.resource, c.nominal]
        row += [c.subtree_quota, c.used, c.borrowed, c.lent, c.left]
        row += [_share_text(c.weighted_share)] if fair_sharing or wide else []
        if wide:
            row += [c.borrowing_limit or "-", c.lending_limit or "-", c.fair_sharing_weight]
        rows.append(row)
    return headers, rows


def _share_text(share: int) -> str:
    """Kueue's weightedShare; its largest int64 (a weight of 0 while borrowing) as `inf`."""
    return "inf" if share >= 2**63 - 1 else str(share)


GET_RESOURCES: dict[str, GetResource] = {
    "nodes": GetResource(("nodes", "node", "no"), _get_nodes),
    "devices": GetResource(("devices", "device", "dev"), _get_devices),
    "reservations": GetResource(("reservations", "reservation", "res"), _get_reservations),
    "quotas": GetResource(("quotas", "quota"), _get_quotas),  # QuotaStatus: docs/tenancy.md
}


def _resource(name: str) -> GetResource:
    return next(r for r in GET_RESOURCES.values() if name in r.aliases)


def register_get(subparsers: Any) -> None:
    parser = _parser(
        subparsers, "get", "list nodes, devices, reservations or quotas of a running service"
    )
    kinds = [alias for resource in GET_RESOURCES.values() for alias in resource.aliases]
    parser.add_argument(
        "resource", metavar="RESOURCE", choices=kinds, help=f"one of {', '.join(GET_RESOURCES)}"
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="only these (by name or id)")
    parser.add_argument(
        "-o", "--output", choices=("wide", "json", "yaml", "name"), help="output format"
    )
    parser.add_argument(
        "-l",
        "--selector",
        metavar="SELECTOR",
        help="label selector (k=v, k!=v, k in (a,b), k, !k): node labels for nodes and devices, "
        "reservation labels for reservations",
    )
    parser.add_argument("--node", help="devices or reservations of this node")
    parser.add_argument(
        "--state",
        choices=[u.value for u in Use],
        help="devices in this state; reservations: reserved or committed",
    )
    parser.add_argument("--owner", dest="filter_owner", metavar="OWNER", help="reservations of")
    parser.add_argument(
        "-w",
        "--watch",
        nargs="?",
        const="",
        metavar="DURATION",
        help="reservations: then print each change as it comes (WatchReservations), for "
        "DURATION (e.g. 5m) or until interrupted",
    )
    parser.add_argument("--show-labels", action="store_true", help="nodes: a LABELS column")
    _connection_flags(parser)
    parser.set_defaults(func=_run("get", _get))


def _get(args: argparse.Namespace, session: Session, out: TextIO) -> int:
    resource = _resource(args.resource)
    if args.watch is not None and resource.run is not _get_reservations:
        raise InvalidArgument.at("--watch", "only reservations can be watched")
    return resource.run(args, session, out)


# --- describe -----------------------------------------------------------------------------


def _gpu_state(gpu: Gpu) -> str:
    """A GPU without a whole-GPU device (MIG only): free, tainted or in use."""
    return "free" if gpu.free else "tainted" if gpu.tainted else "in use"


def _gpus_free(node: FleetNode) -> str:
    """`3 free`, and `, 1 tainted` when a GPU nothing holds is tainted (never counted free)."""
    tainted = sum(1 for g in node.gpus if g.tainted)
    free = f"{sum(1 for g in node.gpus if g.free)} free"
    return f"{free}, {tainted} tainted" if tainted else free


def _describe_node(name: str, session: Session, out: TextIO) -> None:
    (node,) = _fleet(session, [_bare(name, "node")], topology=True)
    inventory = node.inventory
    lines = [f"Name:          {node.name}"]
    labels = [f"{k}={v}" for k, v in sorted(node.labels.items())] or ["<none>"]
    lines += [f"{'Labels:' if i == 0 else '':<15}{label}" for i, label in enumerate(labels)]
    lines.append(f"Models:        {', '.join(node.models) or '<none>'}")
    lines.append(
        f"GPUs:          {len(node.gpus)} ({_gpus_free(node)}); devices: "
        + ", ".join(f"{node.count(u)} {u.value}" for u in Use if node.count(u))
    )
    out.write("\n".join(lines) + "\n")
    topology = {g.uuid: g for g in inventory.gpus}
    out.write("Devices:\n")
    rows = []
    for d in node.devices:
        if d.type == "mig":
            continue  # drawn GPU by GPU under "MIG layout"
        where = topology.get(d.device.gpu_uuid)
        pcie = str(d.device.attribute("resource.kubernetes.io/pcieRoot") or "")
        rows.append(
            [
                d.id.device,
                d.type,
                d.model,
                d.memory,
                pcie or (where.pcie_root if where else ""),
                "" if where is None or where.numa_node is None else where.numa_node,
                d.use.value,
                _holder_text(d.holder),
            ]
        )
    headers = ["DEVICE", "TYPE", "MODEL", "MEMORY", "PCIE-ROOT", "NUMA", "STATE", "HOLDER"]
    out.write(_indent(table(headers, rows)))
    partitioned = [g for g in node.gpus if g.slices]
    if partitioned:
        out.write("MIG layout:\n")
        for gpu in partitioned:
            whole = gpu.whole
            state = whole.use.value if whole is not None else _gpu_state(gpu)
            name_ = whole.id.device if whole is not None else gpu.uuid
            out.write(f"  {name_} ({gpu.uuid}): whole GPU {state}\n")
            rows = [
                [
                    s.id.device,
                    s.device.attribute("profile") or "",
                    s.memory,
                    s.use.value,
                    _holder_text(s.holder),
                ]
                for s in gpu.slices
            ]
            out.write(
                _indent(_indent(table(["SLICE", "PROFILE", "MEMORY", "STATE", "HOLDER"], rows)))
            )
    if inventory.counter_sets:
        out.write("Counters:\n")
        for counters in inventory.counter_sets:
            values = ", ".join(f"{k}={v}" for k, v in counters.counters.items())
            out.write(f"  {counters.pool}/{counters.name}: {values}\n")
    if inventory.nvlinks:
        out.write("Topology (NVLink links between GPUs):\n")
        out.write(_indent(_nvlink_matrix(inventory)))
    out.write("Holders:\n")
    if not node.reservations:
        out.write("  <none>\n")
    else:
        rows = [
            [
                r.id,
                r.owner or f"tenant {r.tenant}",
                r.state.value,
                len(r.devices),
                _devices_text(r, 8),
                expiry(r.expires_at),
            ]
            for r in node.reservations
        ]
        headers = ["RESERVATION", "OWNER", "STATE", "COUNT", "DEVICES", "EXPIRES"]
        out.write(_indent(table(headers, rows)))


def _nvlink_matrix(inventory: NodeInventory) -> str:
    """`nvidia-smi topo -m`'s shape: NV<links> where two GPUs are linked, X on the diagonal."""
    gpus = sorted(inventory.gpus, key=lambda g: g.device.device if g.device else g.uuid)
    names = [g.device.device if g.device else g.uuid for g in gpus]

    def cell(a: str, b: str) -> str:
        links = inventory.nvlink_count(a, b)
        return "X" if a == b else (f"NV{links}" if links else "-")

    rows = [[n, *(cell(a.uuid, b.uuid) for b in gpus)] for n, a in zip(names, gpus, strict=True)]
    return table(["", *names], rows)


def _holder_text(holder: Reservation | None) -> str:
    if holder is None:
        return ""
    who = holder.owner or f"tenant {holder.tenant}"
    until = "" if holder.state is ReservationState.COMMITTED else f", {expiry(holder.expires_at)}"
    return f"{who} ({holder.id}{until})" if holder.id else who


def _indent(text: str) -> str:
    return "".join(f"  {line}\n" for line in text.splitlines())


def _describe_reservation(reservation_id: str, session: Session, out: TextIO) -> None:
    with session.allocator() as allocator:
        r = allocator.get(_bare(reservation_id, "reservation"))
    fields = [
        ("ID", r.id),
        ("Owner", r.owner or f"tenant {r.tenant}"),
        ("Node", r.node_name),
        ("State", r.state.value),
        ("Expires", _when(r.expires_at, relative=True) if r.expires_at else "never"),
        ("Fencing token", r.fencing_token),
        ("Idempotency key", r.idempotency_key),
        ("Created", _when(r.created_at)),
        ("Committed", _when(r.committed_at)),
        ("Labels", label_text(r.labels)),
    ]
    out.write("".join(f"{k + ':':<17}{v if str(v) else '<none>'}\n" for k, v in fields))
    out.write("Claims:\n")
    rows = [
        [
            f"{a.namespace}/{a.name}" if a.namespace else a.name,
            x.request,
            x.driver,
            x.pool,
            x.device,
        ]
        for a in r.allocations
        for x in a.allocation.results
    ]
    if rows:
        out.write(_indent(table(["CLAIM", "REQUEST", "DRIVER", "POOL", "DEVICE"], rows)))
    else:
        out.write("".join(f"  {d}\n" for d in r.devices) or "  <none>\n")


def _when(value: datetime | None, *, relative: bool = False) -> str:
    if value is None:
        return ""
    text = value.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return f"{text} ({expiry(value)})" if relative else text


_DESCRIBE: dict[tuple[str, ...], Callable[[str, Session, TextIO], None]] = {
    ("node", "nodes", "no"): _describe_node,
    ("reservation", "reservations", "res"): _describe_reservation,
}


def _describe(args: argparse.Namespace, session: Session, out: TextIO) -> int:
    describe = next((f for names, f in _DESCRIBE.items() if args.kind in names), None)
    if describe is None:
        raise InvalidArgument.at("KIND", f"cannot describe {args.kind!r} (node, reservation)")
    for index, name in enumerate(args.names):
        if index:
            out.write("\n")
        describe(name, session, out)
    return 0


def register_describe(subparsers: Any) -> None:
    parser = _parser(
        subparsers,
        "describe",
        "show a node (devices, MIG layout, topology, holders) or a reservation in detail",
    )
    parser.add_argument(
        "kind",
        metavar="KIND",
        choices=["node", "reservation", "nodes", "no", "reservations", "res"],
        help="node or reservation",
    )
    parser.add_argument("names", nargs="+", metavar="NAME")
    _connection_flags(parser)
    parser.set_defaults(func=_run("describe", _describe))


# --- allocate, explain, capacity ----------------------------------------------------------


_POLICY_NAMES = [p.value for p in Policy]


def _claims(args: argparse.Namespace) -> tuple[list[ResourceClaim], list[DeviceClass]]:
    """The unallocated ResourceClaims of the -f files, and any DeviceClasses beside them."""
    claims, classes, _ = _listed_claims(args)
    return claims, classes


def _listed_claims(
    args: argparse.Namespace,
) -> tuple[list[ResourceClaim], list[DeviceClass], bool]:
    """`_claims`, and whether a List (one document) holds several of the claims: a list of
    jobs, as kubectl reads a List as its items each on their own."""
    located = load_located_manifests(args.filename, None, read_document_limits(os.environ))
    classes = [o for o, _ in located if isinstance(o, DeviceClass)]
    claims = [(o, w) for o, w in located if isinstance(o, ResourceClaim) and o.allocation is None]
    if not claims:
        raise InvalidArgument.at("-f", "no ResourceClaim without status.allocation in the files")
    documents = collections.Counter((w.source, w.document) for _, w in claims)
    return [o for o, _ in claims], classes, any(count > 1 for count in documents.values())


def _where(args: argparse.Namespace, classes: list[DeviceClass]) -> dict[str, Any]:
    """What allocate, explain and capacity share: the node, the policy, the files' classes."""
    policy = Policy(args.policy) if args.policy else None
    return {"node_name": args.node, "policy": policy, "device_classes": classes}


def _query_flags(
    parser: argparse.ArgumentParser, outputs: Sequence[str] = ("text", "json", "yaml")
) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="ResourceClaims (and DeviceClasses): file, directory or - (stdin); repeatable",
    )
    parser.add_argument("--node", default="", help="on this node only")
    parser.add_argument("--policy", choices=_POLICY_NAMES, help="node choice (server default)")
    parser.add_argument("-o", "--output", choices=outputs, default="text")


def _placement_text(placement: Placement, out: TextIO) -> None:
    if not placement.fits:
        out.write(placement.reason(max_lines=40) + "\n")
        return
    if placement.gang:
        out.write(f"ALLOCATED on {len(placement.gang)} nodes\n")
    else:
        out.write(f"ALLOCATED on node {placement.node_name}\n")
    members = placement.gang or ()
    allocations = [(placement.node_name, a) for a in placement.allocations]
    allocations += [(m.node_name, a) for m in members for a in m.allocations]
    rows = [
        [node, f"{a.namespace}/{a.name}" if a.namespace else a.name, x.request, x.pool, x.device]
        for node, a in allocations
        for x in a.allocation.results
    ]
    out.write(table(["NODE", "CLAIM", "REQUEST", "POOL", "DEVICE"], rows))
    out.write("".join(f"flavor: {flavor}\n" for flavor in placement.flavors))
    for r in placement.reservations:
        until = f"until {_when(r.expires_at, relative=True)}" if r.expires_at else "committed"
        out.write(
            f"reservation/{r.id} {r.state.value.lower()} for {r.owner} {until}, "
            f"fencing token {r.fencing_token}\n"
        )


def _allocate(args: argparse.Namespace, session: Session, out: TextIO) -> int:
    if args.lease and not args.reserve:
        raise InvalidArgument.at("--lease", "needs --reserve")
    lease = _duration("--lease", args.lease) if args.lease else None
    labels = dict(_label(item) for item in args.label or [])
    if args.each and args.together:
        raise InvalidArgument.at("--each", "either --each or --together, not both")
    claims, classes, listed = _listed_claims(args)
    if args.each or (listed and not args.together):
        return _allocate_each(args, session, out, claims, classes, lease, labels)
    with session.allocator() as allocator:
        placement = allocator.allocate(
            claims,
            **_where(args, classes),
            explain=True,
            reserve=args.reserve,
            lease_ttl_seconds=lease,
            idempotency_key=args.idempotency_key or "",
            labels=labels,
        )
    return _answer(placement, args.output, out)


def _allocate_each(
    args: argparse.Namespace,
    session: Session,
    out: TextIO,
    claims: Sequence[ResourceClaim],
    classes: list[DeviceClass],
    lease: float | None,
    labels: dict[str, str],
) -> int:
    """A List of claims (or `--each`): every claim of the files on its own, in file order, in
    one AllocateBatch call; each claim's answer or error. Exit 0 when every claim was
    allocated, 3 when one does not fit, 1 when one failed (its error is printed under its
    name)."""
    key = args.idempotency_key or ""
    items = [
        AllocateItem(
            [claim],
            **_where(args, classes),
            explain=True,
            reserve=args.reserve,
            lease_ttl_seconds=lease,
            idempotency_key=f"{key}-{index}" if key else "",
            labels=labels,
        )
        for index, claim in enumerate(claims)
    ]
    with session.allocator() as allocator:
        results = allocator.allocate_many(items)
    code = 0
    shown: list[dict[str, Any]] = []
    for claim, result in zip(claims, results, strict=True):
        name = f"{claim.namespace}/{claim.name}" if claim.namespace else claim.name
        if isinstance(result, GpuallocError):
            code = EXIT_FAILED
            shown.append({"claim": name, "error": f"{type(result).__name__}: {result}"})
            if args.output == "text":
                out.write(f"claim {name}: {type(result).__name__}: {result}\n")
            continue
        if not result.fits:
            code = code or EXIT_UNSATISFIABLE
        shown.append({"claim": name, **placement_to_dict(result)})
        if args.output == "text":
            out.write(f"claim {name}: ")
            _placement_text(result, out)
    if args.output != "text":
        write_structured(shown, args.output, out)
    return code


def _answer(placement: Placement, output: str, out: TextIO) -> int:
    if output == "text":
        _placement_text(placement, out)
    elif output == "name":  # what was reserved, else where it fits; why not on stderr
        nodes = dict.fromkeys([placement.node_name, *(m.node_name for m in placement.gang)])
        names = [f"reservation/{r.id}" for r in placement.reservations]
        names = names or [f"node/{n}" for n in nodes if n]
        out.write("".join(f"{n}\n" for n in names))
        if not placement.fits:
            print(placement.reason(max_lines=40), file=sys.stderr)
    else:
        write_structured(placement_to_dict(placement), output, out)
    return 0 if placement.fits else EXIT_UNSATISFIABLE


def _duration(flag: str, text: str) -> float:
    return env_duration({flag: text}, flag, 0.0, minimum=0.001)


def _label(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise InvalidArgument.at("--label", f"KEY=VALUE, got {item!r}")
    return key, value


def register_allocate(subparsers: Any) -> None:
    parser = _parser(subparsers, "allocate", "place ResourceClaims now, optionally reserving them")
    _query_flags(parser, ("text", "json", "yaml", "name"))
    parser.add_argument("--reserve", action="store_true", help="hold the devices under a lease")
    parser.add_argument(
        "--lease", metavar="DURATION", help="with --reserve: e.g. 2m (server default)"
    )
    parser.add_argument("--idempotency-key", metavar="KEY", help="with --reserve: a retry's key")
    parser.add_argument("--label", action="append", metavar="K=V", help="reservation label")
    parser.add_argument(
        "--each",
        action="store_true",
        help="each claim on its own, in file order, in one AllocateBatch call (not together); "
        "the default for a List of several claims",
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="a List's claims together on one node (one pod's claims), as separate documents",
    )
    _connection_flags(parser)
    parser.set_defaults(func=_run("allocate", _allocate))


def _explain(args: argparse.Namespace, session: Session, out: TextIO) -> int:
    claims, classes = _claims(args)
    with session.allocator() as allocator:
        placement = allocator.explain(claims, **_where(args, classes), max_nodes=args.max_nodes)
    return _answer(placement, args.output, out)


def register_explain(subparsers: Any) -> None:
    parser = _parser(subparsers, "explain", "say why ResourceClaims fit or not, reserving nothing")
    _query_flags(parser)
    parser.add_argument("--max-nodes", type=int, default=0, help="closest nodes explained")
    _connection_flags(parser)
    parser.set_defaults(func=_run("explain", _explain))


def _capacity(args: argparse.Namespace, session: Session, out: TextIO) -> int:
    claims, classes = _claims(args)
    with session.allocator() as allocator:
        capacity = allocator.capacity(
            claims, **_where(args, classes), ignore_reservations=args.ignore_reservations
        )
    if args.output != "text":
        write_structured(capacity_to_dict(capacity), args.output, out)
        return 0
    bound = "" if capacity.exact else "at least "
    out.write(f"{bound}{capacity.total} more copies fit\n")
    out.write(table(["NODE", "COPIES"], sorted(capacity.nodes.items())))
    if capacity.models:
        out.write(table(["MODEL", "COPIES"], sorted(capacity.models.items())))
    return 0


def register_capacity(subparsers: Any) -> None:
    parser = _parser(subparsers, "capacity", "count how many more copies of ResourceClaims fit")
    _query_flags(parser)
    parser.add_argument(
        "--ignore-reservations", action="store_true", help="count on an empty fleet"
    )
    _connection_flags(parser)
    parser.set_defaults(func=_run("capacity", _capacity))


# --- commit, renew, release ---------------------------------------------------------------


def _reservation_ids(args: argparse.Namespace) -> list[str]:
    """The IDs given, then those of the -f files (`get reservations -o yaml` or `allocate
    --reserve -o yaml` read back, as `kubectl delete -f` reads `kubectl get -o yaml`)."""
    ids = [_bare(i, "reservation") for i in args.ids]
    limits = read_document_limits(os.environ)
    for path in expand_paths(args.filename or []):
        source = "<stdin>" if path == "-" else path
        text = read_stdin(sys.stdin, limits) if path == "-" else read_text(path, limits)
        for number, document in read_documents(text, source, limits):
            try:
                ids += reservation_ids(document, f"{source}: document {number}")
            except ValueError as error:
                raise InvalidArgument.at("-f", str(error)) from None
    if not ids:
        raise InvalidArgument.at("RESERVATION-ID", "give reservation ids or -f FILE")
    return ids


def _lifecycle(verb: str) -> Verb:
    def body(args: argparse.Namespace, session: Session, out: TextIO) -> int:
        ids = _reservation_ids(args)
        with session.allocator() as allocator:
            for reservation_id in ids:
                done: Reservation | None
                if verb == "commit":
                    done = allocator.commit(reservation_id, fencing_token=args.fencing_token)
                elif verb == "renew":
                    lease = _duration("--lease", args.lease) if args.lease else None
                    done = allocator.renew(
                        reservation_id, lease_ttl_seconds=lease, fencing_token=args.fencing_token
                    )
                else:
                    done = allocator.release(
                        reservation_id,
                        fencing_token=args.fencing_token,
                        allow_missing=args.ignore_not_found,
                    )
                _lifecycle_line(verb, reservation_id, done, out)
        return 0

    return body


def _lifecycle_line(verb: str, reservation_id: str, done: Reservation | None, out: TextIO) -> None:
    if done is None:
        out.write(f"reservation/{reservation_id} not found (ignored)\n")
    elif verb == "renew":
        out.write(f"reservation/{done.id} renewed (expires {expiry(done.expires_at)})\n")
    else:
        out.write(f"reservation/{done.id} {'committed' if verb == 'commit' else 'released'}\n")


def _register_lifecycle(subparsers: Any, verb: str, text: str) -> argparse.ArgumentParser:
    parser = _parser(subparsers, verb, text)
    parser.add_argument("ids", nargs="*", metavar="RESERVATION-ID")
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        metavar="FILE",
        help="reservations as `get reservations -o yaml` or `allocate --reserve -o yaml` print "
        "them (file, directory or -); repeatable",
    )
    parser.add_argument(
        "--fencing-token", type=int, default=0, help="refuse if the reservation moved on"
    )
    _connection_flags(parser)
    parser.set_defaults(func=_run(verb, _lifecycle(verb)))
    return parser


def register_commit(subparsers: Any) -> None:
    _register_lifecycle(subparsers, "commit", "make reservations permanent until released")


def register_renew(subparsers: Any) -> None:
    parser = _register_lifecycle(subparsers, "renew", "extend reservations' leases from now")
    parser.add_argument("--lease", metavar="DURATION", help="e.g. 2m (server default)")


def register_release(subparsers: Any) -> None:
    parser = _register_lifecycle(subparsers, "release", "free reservations' devices")
    parser.add_argument(
        "--ignore-not-found", action="store_true", help="a reservation already gone is fine"
    )


# --- config -------------------------------------------------------------------------------


def _config(args: argparse.Namespace, session: Session | None, out: TextIO) -> int:
    path = config_path(os.environ)
    config = load_config(path)
    if args.action == "view":
        write_structured(config.to_dict(), "yaml", out)
    elif args.action == "get-contexts":
        rows = [
            [
                "*" if name == config.current_context else "",
                name,
                values.get("server", ""),
                values.get("owner", ""),
            ]
            for name, values in sorted(config.contexts.items())
        ]
        out.write(table(["CURRENT", "NAME", "SERVER", "OWNER"], rows, empty=""))  # as kubectl
    elif args.action == "current-context":
        if not config.current_context:
            raise NotFound(f"no current-context in {path}")
        out.write(config.current_context + "\n")
    elif args.action == "use-context":
        config.context(_one(args))
        save_config(path, type(config)(_one(args), config.contexts))
        out.write(f'Switched to context "{_one(args)}".\n')
    else:  # set-context
        values = {key: getattr(args, key.replace("-", "_")) for key in CONTEXT_KEYS}
        save_config(path, config.with_context(_one(args), {k: v for k, v in values.items() if v}))
        out.write(f'Context "{_one(args)}" set in {path}.\n')
    return 0


def _one(args: argparse.Namespace) -> str:
    if not args.name:
        raise InvalidArgument.at("NAME", f"`gpualloc config {args.action}` needs a context name")
    return str(args.name)


def register_config(subparsers: Any) -> None:
    parser = _parser(subparsers, "config", "view and edit the client's contexts file")
    parser.add_argument(
        "action", choices=["view", "get-contexts", "current-context", "use-context", "set-context"]
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="the context")
    group = parser.add_argument_group("set-context keys")
    for key in CONTEXT_KEYS:
        group.add_argument(f"--{key}", dest=key.replace("-", "_"), metavar="VALUE")

    def main(args: argparse.Namespace) -> int:
        try:
            return _config(args, None, sys.stdout)
        except InvalidArgument as error:
            return _fail("config", "invalid", error, EXIT_INVALID)
        except NotFound as error:
            return _fail("config", "NotFound", error, EXIT_NOT_FOUND)

    parser.set_defaults(func=main)
