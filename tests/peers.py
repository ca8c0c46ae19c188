"""The Go peers the tests run for real: kube-apiserver, etcd, Kueue's manager (and its CRDs),
ghz and grpcurl, built by `make peers` (tools/peers/build.sh) into .peers/ at the repo root.

`make test` builds them first. A test that needs one and finds it missing fails and says how to
build it: a skipped Kueue or ghz test would read as a pass.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("GPUALLOC_PEERS_DIR", ROOT / ".peers"))


def peer(name: str) -> Path:
    """The path of the built peer `name` (a binary in .peers/bin, or a directory in .peers)."""
    found = PEERS / "bin" / name
    if not found.exists():
        found = PEERS / name
    if not found.exists():
        log = PEERS / "logs"
        pytest.fail(
            f"the Go peer {name!r} is not built (looked in {PEERS}): run `make peers`"
            f" (tools/peers/build.sh; build logs in {log})",
            pytrace=False,
        )
    return found
