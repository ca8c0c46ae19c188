"""A whole gpualloc in this process, on 127.0.0.1:<free port>: what `gpualloc serve --demo` runs.

The inventory is seeded with examples/cluster (two 8 x H100 NVLink nodes, an A100 node with
MIG partitions, an L40S node) and the `nvidia-smi topo -m` matrices of examples/nvml, so the
inventory knows the NVLink mesh the Slurm bridge writes into gres.conf. The allocator follows
the inventory in process (services.serve.InProcessFeed) with the embedded reservation store.
`make demo` and the bridges' end-to-end tests talk to it over real gRPC, exactly as they
would talk to a deployed allocator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import grpc

from services.allocator.bootstrap import AllocatorApp, build_allocator
from services.allocator.config import AllocatorSettings
from services.common.config import ServerSettings
from services.common.grpc_server import create_server
from services.common.health import Health
from services.inventory.bootstrap import InventoryApp, build_inventory, seed_inventory
from services.inventory.cli.inputs import read_inputs
from services.serve import InProcessFeed

__all__ = ["EXAMPLE_CLASSES", "EXAMPLE_CLUSTER", "EXAMPLE_TOPOLOGY", "LocalCluster", "start"]

_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CLUSTER = _ROOT / "examples" / "cluster"
EXAMPLE_TOPOLOGY = _ROOT / "examples" / "nvml"
EXAMPLE_CLASSES = _ROOT / "examples" / "deviceclasses.yaml"


@dataclass
class LocalCluster:
    """The running server; `target` is its address. Close it when done."""

    server: grpc.Server
    port: int
    inventory: InventoryApp
    allocator: AllocatorApp

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.stop(None).wait()
        self.allocator.close()
        self.inventory.close()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start(
    seed: Sequence[Path] = (EXAMPLE_CLUSTER,),
    topology: Sequence[Path] = (EXAMPLE_TOPOLOGY,),
    *,
    settings: AllocatorSettings | None = None,
    listen: str = "127.0.0.1:0",
    server: ServerSettings | None = None,
) -> LocalCluster:
    """Start inventory + allocator on one port, seeded and ready to answer; `server` sets TLS
    and the access policy (plaintext, development mode by default)."""
    server_settings = replace(server or ServerSettings(), listen_address=listen)
    allocator_settings = replace(
        settings or AllocatorSettings(expire_interval=0.2),
        server=server_settings,
        device_classes=(str(EXAMPLE_CLASSES),),
    )
    inventory = build_inventory()
    seed_inventory(inventory.service, [str(p) for p in seed])
    if topology:
        inputs = read_inputs([str(p) for p in (*seed, *topology)])
        for report in inputs.reports:
            inventory.service.report(report)
    allocator = build_allocator(allocator_settings, InProcessFeed(inventory.service), environ={})
    health = Health()
    grpc_server, port = create_server(
        listen,
        [inventory.registration, allocator.registration],
        server_settings,
        health=health,
        interceptors=allocator.interceptors(),
    )
    allocator.attach_health(health)
    grpc_server.start()
    if not allocator.wait_ready(10.0):
        grpc_server.stop(None)
        allocator.close()
        inventory.close()
        raise RuntimeError("the local allocator did not become ready within 10 s")
    return LocalCluster(grpc_server, port, inventory, allocator)
