"""`gpualloc inventory`: merge inventory inputs offline, no server, and print the result.

    gpualloc inventory -f examples/cluster
    gpualloc inventory -f smi.xml -f topo.txt --node gpu-node-1 -o text
    gpualloc inventory -f slices.yaml -f agent-report.json -o yaml > merged.yaml
    gpualloc solve -f merged.yaml -f examples/deviceclasses.yaml -f claim.yaml

Inputs (any mix, recognised by content): ResourceSlices and Nodes (YAML/JSON, as kubectl prints
them), `nvidia-smi -q -x` XML, `nvidia-smi topo -m` text, `gpualloc-agent --stdout` JSON.
`--node` names the node of XML and topology inputs. The merge is the inventory service's own:
NVML facts join DRA devices by UUID, else PCI bus id; health becomes taints; GPUs no slice covers
become devices of the pool `<node>-nvml`.

Outputs: `-o yaml` and `-o json` print Kubernetes objects, a `v1 List` of the Nodes and the
ResourceSlices the inventory would publish (health taints merged in, the `<node>-nvml` slices
included): what the allocator sees, which `gpualloc solve -f` and `gpualloc apply -f` read back.
`-o view` (the default) is the inventory's own JSON view with topology, pools and device
sources (cli/view_json.py); `-o text` a table per node. Exit codes: 0 printed, 2 invalid input
(stderr names the file, line or field).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from services.common.config import read_document_limits
from services.common.dra.limits import DocumentLimits
from services.common.errors import GpuallocError, InvalidArgument
from services.common.manifests import add_validate_flag
from services.inventory.cli.inputs import Inputs, read_inputs
from services.inventory.cli.view_json import inventory_objects, inventory_text, inventory_to_json
from services.inventory.core.state import InventoryState, apply, record_report

__all__ = ["EXIT_INVALID", "build_state", "register", "run_inventory"]

EXIT_INVALID = 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inventory",
        help="merge ResourceSlices, Nodes and NVML reports offline and print the inventory",
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
    add_validate_flag(parser)
    parser.add_argument(
        "-o",
        "--output",
        choices=("view", "json", "yaml", "text"),
        default="view",
        help="view: the inventory's JSON view (default); json, yaml: Nodes and ResourceSlices "
        "as Kubernetes objects, for solve/apply -f; text: a table",
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        limits = read_document_limits(os.environ)  # GPUALLOC_MAX_DOCUMENT_*
    except InvalidArgument as error:
        print(f"gpualloc inventory: {error}", file=sys.stderr)
        return EXIT_INVALID
    strict = args.validate == "strict"
    return run_inventory(args.filename, args.node, args.output, limits=limits, strict=strict)


def build_state(inputs: Inputs) -> InventoryState:
    """The inventory the service would hold after applying `inputs`: slices and Nodes in one
    generation, then one generation per report (reports count as observed now: no staleness)."""
    state, _ = apply(InventoryState(), inputs.slices, inputs.nodes)
    for report in inputs.reports:
        state, _ = record_report(state, report, observed_at=0.0)
    return state


def run_inventory(
    paths: Sequence[str],
    node: str | None = None,
    output: str = "json",
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    limits: DocumentLimits | None = None,
    strict: bool = True,
) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        state = build_state(read_inputs(paths, node, stdin, limits=limits, strict=strict))
    except GpuallocError as error:
        print(f"gpualloc inventory: {error}", file=err)
        return EXIT_INVALID
    if output == "text":
        out.write(inventory_text(state))
    elif output == "yaml":
        yaml.safe_dump(inventory_objects(state), out, sort_keys=False)
    else:
        data = inventory_objects(state) if output == "json" else inventory_to_json(state)
        json.dump(data, out, indent=2)
        out.write("\n")
    return 0
