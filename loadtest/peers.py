"""The Go programs the benchmarks run (ghz, upstream-allocator), built by `make peers`
(tools/peers/build.sh) into .peers/bin at the repo root; `make bench` builds them first."""

from __future__ import annotations

from pathlib import Path

__all__ = ["peer_binary"]

ROOT = Path(__file__).resolve().parents[1]


def peer_binary(name: str) -> Path:
    found = ROOT / ".peers" / "bin" / name
    if not found.exists():
        raise RuntimeError(f"{name} is not built ({found}): run `make peers`")
    return found
