"""The web view's HTML, rendered on the server: the fleet, the Explain box and its answers.

Every value that comes from the inventory, a reservation or a pasted claim goes through
`html.escape`; the page has no inline script or style (web.css and web.js are served beside
it, so the Content-Security-Policy can forbid everything else). Positions and colours are
classes (`c3 w2`: column 3, two wide; `h5`: holder colour 5), not inline styles, for the same
reason. A holder's colour comes from a CRC of its name, so it stays the same across refreshes
(`holder_colours`).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from html import escape

from services.allocator.app.fleet_view import (
    Fleet,
    FleetGpu,
    FleetHolder,
    FleetNode,
    FleetPlacement,
)
from services.allocator.app.messages import Answer, Holder, Outcome, claim_ref
from services.allocator.core import TenantStatus
from services.common.quota.model import quantity_text

__all__ = [
    "answer_fragment",
    "error_fragment",
    "fleet_fragment",
    "holder_colours",
    "page",
    "quotas_fragment",
]

HOLDER_COLOURS = 12  # classes h0 .. h11 in web.css
MAX_COLUMNS = 16  # classes c0 .. c15, w1 .. w16 and cols1 .. cols16 in web.css
_EXPLAIN_PLACEHOLDER = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: two-big-gpus
spec:
  devices:
    requests:
    - name: gpus
      exactly:
        deviceClassName: gpu.nvidia.com
        count: 2
        selectors:
        - cel:
            expression: device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0
"""


def page(
    fleet: Fleet, *, tenants_only: bool, explain: str = "", claim: str = "", quotas: str = ""
) -> str:
    """The whole page: the fleet and the quotas (refreshed by web.js), the Explain box."""
    scope = (
        "An access policy is on: reservations show their tenant only."
        if tenants_only
        else "Development mode: every holder is shown."
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gpualloc fleet</title>
<link rel="stylesheet" href="/web.css">
<script src="/web.js" defer></script>
</head>
<body>
<header>
<h1>gpualloc fleet</h1>
<p class="scope">Read-only. {escape(scope)} <span id="status" class="status">live</span></p>
</header>
<main>
<section id="fleet" aria-live="polite">{fleet_fragment(fleet)}{quotas}</section>
<section class="explain">
<h2>Explain a claim</h2>
<form id="explain-form" method="post" action="/explain">
<label for="claim">ResourceClaim (YAML or JSON; DeviceClasses may come along)</label>
<textarea id="claim" name="claim" rows="16" spellcheck="false"
 placeholder="{escape(_EXPLAIN_PLACEHOLDER)}">{escape(claim)}</textarea>
<button id="explain-button" type="submit">Explain</button>
</form>
<div id="explain-result">{explain}</div>
</section>
</main>
</body>
</html>
"""


def fleet_fragment(fleet: Fleet) -> str:
    """The part web.js replaces on every change: legend, then one card per node."""
    colours = holder_colours(fleet.holders())
    nodes = "".join(_node(node, colours) for node in fleet.nodes)
    gpus = sum(len(n.gpus) for n in fleet.nodes)
    free = sum(n.free_gpus for n in fleet.nodes)
    tainted = sum(n.tainted_gpus for n in fleet.nodes)
    return (
        f'<div class="summary" data-generation="{fleet.generation}">'
        f"{len(fleet.nodes)} nodes, {gpus} GPUs, {free} free{_tainted(tainted)}; "
        f"inventory generation {fleet.generation}</div>"
        f'{_legend(fleet, colours)}<div class="nodes">{nodes}</div>'
    )


def quotas_fragment(rows: Sequence[TenantStatus], enabled: bool) -> str:
    """The quotas panel: per tenant and quota resource what `gpualloc get quotas` prints (the
    cohort as its path from the root of its tree); the rows are those the viewer may see (app:
    QuotaStatus's rule). Nothing without quotas."""
    if not enabled:
        return ""
    if not rows:
        body = (
            '<p class="meta">Quotas are shown to the identities of their own tenant and to '
            "those that see every tenant (<code>gpualloc get quotas</code>).</p>"
        )
    else:
        cells = "".join(
            f'<tr data-tenant="{escape(r.tenant)}"><td>{escape(r.tenant)}</td>'
            f"<td>{escape(r.resource)}</td><td>{escape('/'.join(r.path) or '-')}</td>"
            + "".join(
                f"<td>{quantity_text(v, r.binary)}</td>"
                for v in (r.nominal, r.used, r.borrowed, r.lent, r.left)
            )
            + f"<td>{r.pending_preemptions}</td></tr>"
            for r in rows
        )
        head = "".join(
            f"<th>{h}</th>"
            for h in ("tenant", "resource", "cohort", "nominal", "used", "borrowed", "lent")
            + ("left", "pending")
        )
        body = f'<table class="quota"><tr>{head}</tr>{cells}</table>'
    return f'<div class="quotas"><h2>Quotas</h2>{body}</div>'


def holder_colours(holders: Iterable[str]) -> dict[str, str]:
    """A colour class per holder: the CRC of its name picks one (the same on every refresh),
    the next free one when another holder on the page has it (distinct up to 12 holders)."""
    colours: dict[str, str] = {}
    taken: set[int] = set()
    for owner in sorted(holders):
        number = zlib.crc32(owner.encode()) % HOLDER_COLOURS
        for step in range(HOLDER_COLOURS):
            if (number + step) % HOLDER_COLOURS not in taken:
                number = (number + step) % HOLDER_COLOURS
                break
        taken.add(number)
        colours[owner] = f"h{number}"
    return colours


def _legend(fleet: Fleet, colours: Mapping[str, str]) -> str:
    items = [
        '<li><span class="swatch free"></span>free</li>',
        '<li><span class="swatch h0 reserved"></span>reserved (lease running)</li>',
        '<li><span class="swatch h0 committed"></span>committed</li>',
        '<li><span class="swatch tainted"></span>tainted (kept out of new allocations)</li>',
    ]
    for owner, count in fleet.holders().items():
        items.append(
            f'<li data-holder="{escape(owner)}"><span class="swatch {colours[owner]}"></span>'
            f"{escape(owner)} <small>({count} device{'s' if count != 1 else ''})</small></li>"
        )
    return f'<ul class="legend">{"".join(items)}</ul>'


def _node(node: FleetNode, colours: Mapping[str, str]) -> str:
    gpus = "".join(_gpu(gpu, colours) for gpu in node.gpus)
    return (
        f'<article class="node" data-node="{escape(node.name)}">'
        f"<h3>{escape(node.name)}</h3>"
        f'<p class="stats">{node.free_gpus} of {len(node.gpus)} GPUs free'
        f"{_tainted(node.tainted_gpus)}, "
        f"{node.free_capacity:.2f} of {node.capacity:g} GPU-equivalents free, "
        f'<span class="frag" title="share of the free capacity the expected request mix '
        f'cannot use (fragmentation)">fragmentation {node.fragmentation:.0%}</span></p>'
        f'<div class="gpus">{gpus}</div></article>'
    )


def _tainted(count: int) -> str:
    return f", {count} tainted" if count else ""


def _gpu(gpu: FleetGpu, colours: Mapping[str, str]) -> str:
    columns = min(gpu.columns, MAX_COLUMNS)
    placements = "".join(_placement(p, columns, colours) for p in gpu.placements)
    tainted = f" tainted: {', '.join(gpu.tainted)}" if gpu.tainted else ""
    title = f"{gpu.name} ({gpu.model or 'unknown model'}) in pool {gpu.pool}{tainted}"
    return (
        f'<div class="gpu {gpu.state}{" tainted" if gpu.tainted and gpu.placements else ""}" '
        f'data-gpu="{escape(gpu.name)}" title="{escape(title)}">'
        f'<div class="gpu-name">{escape(gpu.name)}</div>'
        f'<div class="bar cols{columns}">{placements}</div>'
        f'<div class="model">{escape(_short_model(gpu.model))}</div></div>'
    )


def _placement(placement: FleetPlacement, columns: int, colours: Mapping[str, str]) -> str:
    start = min(placement.start, columns - 1)
    width = max(1, min(placement.width, columns - start))
    first = placement.holders[0]
    lines = [placement.device + (f" ({placement.profile})" if placement.profile else "")]
    lines.extend(_holder_line(h) for h in placement.holders)
    label = placement.profile if width > 1 else ""  # the title names it anyway
    state = first.state.lower()  # reserved (striped: a lease runs), committed (solid), pending
    return (
        f'<div class="slot c{start} w{width} {colours.get(first.owner, "h0")} {state}" '
        f'data-device="{escape(placement.device)}" data-holder="{escape(first.owner)}" '
        f'data-state="{state}" title="{escape(chr(10).join(lines))}">{escape(label)}</div>'
    )


def _holder_line(holder: FleetHolder) -> str:
    who = f"tenant {holder.owner}" if holder.redacted else holder.owner
    ref = f" ({holder.reservation_id})" if holder.reservation_id else ""
    return f"held by {who}{ref}, {holder.state}, {_expiry(holder.expires_at)}"


def _expiry(expires_at: float | None) -> str:
    if expires_at is None:
        return "no lease (committed)"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expires_at))
    return f"lease expires {stamp}"


def _short_model(model: str) -> str:
    return model.removeprefix("NVIDIA ")


# --- Explain answers -------------------------------------------------------------------------


def answer_fragment(answer: Answer) -> str:
    """An Explain answer: the outcome, the placement when it fits, the reasons, the holders."""
    parts = [f'<p class="outcome {answer.outcome.value}">{_outcome(answer)}</p>']
    if answer.outcome is Outcome.ALLOCATED:
        parts.append(_placement_table(answer))
    if answer.explanation is not None:
        lines = "".join(f"<li>{escape(line)}</li>" for line in answer.explanation.lines())
        parts.append(f'<ul class="reasons">{lines}</ul>')
    if answer.holders:
        held = "".join(f"<li>{escape(_holder_text(h))}</li>" for h in answer.holders)
        parts.append(f'<p>Held by:</p><ul class="holders">{held}</ul>')
    parts.append(
        f'<p class="meta">inventory generation {answer.generation}, '
        f"{answer.elapsed_seconds * 1000:.1f} ms</p>"
    )
    return f'<div class="answer">{"".join(parts)}</div>'


def _outcome(answer: Answer) -> str:
    if answer.outcome is Outcome.ALLOCATED:
        where = answer.node or ", ".join(p.node or "" for p in answer.placements)
        return f"ALLOCATED: it fits now, on {escape(where)}"
    if answer.outcome is Outcome.BUDGET_EXHAUSTED:
        return "BUDGET EXHAUSTED: the search stopped before it found an answer"
    if answer.outcome is Outcome.QUOTA_EXCEEDED:
        return "QUOTA EXCEEDED: it fits, but not within the tenant's quota"
    return "UNSATISFIABLE: it does not fit now"


def _placement_table(answer: Answer) -> str:
    rows = []
    for claim, allocation in zip(answer.claims, answer.allocations, strict=False):
        for result in allocation.results:
            name = claim_ref(claim.namespace, claim.name)
            cells = (name, result.request, result.pool, result.device)
            rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    head = "<tr><th>claim</th><th>request</th><th>pool</th><th>device</th></tr>"
    return f'<table class="placement">{head}{"".join(rows)}</table>'


def _holder_text(holder: Holder) -> str:
    who = f"a reservation of tenant {holder.owner}" if holder.redacted else holder.owner
    ref = f" ({holder.reservation_id})" if holder.reservation_id else ""
    devices = ", ".join(d.device for d in holder.devices[:8])
    more = f" and {len(holder.devices) - 8} more" if len(holder.devices) > 8 else ""
    return f"{who}{ref} on {holder.node}: {devices}{more}; {_expiry(holder.expires_at)}"


def error_fragment(status: int, message: str) -> str:
    return (
        f'<div class="answer error"><p class="outcome error">{status}: {escape(message)}</p></div>'
    )
