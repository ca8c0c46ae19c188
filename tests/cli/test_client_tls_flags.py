"""Every client command over real mutual TLS with a bearer token: the flags reach the channel.

One shared definition (services/client/cli_flags.py) gives `gpualloc apply`, `gpualloc-agent`,
`gpualloc-slurm` and `gpualloc-kueue` the same `--tls-ca --tls-cert --tls-key
--tls-server-name --token-file` flags over the GPUALLOC_CLIENT_* variables. Each command runs
here against a real TLS server on port 0 that requires a client certificate (tests/tls_fixtures)
serving the real inventory where the command needs one; the assertions read what reached the
server: the client certificate's SPIFFE ID and the `authorization` metadata.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loadtest import bench_service
from loadtest.ghzlike import cli as load_cli
from services import cli as gpualloc_cli
from services.allocator import __main__ as allocator_main
from services.allocator.app.inventory_feed import InventoryUpdate
from services.allocator.config import AllocatorSettings
from services.bridges.kueue import cli as kueue_cli
from services.bridges.kueue.controller import AdmissionController, Decision
from services.bridges.kueue.memory_api import MemoryKueueApi
from services.bridges.slurm import cli as slurm_cli
from services.client.cli_flags import CLIENT_FLAGS, add_client_flags, client_environ
from services.inventory.bootstrap import InventoryApp, build_inventory
from services.inventory.cli import agent
from services.inventory.cli import apply as apply_cli
from tests.tls_fixtures import Pki, TlsServer

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "cluster"
A5000_XML = ROOT / "tests" / "data" / "nvidia-smi-xml" / "2x-rtx-a5000_drv590.44.01_telegraf.xml"
TOKEN = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ0ZXN0In0.c2ln"


# --- the shared flags ------------------------------------------------------------------------

FLAGS = [
    pytest.param(flag, dest, var, id=flag[2:]) for flag, (dest, var, _) in CLIENT_FLAGS.items()
]


@pytest.mark.parametrize(("flag", "dest", "variable"), FLAGS)
def test_a_flag_overrides_its_variable(flag: str, dest: str, variable: str) -> None:
    parser = argparse.ArgumentParser()
    add_client_flags(parser)
    environ = {variable: "from-env", "UNRELATED": "kept"}
    assert client_environ(parser.parse_args([flag, "from-flag"]), environ) == {
        variable: "from-flag",
        "UNRELATED": "kept",
    }
    assert client_environ(parser.parse_args([]), environ) == environ


def _apply_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    apply_cli.register(subparsers)
    command: argparse.ArgumentParser = subparsers.choices["apply"]
    return command


# command -> (its parser, the rest of a valid command line after the flag)
PARSERS: dict[str, tuple[Callable[[], argparse.ArgumentParser], list[str]]] = {
    "gpualloc-apply": (_apply_parser, ["-f", "slices.yaml"]),
    "gpualloc-agent": (agent.build_parser, ["--stdout"]),
    "gpualloc-slurm": (slurm_cli.build_parser, ["translate"]),
    "gpualloc-kueue": (kueue_cli.build_parser, ["--once"]),
}


@pytest.mark.parametrize("command", list(PARSERS))
@pytest.mark.parametrize(("flag", "dest", "variable"), FLAGS)
def test_every_client_command_has_every_flag(
    command: str, flag: str, dest: str, variable: str
) -> None:
    build, rest = PARSERS[command]
    parser = build()
    assert flag in parser.format_help()
    assert getattr(parser.parse_args([flag, "value", *rest]), dest) == "value"


# --- the commands against real mTLS ------------------------------------------------------------


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture
def inventory() -> Iterator[InventoryApp]:
    app = build_inventory()
    yield app
    app.service.close()


def tls_flags(pki: Pki, token: Path | None = None) -> list[str]:
    flags = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client.cert)]
    flags += ["--tls-key", str(pki.client.key)]
    return flags + (["--token-file", str(token)] if token else [])


def tls_env(pki: Pki, token: Path | None = None) -> dict[str, str]:
    env = {
        "GPUALLOC_CLIENT_TLS_CA": str(pki.ca),
        "GPUALLOC_CLIENT_TLS_CERT": str(pki.client.cert),
        "GPUALLOC_CLIENT_TLS_KEY": str(pki.client.key),
    }
    return env | ({"GPUALLOC_CLIENT_TOKEN_FILE": str(token)} if token else {})


def assert_authenticated(served: TlsServer, pki: Pki, method_suffix: str) -> None:
    calls = [c for c in served.calls if c.method.endswith(method_suffix)]
    assert calls, f"no {method_suffix} call reached the server: {served.calls}"
    for call in calls:
        assert call.peer_uris == (pki.client_uri,)
        assert call.authorization == f"Bearer {TOKEN}"


def test_apply_over_mtls_with_a_token(pki, tls_server, inventory, token, capsys) -> None:
    served: TlsServer = tls_server(pki, [inventory.registration])
    argv = ["apply", "-f", str(CLUSTER), "--inventory", served.target, *tls_flags(pki, token)]
    assert gpualloc_cli.main(argv) == 0
    assert "resourceslice/" in capsys.readouterr().out
    assert_authenticated(served, pki, "/ApplyResourceSlices")
    assert inventory.service.snapshot().slices


@pytest.mark.parametrize("how", ["flags", "env", "context"])
def test_live_verbs_over_mtls_with_a_token(
    pki, tls_server, inventory, token, capsys, monkeypatch, tmp_path, how
) -> None:
    """`gpualloc get nodes` dials both services with the certificate and the token, whether
    they come from flags, the variables or a context of the config file."""
    served: TlsServer = tls_server(pki, [inventory.registration])
    apply = ["apply", "-f", str(CLUSTER), "--inventory", served.target, *tls_flags(pki)]
    assert gpualloc_cli.main(apply) == 0
    capsys.readouterr()
    for name in [n for n in os.environ if n.startswith("GPUALLOC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = ["get", "nodes", "-o", "name"]
    if how == "flags":
        argv += ["-s", served.target, *tls_flags(pki, token)]
    elif how == "env":
        for name, value in {
            "GPUALLOC_ALLOCATOR_ADDR": served.target,
            **tls_env(pki, token),
        }.items():
            monkeypatch.setenv(name, value)
    else:
        context = {"server": served.target, "tls-ca": str(pki.ca), "tls-cert": str(pki.client.cert),
                   "tls-key": str(pki.client.key), "token-file": str(token)}  # fmt: skip
        config = {"current-context": "fleet", "contexts": [{"name": "fleet", "context": context}]}
        (tmp_path / "config.yaml").write_text(json.dumps(config))
        monkeypatch.setenv("GPUALLOC_CONFIG", str(tmp_path / "config.yaml"))
    assert gpualloc_cli.main(argv) == 0, capsys.readouterr().err
    assert "node/h100-node-1\n" in capsys.readouterr().out
    assert_authenticated(served, pki, "/GetInventory")
    assert_authenticated(served, pki, "/ListReservations")


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        pytest.param(["--token-file", "TOKEN"], 2, "over TLS only", id="token-without-tls"),
        pytest.param([], 1, "cannot reach the inventory", id="plaintext-to-a-tls-server"),
        pytest.param(["--tls-ca", "/nonexistent/ca.crt"], 2, "cannot read", id="missing-ca-file"),
    ],
)
def test_apply_refusals(pki, tls_server, token, capsys, extra, code, message) -> None:
    served: TlsServer = tls_server(pki)
    extra = [str(token) if e == "TOKEN" else e for e in extra]
    argv = ["apply", "-f", str(CLUSTER), "--inventory", served.target, *extra]
    assert gpualloc_cli.main(argv) == code
    assert message in capsys.readouterr().err


# what the caller offers -> what the one-line error must say (the flag and the variable)
MTLS_MISTAKES = {
    "plaintext-to-a-tls-server": ("", "may require TLS: set --tls-ca (GPUALLOC_CLIENT_TLS_CA)"),
    "no-client-certificate": ("ca", "require a client certificate: set --tls-cert and --tls-key"),
    "unknown-ca": ("other-ca", "not signed by the CA of --tls-ca (GPUALLOC_CLIENT_TLS_CA)"),
    "client-certificate-of-another-ca": (
        "other-client",
        "may not accept the client certificate of --tls-cert (GPUALLOC_CLIENT_TLS_CERT)",
    ),
    "wrong-server-name": ("wrong-name", "set --tls-server-name (GPUALLOC_CLIENT_TLS_SERVER_NAME)"),
}


@pytest.mark.parametrize(
    ("offered", "hint"), [pytest.param(*v, id=k) for k, v in MTLS_MISTAKES.items()]
)
def test_live_verbs_explain_mtls_failures(
    pki, tls_server, capsys, monkeypatch, tmp_path, offered, hint
) -> None:
    """A handshake the server refuses reads only `UNAVAILABLE: ... Socket closed` from
    grpc-core; the CLI says what probably went wrong and what to set, in one line."""
    served: TlsServer = tls_server(pki)
    other = Pki.create(tmp_path / "other")
    for name in [n for n in os.environ if n.startswith("GPUALLOC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GPUALLOC_CLIENT_DEADLINE", "2s")
    mine = ["--tls-cert", str(pki.client.cert), "--tls-key", str(pki.client.key)]
    flags = {
        "": [],
        "ca": ["--tls-ca", str(pki.ca)],
        "other-ca": ["--tls-ca", str(other.ca), *mine],
        "other-client": [
            "--tls-ca",
            str(pki.ca),
            "--tls-cert",
            str(other.client.cert),
            "--tls-key",
            str(other.client.key),
        ],  # fmt: skip
        "wrong-name": ["--tls-ca", str(pki.ca), *mine, "--tls-server-name", "elsewhere.test"],
    }[offered]
    assert gpualloc_cli.main(["get", "nodes", "-s", served.target, *flags]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and hint in err, err


def test_agent_pushes_over_mtls_flags_over_env_defaults(
    pki, tls_server, inventory, token, monkeypatch
) -> None:
    served: TlsServer = tls_server(pki, [inventory.registration])
    for name, value in tls_env(pki).items():  # certificates from the environment,
        monkeypatch.setenv(name, value)
    argv = ["--once", "--xml", str(A5000_XML), "--node", "gpu-node-1"]
    argv += ["--inventory", served.target, "--token-file", str(token)]  # the token by flag
    assert agent.main(argv) == 0
    assert_authenticated(served, pki, "/ReportNode")


@pytest.mark.parametrize("how", ["env", "flags"])
def test_slurm_bridge_reads_gres_conf_over_mtls(pki, tls_server, inventory, token, how) -> None:
    served: TlsServer = tls_server(pki, [inventory.registration])
    assert gpualloc_cli.main(["apply", "-f", str(CLUSTER), "--inventory", served.target,
                              *tls_flags(pki)]) == 0  # fmt: skip
    environ = {"GPUALLOC_ALLOCATOR_ADDR": served.target}
    argv = ["gres-conf", "--all"]
    if how == "env":
        environ |= tls_env(pki, token)
    else:
        argv = [*tls_flags(pki, token), *argv]
    out, err = io.StringIO(), io.StringIO()
    assert slurm_cli.main(argv, environ, out, err) == 0, err.getvalue()
    assert "Name=gpu" in out.getvalue()
    assert_authenticated(served, pki, "/GetInventory")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param({"GPUALLOC_CLIENT_TOKEN_FILE": "TOKEN"}, "over TLS only",
                     id="token-without-tls"),
        pytest.param({"GPUALLOC_CLIENT_TLS_CA": "CA", "GPUALLOC_CLIENT_TOKEN_FILE": "/absent"},
                     "cannot read /absent", id="missing-token-file"),
        pytest.param({"GPUALLOC_CLIENT_TLS_CA": "/absent.pem"}, "cannot read /absent.pem",
                     id="missing-ca-file"),
    ],
)  # fmt: skip
def test_slurm_bridge_bad_tls_settings_are_bad_input(pki, token, settings, message) -> None:
    err = io.StringIO()
    swap = {"TOKEN": str(token), "CA": str(pki.ca)}
    environ = {k: swap.get(v, v) for k, v in settings.items()}
    assert slurm_cli.main(["epilog", "--job-id", "1"], environ, io.StringIO(), err) == 2
    assert message in err.getvalue()


def test_kueue_bridge_dials_with_its_settings(pki, tls_server, token, monkeypatch) -> None:
    """The controller's clients get the token and certificates (a pass over an empty cluster
    calls nothing, so the pass here calls through the clients `run` built)."""
    served: TlsServer = tls_server(pki)
    environ = {"GPUALLOC_ALLOCATOR_ADDR": served.target, **tls_env(pki, token)}
    seen: list[object] = []

    class Calling(AdmissionController):
        def reconcile_all(self) -> list[Decision]:
            seen.append(self.placer.client.list())
            seen.append(self.placer.inventory.nodes())
            return []

    monkeypatch.setattr(kueue_cli, "AdmissionController", Calling)
    assert kueue_cli.run(MemoryKueueApi(), environ, once=True, out=io.StringIO()) == 0
    assert seen == [[], []]
    assert_authenticated(served, pki, "/ListReservations")
    assert_authenticated(served, pki, "/GetInventory")


def test_allocator_feed_follows_the_inventory_over_mtls(
    pki, tls_server, inventory, token, monkeypatch
) -> None:
    served: TlsServer = tls_server(pki, [inventory.registration])
    for name, value in tls_env(pki, token).items():
        monkeypatch.setenv(name, value)
    settings = AllocatorSettings(inventory_address=served.target)
    feed, client = allocator_main._feed(settings, [])
    first = threading.Event()
    updates: list[InventoryUpdate] = []

    def on_update(update: InventoryUpdate) -> None:
        updates.append(update)
        first.set()

    handle = feed.follow(on_update)
    try:
        assert first.wait(10), client.status() if client else None
    finally:
        handle.close()
    assert updates[0].reset
    assert_authenticated(served, pki, "/WatchInventory")


# --- the load runner and the bench client --------------------------------------------------------


def test_load_runner_over_mtls_with_token_metadata(pki, tls_server, tmp_path: Path) -> None:
    served: TlsServer = tls_server(pki)
    metadata = tmp_path / "token.json"
    metadata.write_text(json.dumps({"authorization": f"Bearer {TOKEN}"}))
    report = tmp_path / "report.json"
    config = tmp_path / "config.json"  # a plaintext config, as the shipped ones: flags win
    plaintext = {"call": "grpc.health.v1.Health/Check", "host": "unused:1", "insecure": True}
    config.write_text(json.dumps({**plaintext, "total": 6, "concurrency": 2, "data": {}}))
    argv = [
        served.target,
        "--config",
        str(config),
        "--no-progress",
        "-O",
        "json",
        "-o",
        str(report),
    ]
    argv += ["--cacert", str(pki.ca), "--cert", str(pki.client.cert), "--key", str(pki.client.key)]
    argv += ["-M", str(metadata)]
    assert load_cli.main(argv) == 0
    written = json.loads(report.read_text())
    assert written["count"] == 6 and not written.get("errorDistribution")
    assert written["options"]["metadata"] == {"authorization": "<redacted>"}
    assert written["options"]["insecure"] is False
    assert len([c for c in served.calls if c.method.endswith("/Check")]) >= 6
    assert_authenticated(served, pki, "/Check")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param(["--cacert", "OTHER_CA"], "cannot connect", id="server-from-another-ca"),
        pytest.param([], "cannot connect", id="no-client-certificate-for-mtls"),
        pytest.param(["--cacert", "/nonexistent.pem"], "cacert: cannot read", id="missing-ca"),
        pytest.param(["--skipTLS"], "--skipTLS: the ghz option is not supported", id="skip-tls"),
        pytest.param(["--cert", "CERT"], "cert: a client certificate (cert) and its key",
                     id="cert-without-key"),
    ],
)  # fmt: skip
def test_load_runner_refusals(pki, tls_server, tmp_path, capsys, extra, message) -> None:
    served: TlsServer = tls_server(pki)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"call": "grpc.health.v1.Health/Check", "host": served.target,
                                  "cacert": str(pki.ca), "connect-timeout": "1s", "total": 1,
                                  "concurrency": 1, "data": {}}))  # fmt: skip
    other = Pki.create(tmp_path / "other")
    swap = {"OTHER_CA": str(other.ca), "CERT": str(pki.client.cert)}
    argv = ["--config", str(config), "--no-progress", *[swap.get(e, e) for e in extra]]
    assert load_cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_bench_client_dials_with_tls_flags(pki, tls_server, token, tmp_path, capsys) -> None:
    served: TlsServer = tls_server(pki)
    nodes = tmp_path / "nodes.json"
    nodes.write_text("[]")
    argv = ["--client", served.target, "--phase", "health-check", "--seconds", "0.2"]
    argv += ["--threads", "1", "--nodes-file", str(nodes), *tls_flags(pki, token)]
    assert bench_service.client_main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["calls"] > 0 and result["errors"] == []
    assert_authenticated(served, pki, "/Check")


def test_process_environment_is_left_alone() -> None:
    """client_environ copies: a flag never leaks into os.environ (and so into children)."""
    parser = argparse.ArgumentParser()
    add_client_flags(parser)
    client_environ(parser.parse_args(["--tls-ca", "x"]), os.environ)
    assert os.environ.get("GPUALLOC_CLIENT_TLS_CA") != "x"
