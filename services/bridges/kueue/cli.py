"""`gpualloc-kueue`: the Kueue AdmissionCheck controller (runs as a Deployment next to Kueue).

    gpualloc-kueue                       # watch and reconcile until SIGTERM
    gpualloc-kueue --once                # one pass, print what it did (debugging)

Settings: GPUALLOC_ALLOCATOR_ADDR / GPUALLOC_INVENTORY_ADDR (host:port), GPUALLOC_CLIENT_TLS_CA
(the servers' CA; any TLS variable turns TLS on), GPUALLOC_CLIENT_TLS_CERT + _KEY (mutual TLS),
GPUALLOC_CLIENT_TLS_SERVER_NAME, GPUALLOC_CLIENT_TOKEN_FILE (a bearer JWT such as a projected
service-account token, re-read when the kubelet rotates it; TLS only; the --tls-* and
--token-file flags override these), GPUALLOC_KUEUE_CONTROLLER_NAME (default
gpualloc.io/admission: the `spec.controllerName` of the AdmissionChecks it serves),
GPUALLOC_KUEUE_LEASE (how long devices stay reserved between Ready and admission, default 5m),
GPUALLOC_KUEUE_RESYNC (the longest pause between passes, default 10s),
GPUALLOC_KUEUE_PRIORITY_CLASS (the gpualloc priority class of the Workloads' reservations,
default the policy's default), GPUALLOC_KUEUE_PREEMPT (`true`: preempt as gpualloc's rules
allow when that is what makes a Workload fit; docs/tenancy.md) and GPUALLOC_KUEUE_TENANTS
(`binding`, the default: every Workload in the tenant the access policy binds this identity
to; `cluster-queue`: each Workload acting for the tenant named as its ClusterQueue, which the
policy's actForTenants must allow; --tenants overrides it), GPUALLOC_KUEUE_MIRROR_NAMESPACE
(with `cluster-queue`: the namespace where each grant a ClusterQueue's tenant gets outside
Kueue, a Slurm job's say, is mirrored as a Workload Kueue counts; mirror.py; default none).
Kubernetes access is
in-cluster (or ~/.kube/config) through the kubernetes Python client, which must be installed
(`pip install kubernetes`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TextIO

from services.bridges.kueue.controller import CONTROLLER_NAME, AdmissionController, TenantMode
from services.bridges.kueue.k8s_adapter import KubernetesKueueApi
from services.bridges.kueue.port import KueueApi
from services.bridges.placing import Placer
from services.client.cli_flags import add_client_flags, client_environ
from services.client.client import AllocatorClient
from services.client.config import ClientSettings
from services.client.inventory import InventoryClient
from services.common.config import env_bool, env_choice, env_duration, env_str
from services.common.console import console_main
from services.common.errors import GpuallocError

__all__ = ["main"]

log = logging.getLogger("gpualloc.kueue")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpualloc-kueue",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--once", action="store_true", help="run one pass and exit")
    parser.add_argument("--controller-name", help=f"default {CONTROLLER_NAME}")
    parser.add_argument(
        "--tenants",
        choices=[mode.value for mode in TenantMode],
        help="which tenant a Workload is charged to (GPUALLOC_KUEUE_TENANTS; default binding)",
    )
    add_client_flags(parser)
    return parser


def run(
    api: KueueApi,
    environ: Mapping[str, str],
    *,
    once: bool,
    controller_name: str | None = None,
    tenants: str | None = None,
    stop: threading.Event | None = None,
    out: TextIO | None = None,
) -> int:
    """The controller over `api` (the real cluster in main, a MemoryKueueApi in tests)."""
    settings = ClientSettings.from_env(environ)
    name = controller_name or env_str(environ, "GPUALLOC_KUEUE_CONTROLLER_NAME", CONTROLLER_NAME)
    lease = env_duration(environ, "GPUALLOC_KUEUE_LEASE", 300.0, minimum=1.0)
    resync = env_duration(environ, "GPUALLOC_KUEUE_RESYNC", 10.0, minimum=0.05)
    priority_class = env_str(environ, "GPUALLOC_KUEUE_PRIORITY_CLASS", "")
    preempt = env_bool(environ, "GPUALLOC_KUEUE_PREEMPT", False)
    modes = [mode.value for mode in TenantMode]
    mode = TenantMode(tenants or env_choice(environ, "GPUALLOC_KUEUE_TENANTS", "binding", modes))
    mirror_namespace = env_str(environ, "GPUALLOC_KUEUE_MIRROR_NAMESPACE", "")
    with (
        AllocatorClient(
            settings.target,
            tls=settings.tls,
            token_file=settings.token_file,
            deadline_seconds=settings.deadline_seconds,
            retry=settings.retry,
        ) as client,
        InventoryClient(
            settings.inventory,
            tls=settings.tls,
            token_file=settings.token_file,
            deadline_seconds=settings.deadline_seconds,
            retry=settings.retry,
        ) as inventory,
    ):
        controller = AdmissionController(
            api,
            Placer(client, inventory),
            controller_name=name,
            lease_ttl_seconds=lease,
            priority_class=priority_class,
            preempt=preempt,
            tenants=mode,
            mirror_namespace=mirror_namespace,
        )
        if once:
            for decision in controller.reconcile_all():
                state = decision.state.value if decision.state else "-"
                print(
                    f"{decision.workload}\t{decision.action}\t{state}\t{decision.message}", file=out
                )
            return 0
        controller.run(stop or threading.Event(), resync)
    return 0


@console_main
def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    env = client_environ(args, os.environ if environ is None else environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = threading.Event()
    try:
        api = KubernetesKueueApi()
        if not args.once:
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
        return run(
            api,
            env,
            once=args.once,
            controller_name=args.controller_name,
            tenants=args.tenants,
            stop=stop,
            out=sys.stdout,
        )
    except GpuallocError as error:
        print(f"gpualloc-kueue: {error}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
