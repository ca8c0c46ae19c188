"""`--validate strict|ignore` on solve, inventory and apply, as kubectl's: a field the 1.34 API
lacks (here one a newer Kubernetes might add) is refused by default, skipped with `ignore`;
apply's case against a real inventory server on port 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli import build_parser
from services.inventory.bootstrap import build_inventory

ROOT = Path(__file__).resolve().parents[2]
CLASSES = str(ROOT / "examples" / "deviceclasses.yaml")
CLAIM = str(ROOT / "examples" / "claims" / "all-l40s.yaml")
UNKNOWN = 'unknown field "spec.devices[0].futureField"'


def newer_slice(tmp_path: Path) -> str:
    text = (ROOT / "examples" / "cluster" / "l40s-node.yaml").read_text()
    marker = "  - name: gpu-0\n"
    assert marker in text
    path = tmp_path / "from-a-newer-cluster.yaml"
    path.write_text(text.replace(marker, marker + "    futureField: {enabled: true}\n", 1))
    return str(path)


def gpualloc(*argv: str) -> int:
    args = build_parser(only=argv[0]).parse_args(list(argv))
    code: int = args.func(args)
    return code


@pytest.fixture
def inventory_address(grpc_channel_factory):
    app = build_inventory()
    yield grpc_channel_factory([app.registration]).target
    app.service.close()


COMMANDS = {
    "solve": lambda path, address: ("solve", "-f", path, "-f", CLASSES, "-f", CLAIM),
    "inventory": lambda path, address: ("inventory", "-f", path, "-o", "yaml"),
    "apply": lambda path, address: ("apply", "-f", path, "--inventory", address),
}


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
@pytest.mark.parametrize(
    ("flags", "code"),
    [
        pytest.param((), 2, id="strict-by-default"),
        pytest.param(("--validate", "strict"), 2, id="strict"),
        pytest.param(("--validate", "ignore"), 0, id="ignore"),
    ],
)
def test_unknown_fields_are_refused_unless_ignored(
    tmp_path, capsys, inventory_address, command, flags, code
):
    argv = (*command(newer_slice(tmp_path), inventory_address), *flags)

    assert gpualloc(*argv) == code

    out, err = capsys.readouterr()
    if code:
        assert UNKNOWN in err and "from-a-newer-cluster.yaml:" in err
        assert out == ""
    else:
        assert out and UNKNOWN not in err
