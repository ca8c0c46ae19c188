"""`gpualloc apply`: send ResourceSlices, Nodes and node reports to a running inventory.

    gpualloc apply -f examples/cluster
    kubectl get resourceslices -o yaml | gpualloc apply -f -
    gpualloc apply -f smi.xml -f topo.txt --node gpu-node-1 --inventory 10.0.0.5:50051
    gpualloc apply -f slices.yaml --dry-run

Like `kubectl apply`: every input is read and checked locally first; then all slices and Nodes
go in ONE ApplyResourceSlices call (atomic: all or nothing), then each report in a ReportNode
call. A `topo -m` matrix with no report beside it hangs on the GPUs of its node's slices (given,
or asked from the inventory), and is sent as that node's report. Prints
`resourceslice/<name> configured|unchanged`, `node/<name> configured|unchanged` and
`nodereport/<node> configured|unchanged` lines. The inventory address is `--inventory`, else
$GPUALLOC_INVENTORY_ADDR, else 127.0.0.1:50051 (where `gpualloc serve` runs both services).
TLS, mutual TLS and a bearer token: `--tls-ca --tls-cert --tls-key --tls-server-name
--token-file` (defaults GPUALLOC_CLIENT_TLS_CA / _CERT / _KEY / _SERVER_NAME and
GPUALLOC_CLIENT_TOKEN_FILE).
Exit codes: 0 applied, 2 invalid input (locally or INVALID_ARGUMENT from the server, with the
field path), 1 the inventory cannot be reached or failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import grpc

from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.client.calls import open_channel
from services.client.cli_flags import add_client_flags, client_settings
from services.client.config import TlsConfig
from services.common.config import read_document_limits
from services.common.dra.limits import DocumentLimits
from services.common.dra.model import ResourceSlice
from services.common.dra.serialize import node_to_dict
from services.common.errors import GpuallocError, InvalidArgument, ResourceExhausted
from services.common.grpc_errors import error_from_rpc
from services.common.manifests import add_validate_flag
from services.common.pb.dra_mapping import to_pb_resource_slice
from services.inventory.adapters.grpc.mapping import slices_from_pb_node
from services.inventory.adapters.grpc.report_pb import to_pb_node_report
from services.inventory.cli.inputs import Inputs, SliceLookup, read_inputs
from services.inventory.core.view import NVML_POOL_SUFFIX

__all__ = ["DEFAULT_ADDRESS", "ENV_ADDRESS", "register", "run_apply"]

DEFAULT_ADDRESS = "127.0.0.1:50051"
ENV_ADDRESS = "GPUALLOC_INVENTORY_ADDR"
EXIT_FAILED = 1
EXIT_INVALID = 2
_TIMEOUT_S = 30.0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "apply",
        help="apply ResourceSlices, Nodes and node reports to a running inventory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="file, directory or - (stdin); repeatable",
    )
    parser.add_argument("--node", help="the node of nvidia-smi XML / topo inputs")
    parser.add_argument(
        "--inventory",
        metavar="ADDR",
        help=f"host:port (env {ENV_ADDRESS}, default {DEFAULT_ADDRESS})",
    )
    parser.add_argument("--dry-run", action="store_true", help="validate on the server only")
    add_validate_flag(parser)
    add_client_flags(parser)
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    address = args.inventory or os.environ.get(ENV_ADDRESS) or DEFAULT_ADDRESS
    try:
        settings = client_settings(args, os.environ)
        limits = read_document_limits(os.environ)  # GPUALLOC_MAX_DOCUMENT_*
    except InvalidArgument as error:
        print(f"gpualloc apply: {error}", file=sys.stderr)
        return EXIT_INVALID
    return run_apply(
        args.filename,
        address,
        node=args.node,
        dry_run=args.dry_run,
        tls=settings.tls,
        token_file=settings.token_file,
        limits=limits,
        strict=args.validate == "strict",
    )


def run_apply(
    paths: Sequence[str],
    address: str,
    *,
    node: str | None = None,
    dry_run: bool = False,
    tls: TlsConfig | None = None,
    token_file: Path | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    limits: DocumentLimits | None = None,
    strict: bool = True,
) -> int:
    """Apply the inputs to the inventory at `address` (TLS and a bearer token as in
    services/client: `tls`, `token_file`); returns the exit code."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    with open_channel(address, tls, token_file=token_file) as channel:
        stub = inventory_pb2_grpc.InventoryStub(channel)
        try:
            lookup = _slices_on_server(stub)
            inputs = read_inputs(paths, node, stdin, lookup=lookup, limits=limits, strict=strict)
            _send(stub, inputs, dry_run, out, err)
        except GpuallocError as error:
            print(f"gpualloc apply: {error}", file=err)
            return EXIT_INVALID
        except grpc.RpcError as rpc_error:
            return _report_failure(rpc_error, address, err)
    return 0


def _slices_on_server(stub: inventory_pb2_grpc.InventoryStub) -> SliceLookup:
    """The ResourceSlices the inventory holds for a node (for a `topo -m` without a report);
    the inventory's own `<node>-nvml` slices are left out."""

    def lookup(node: str) -> list[ResourceSlice]:
        request = inventory_pb2.GetInventoryRequest(node_name=node, include_slices=True)
        try:
            found = stub.GetInventory(request, timeout=_TIMEOUT_S).inventory.nodes
        except grpc.RpcError as error:
            if isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.NOT_FOUND:
                return []  # a node the inventory does not hold: no slices
            raise
        slices = [s for message in found for s in slices_from_pb_node(message)]
        return [s for s in slices if s.pool.name != node + NVML_POOL_SUFFIX]

    return lookup


def _report_failure(rpc_error: grpc.RpcError, address: str, err: TextIO) -> int:
    failure = error_from_rpc(rpc_error)
    if isinstance(failure, InvalidArgument | ResourceExhausted):
        print(f"gpualloc apply: rejected by the inventory: {failure}", file=err)
        return EXIT_INVALID
    code = rpc_error.code() if isinstance(rpc_error, grpc.Call) else grpc.StatusCode.UNKNOWN
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        print(f"gpualloc apply: cannot reach the inventory at {address}: {failure}", file=err)
    else:
        print(f"gpualloc apply: inventory at {address} failed: {code.name}: {failure}", file=err)
    return EXIT_FAILED


def _send(
    stub: inventory_pb2_grpc.InventoryStub,
    inputs: Inputs,
    dry_run: bool,
    out: TextIO,
    err: TextIO,
) -> None:
    suffix = " (dry run)" if dry_run else ""
    if inputs.slices or inputs.nodes:
        manifest = ""
        if inputs.nodes:
            items = [node_to_dict(n) for n in inputs.nodes]
            manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        response = stub.ApplyResourceSlices(
            inventory_pb2.ApplyResourceSlicesRequest(
                slices=[to_pb_resource_slice(s) for s in inputs.slices],
                manifest=manifest,
                dry_run=dry_run,
            ),
            timeout=_TIMEOUT_S,
        )
        same = set(response.unchanged_nodes)  # empty from a server that predates the field
        for node in inputs.nodes:
            done = "unchanged" if node.name in same else "configured"
            print(f"node/{node.name} {done}{suffix}", file=out)
        outcome = {n: "configured" for n in response.applied}
        outcome |= {n: "unchanged" for n in response.unchanged}
        for s in inputs.slices:
            print(f"resourceslice/{s.name} {outcome.get(s.name, 'configured')}{suffix}", file=out)
        for warning in response.warnings:
            print(f"Warning: {warning}", file=err)
    for report in inputs.reports:
        if dry_run:
            print(f"nodereport/{report.node} not sent (dry run: ReportNode has none)", file=out)
            continue
        answer = stub.ReportNode(
            inventory_pb2.ReportNodeRequest(report=to_pb_node_report(report)), timeout=_TIMEOUT_S
        )
        done = "unchanged" if answer.unchanged else "configured"  # False from an older server
        print(
            f"nodereport/{report.node} {done} (generation {answer.generation}: "
            f"{len(answer.matched_devices)} matched, {len(answer.synthesized_devices)} "
            f"synthesized, {len(answer.taints)} tainted)",
            file=out,
        )
        for warning in answer.warnings:
            print(f"Warning: {warning}", file=err)
