"""Class and request selectors, evaluated once per (selector list, device profile) per solve.

Class selectors come first and short-circuit, then the request's own (upstream `isSelectable`).
Expressions are compiled on first use, so a bad expression only fails a solve that has a device
to test it on (as upstream). Compile and runtime errors are fatal: they become InvalidArgument
at the selector's field path with upstream's wording (`class <name>: selector #<i>: CEL compile
error: ...`, `claim <ns>/<name>: selector #<i>: CEL runtime error: ...`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from services.allocator.core.constraints import lookup_attribute
from services.allocator.core.plan import Alternative, Plan
from services.allocator.core.snapshot import DeviceEntry
from services.cel import CelBudgetExhausted, CelError, CelMeter, CompiledSelector, SelectorCache
from services.common.dra.model import DeviceSelector
from services.common.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted

__all__ = ["Equivalence", "EquivalenceSources", "Selection", "equivalence_sources"]

_ALL_TRUE = -1


class Selection:
    """Per-solve memo of selector outcomes: -1 when all selectors hold, else the first false one."""

    def __init__(self, cache: SelectorCache, meter: CelMeter | None = None) -> None:
        """`meter`: the request's CEL budget and stop check (none: unmetered, e.g. tests)."""
        self._cache = cache
        self._meter = meter
        self._compiled: dict[str, CompiledSelector] = {}
        self._by_class: dict[tuple[str, int], int] = {}
        self._by_request: dict[tuple[int, int], int] = {}

    @property
    def cel_evaluations(self) -> int:
        """Real CEL evaluations of this solve (its meter's count; 0 unmetered)."""
        return self._meter.evaluations if self._meter is not None else 0

    @property
    def cel_profile_hits(self) -> int:
        """CEL outcomes this solve took from a selector's per-profile memo (0 unmetered)."""
        return self._meter.profile_hits if self._meter is not None else 0

    def class_miss(self, alternative: Alternative, entry: DeviceEntry) -> int:
        """Index of the first class selector that is false for the device, or -1."""
        device_class = alternative.device_class
        key = (device_class.name, entry.profile)
        found = self._by_class.get(key)
        if found is None:
            found = self._by_class[key] = self._first_false(
                device_class.selectors,
                entry,
                f'classes["{device_class.name}"].spec.selectors',
                f"class {device_class.name}",
            )
        return found

    def request_miss(self, alternative: Alternative, entry: DeviceEntry, claim: str) -> int:
        """Index of the first request selector that is false for the device, or -1."""
        key = (alternative.key, entry.profile)
        found = self._by_request.get(key)
        if found is None:
            found = self._by_request[key] = self._first_false(
                alternative.selectors, entry, f"{alternative.path}.selectors", f"claim {claim}"
            )
        return found

    def matches(self, alternative: Alternative, entry: DeviceEntry, claim: str) -> bool:
        return (
            self.class_miss(alternative, entry) < 0
            and self.request_miss(alternative, entry, claim) < 0
        )

    def _first_false(
        self, selectors: Sequence[DeviceSelector], entry: DeviceEntry, path: str, owner: str
    ) -> int:
        for i, selector in enumerate(selectors):
            where = f"{path}[{i}].cel.expression"
            compiled = self._compile(selector.cel, where, f"{owner}: selector #{i}")
            try:
                matched = compiled.matches(entry.cel, self._meter)
            except CelBudgetExhausted as err:
                raise ResourceExhausted(
                    f"{err}: {owner} was being evaluated (per-request CEL budget, "
                    "GPUALLOC_MAX_CEL_COST; simpler selectors or fewer device profiles fit it)"
                ) from None
            except CelError as err:
                raise InvalidArgument.at(
                    where, f"{owner}: selector #{i}: CEL runtime error: {err.detail}"
                ) from err
            if not matched:
                return i
        return _ALL_TRUE

    def compiled(self, expression: str, where: str, owner: str) -> CompiledSelector:
        return self._compile(expression, where, owner)

    def _compile(self, expression: str, where: str, owner: str) -> CompiledSelector:
        compiled = self._compiled.get(expression)
        if compiled is None:
            meter = self._meter
            if meter is not None and meter.stop is not None and meter.stop():
                # compiling a long expression takes a while too: a request with many of them
                # must not go on compiling after its time is up
                raise DeadlineExceeded("compiling CEL selectors: the request's time ran out")
            try:
                compiled = self._cache.compile(expression)
            except CelError as err:
                raise InvalidArgument.at(
                    where, f"{owner}: CEL compile error: {err.detail}"
                ) from err
            self._compiled[expression] = compiled
        return compiled


class Equivalence:
    """Which devices are interchangeable in one solve: same shape (capacities, taints, sharing
    mode), same counter consumption (the very same counters and amounts), same values of
    everything the plan's selectors read (CEL profile keys), and same values of the attributes
    its constraints compare. Real GPUs differ in uuid and PCI
    address, but a solve that never reads those treats them alike."""

    def __init__(
        self,
        selection: Selection,
        plan: Plan,
        *,
        distinct: bool = False,
        sources: EquivalenceSources | None = None,
    ) -> None:
        """`distinct`: every device is its own class (topology constraints tell devices of
        one content apart by where they sit). `sources`: equivalence_sources(plan), when the
        caller has it already."""
        self._selection = selection
        self._distinct = distinct
        selectors, attributes = equivalence_sources(plan) if sources is None else sources
        self._selectors = selectors
        self._attributes = attributes
        self._compiled: list[CompiledSelector] | None = None
        self._static_classes: dict[Hashable, int] = {}
        self._static_by_device: dict[int, int] = {}
        self._classes: dict[Hashable, int] = {}
        self._by_device: dict[int, int] = {}

    def static_class(self, entry: DeviceEntry) -> int:
        """Devices of one static class pass or fail the static checks (selectors, taints,
        requested capacity) alike."""
        found = self._static_by_device.get(entry.position)
        if found is None:
            if self._compiled is None:  # on the first device, as upstream compiles lazily
                self._compiled = [self._selection.compiled(*s) for s in self._selectors]
            key = (entry.shape, tuple(c.profile_key(entry.cel) for c in self._compiled))
            found = self._static_classes.setdefault(key, len(self._static_classes))
            self._static_by_device[entry.position] = found
        return found

    def seed(self, entries: Iterable[DeviceEntry], like: Iterable[DeviceEntry]) -> None:
        """Give each device the static class of the device standing in its place on a node of
        the same template (same content up to abstracted attributes this plan never reads), so
        a node's devices need no selector profile keys of their own."""
        known = self._static_by_device
        for entry, model in zip(entries, like, strict=True):
            if entry.position not in known:
                known[entry.position] = self.static_class(model)

    def of(self, entry: DeviceEntry) -> int:
        """Devices of one class are interchangeable for the search: same static class, same
        counter consumption, same values of the constrained attributes."""
        found = self._by_device.get(entry.position)
        if found is None:
            key = (
                self.static_class(entry),
                entry.consumption,
                tuple(lookup_attribute(entry.device, entry.id.driver, a) for a in self._attributes),
                entry.position if self._distinct else -1,
            )
            found = self._by_device[entry.position] = self._classes.setdefault(
                key, len(self._classes)
            )
        return found


# What an Equivalence reads of its plan: the distinct selector expressions (expression, field
# path, owner), then the attributes its constraints compare.
EquivalenceSources = tuple[tuple[tuple[str, str, str], ...], tuple[str, ...]]


def equivalence_sources(plan: Plan) -> EquivalenceSources:
    """The plan's distinct selector expressions, each with the field path and owner of its
    first use, and the attributes its constraints compare (sorted): a value of the plan."""
    selectors: list[tuple[str, str, str]] = []
    seen: set[str] = set()

    def add(expression: str, path: str, owner: str) -> None:
        if expression not in seen:
            seen.add(expression)
            selectors.append((expression, path, owner))

    for alternative in plan.alternatives():
        device_class = alternative.device_class
        for i, selector in enumerate(device_class.selectors):
            path = f'classes["{device_class.name}"].spec.selectors[{i}].cel.expression'
            add(selector.cel, path, f"class {device_class.name}: selector #{i}")
        label = plan.claims[alternative.claim_index].label
        for i, selector in enumerate(alternative.selectors):
            path = f"{alternative.path}.selectors[{i}].cel.expression"
            add(selector.cel, path, f"claim {label}: selector #{i}")
    attributes = tuple(sorted({s.attribute for c in plan.claims for s in c.constraints}))
    return tuple(selectors), attributes
