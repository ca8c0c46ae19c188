"""A real Kubernetes control plane for tests: etcd, kube-apiserver and Kueue's manager.

The binaries are the Go peers `make peers` builds (tools/peers: kube-apiserver v1.34.4 from
k8s.io/kubernetes, etcd over go.etcd.io/etcd/server/v3/embed, Kueue v0.17.0's cmd/kueue and its
CRDs). Everything listens on free loopback ports (tests/ports.py) and lives in one directory:

- etcd: one member, plaintext on loopback;
- kube-apiserver: TLS with a certificate from the fixture's own CA (devcerts), a static bearer
  token for the tests (user `admin`, group `system:masters`), authorization AlwaysAllow, a
  service-account signing key of its own; `restart_apiserver()` stops it and starts it again on
  the same port and etcd (what a watch has to survive);
- Kueue: its CRDs applied, then the manager out of cluster (`--kubeconfig`), leader election
  off, the batch/v1 Job integration on, no webhooks registered with the apiserver (their server
  runs on the fixture's certificate, unused), so Jobs are created suspended, as Kueue's
  webhook would make them.

No kubelet, scheduler or controller-manager: pods never run. A Job Kueue admits is unsuspended
with the admission's node selector, which is what Kueue's users see.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from services.common.security.devcerts import CertificateAuthority, write_certificate
from tests.peers import peer
from tests.ports import free_port

TOKEN = "gpualloc-tests-admin-token"  # noqa: S105 - a throwaway static token of a test server
KUEUE_NAMESPACE = "kueue-system"
_START_S = 120.0


def _wait(
    what: str, ready: Callable[[], bool], process: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + _START_S
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            raise RuntimeError(f"{what} did not start (exit {process.poll()}):\n{tail}")
        time.sleep(0.25)


def _spawn(command: list[str], log: Path, **options: Any) -> subprocess.Popen[bytes]:
    """`command` with its output appended to `log` (the child keeps the file open)."""
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, **options)


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


@dataclass
class ControlPlane:
    directory: Path
    etcd_port: int = field(default_factory=free_port)
    apiserver_port: int = field(default_factory=free_port)
    _etcd: subprocess.Popen[bytes] | None = None
    _apiserver: subprocess.Popen[bytes] | None = None
    _kueue: subprocess.Popen[bytes] | None = None
    kueue_webhook_port: int = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def ca(self) -> Path:
        return self.directory / "pki" / "ca.crt"

    # --- setup -----------------------------------------------------------------------------

    def _write_files(self) -> None:
        pki = self.directory / "pki"
        authority = CertificateAuthority.create("gpualloc test control plane CA")
        authority.save(pki)
        names = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
        issued = authority.issue("kube-apiserver", dns_names=names, ip_addresses=("127.0.0.1",))
        write_certificate(pki / "apiserver", issued)
        webhook = authority.issue(
            "kueue-webhook", dns_names=("localhost",), ip_addresses=("127.0.0.1",)
        )
        write_certificate(pki / "kueue-webhook", webhook)
        key = ec.generate_private_key(ec.SECP256R1())  # signs service-account tokens
        (pki / "sa.key").write_bytes(
            key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        )
        (pki / "sa.pub").write_bytes(
            key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        )
        (self.directory / "tokens.csv").write_text(f'{TOKEN},admin,admin-uid,"system:masters"\n')
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.url, "certificate-authority": str(self.ca)}}],
            "users": [{"name": "admin", "user": {"token": TOKEN}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
            "current-context": "test",
        }  # fmt: skip
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig))

    def start(self) -> None:
        self._write_files()
        self._start_etcd()
        self.start_apiserver()

    def _start_etcd(self) -> None:
        log = self.directory / "etcd.log"
        url = f"http://127.0.0.1:{self.etcd_port}"
        self._etcd = _spawn(
            [str(peer("etcd")), "--data-dir", str(self.directory / "etcd"),
             "--listen-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{free_port()}"],
            log,
        )  # fmt: skip
        _wait("etcd", lambda: "etcd ready" in log.read_text(errors="replace"), self._etcd, log)

    def start_apiserver(self) -> None:
        pki = self.directory / "pki"
        log = self.directory / "kube-apiserver.log"
        self._apiserver = _spawn(
            [str(peer("kube-apiserver")),
             "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
             "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
             "--secure-port", str(self.apiserver_port),
             "--tls-cert-file", str(pki / "apiserver" / "tls.crt"),
             "--tls-private-key-file", str(pki / "apiserver" / "tls.key"),
             "--client-ca-file", str(self.ca),
             "--token-auth-file", str(self.directory / "tokens.csv"),
             "--authorization-mode", "AlwaysAllow",
             "--service-account-issuer", "https://kubernetes.default.svc",
             "--service-account-key-file", str(pki / "sa.pub"),
             "--service-account-signing-key-file", str(pki / "sa.key"),
             "--service-cluster-ip-range", "10.96.0.0/24",
             "--cert-dir", str(self.directory / "apiserver-certs"),
             "--enable-priority-and-fairness=false",
             "--disable-admission-plugins", "ServiceAccount",
             "--profiling=false", "-v", "1"],
            log,
        )  # fmt: skip
        _wait("kube-apiserver", self._ready, self._apiserver, log)

    def _ready(self) -> bool:
        import ssl
        import urllib.request

        context = ssl.create_default_context(cafile=str(self.ca))
        request = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        try:
            with urllib.request.urlopen(request, context=context, timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def stop_apiserver(self) -> None:
        _stop(self._apiserver)
        self._apiserver = None

    def restart_apiserver(self) -> None:
        self.stop_apiserver()
        self.start_apiserver()

    # --- clients ---------------------------------------------------------------------------

    def api_client(self) -> Any:
        import kubernetes

        configuration = kubernetes.client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = str(self.ca)
        configuration.api_key = {"authorization": f"Bearer {TOKEN}"}
        return kubernetes.client.ApiClient(configuration)

    def apply_files(self, paths: list[Path]) -> None:
        """Create (or replace) the objects of YAML files, as `kubectl apply` would."""
        for path in paths:
            for document in yaml.safe_load_all(path.read_text()):
                if document:
                    self.apply(document)

    def apply(self, document: dict[str, Any]) -> None:
        """One object, server-side applied by the dynamic client (plain JSON, no client model)."""
        import kubernetes

        client = kubernetes.dynamic.DynamicClient(self.api_client())  # type: ignore[no-untyped-call]
        api = client.resources.get(api_version=document["apiVersion"], kind=document["kind"])
        client.server_side_apply(  # type: ignore[no-untyped-call]
            api,
            body=document,
            namespace=document["metadata"].get("namespace"),
            field_manager="gpualloc-tests",
            force_conflicts=True,
        )

    # --- Kueue ------------------------------------------------------------------------------

    def install_kueue(self) -> None:
        """Kueue's CRDs (from the module's config/components/crd/bases) and its namespace."""
        import kubernetes

        crds = [_v1beta2_stored(path, self.directory / "crds") for path in
                sorted(peer("kueue-crds").glob("*.yaml"))]  # fmt: skip
        self.apply_files(crds)
        extensions = kubernetes.client.ApiextensionsV1Api(self.api_client())
        deadline = time.monotonic() + 60
        for path in crds:
            name = yaml.safe_load(path.read_text())["metadata"]["name"]
            while True:
                status = extensions.read_custom_resource_definition(name).status
                conditions = status.conditions if status else None
                if any(c.type == "Established" and c.status == "True" for c in conditions or []):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"CRD {name} not Established")
                time.sleep(0.2)
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}})

    def start_kueue(self) -> None:
        pki = self.directory / "pki" / "kueue-webhook"
        config: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta1",
            "kind": "Configuration",
            "namespace": KUEUE_NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": free_port(), "certDir": str(pki)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False,
            "integrations": {"frameworks": ["batch/job"]},
        }
        self.kueue_webhook_port = config["webhook"]["port"]
        path = self.directory / "kueue-config.yaml"
        path.write_text(yaml.safe_dump(config))
        log = self.directory / "kueue.log"
        kueue = [str(peer("kueue")), "--config", str(path), "--kubeconfig", str(self.kubeconfig),
                 "--feature-gates", "VisibilityOnDemand=false"]  # fmt: skip
        self._kueue = _spawn(
            _with_metrics_certificate(pki, kueue),
            log,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
        )  # fmt: skip
        health = f"http://{config['health']['healthProbeBindAddress']}/readyz"
        _wait("kueue", lambda: _http_ok(health), self._kueue, log)

    def register_kueue_validation(self) -> None:
        """Kueue's validating webhooks for ClusterQueues, ResourceFlavors and Cohorts, served
        by the running manager (its paths, https://127.0.0.1:<port>, the fixture's CA), as
        Kueue's manifests register them: the apiserver then refuses what Kueue refuses. The
        mutating ones (finalizers, Jobs suspended) stay unregistered."""
        import base64

        bundle = base64.b64encode(self.ca.read_bytes()).decode()
        hooks = []
        for kind in ("clusterqueue", "resourceflavor", "cohort"):
            url = (
                f"https://127.0.0.1:{self.kueue_webhook_port}"
                f"/validate-kueue-x-k8s-io-v1beta2-{kind}"
            )
            hooks.append({
                "name": f"v{kind}.kb.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "clientConfig": {"url": url, "caBundle": bundle},
                "rules": [{"apiGroups": ["kueue.x-k8s.io"], "apiVersions": ["v1beta2"],
                           "operations": ["CREATE", "UPDATE"], "resources": [f"{kind}s"]}],
            })  # fmt: skip
        self.apply({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "kueue-validating-webhook-configuration"},
            "webhooks": hooks,
        })  # fmt: skip

    def stop_kueue(self) -> None:
        _stop(self._kueue)
        self._kueue = None

    def log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        self.stop_kueue()
        self.stop_apiserver()
        _stop(self._etcd)


METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


def _with_metrics_certificate(certificate: Path, command: list[str]) -> list[str]:
    """`command` in a mount namespace of its own where Kueue's hard-coded metrics certificate
    directory (/etc/kueue/metrics/certs: a Secret volume in its Deployment; without internal
    cert management it exits when the files are missing) is the fixture's certificate, bind
    mounted: nothing is written under /etc but the empty mount point. Needs root, as the
    rest of the suite (slurmctld) does."""
    METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
    script = 'mount --bind "$0" "$1" && shift && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
            str(certificate), str(METRICS_CERT_DIR), *command]  # fmt: skip


def _v1beta2_stored(path: Path, into: Path) -> Path:
    """Kueue's CRD with v1beta2 as the storage version. The bases store v1beta1 and rely on a
    conversion webhook that Kueue's kustomization adds (and its cert manager injects); Kueue
    controllers (v0.15 on) and the sidecar both use v1beta2, so storing that needs no conversion."""
    crd = yaml.safe_load(path.read_text())
    names = [v["name"] for v in crd["spec"]["versions"]]
    if "v1beta2" in names:
        for version in crd["spec"]["versions"]:
            version["storage"] = version["name"] == "v1beta2"
    into.mkdir(parents=True, exist_ok=True)
    out = into / path.name
    out.write_text(yaml.safe_dump(crd))
    return out


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def control_plane_in(directory: Path, *, kueue: bool = False) -> Iterator[ControlPlane]:
    plane = ControlPlane(directory)
    try:
        plane.start()
        if kueue:
            plane.install_kueue()
            plane.start_kueue()
        yield plane
    except RuntimeError as error:
        pytest.fail(str(error), pytrace=False)
    finally:
        plane.close()
