"""`gpualloc solve` on one example claim against the example cluster, the JSON report read back
(shared by the CLI tests)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from services.allocator.cli.solve import run_solve

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = [str(ROOT / "examples" / "cluster"), str(ROOT / "examples" / "deviceclasses.yaml")]
CLAIMS = ROOT / "examples" / "claims"


def solve_claim(claim: str, **options: Any) -> tuple[int, dict[str, Any], str]:
    """(exit code, the JSON report or {} when none, stderr) of run_solve(..., **options)."""
    out, err = io.StringIO(), io.StringIO()
    code = run_solve(
        [*CLUSTER, str(CLAIMS / claim)], output="json", stdout=out, stderr=err, **options
    )
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()
