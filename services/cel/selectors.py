"""CEL device selectors with Kubernetes DRA semantics (resource.k8s.io/v1, 1.34): compile once,
evaluate per device *profile*.

The expression sees `device` = {driver, attributes, capacity, allowMultipleAllocations} as
upstream's `cel.Device` projection (dynamic-resource-allocation cel/compile.go): attribute and
capacity names are split into domain and id (a bare name is in the driver's domain), a missing
domain reads as an empty map, a missing id is the runtime error "no such key". Versions are
`Version` objects, capacities `Quantity` objects; the Kubernetes quantity/semver/regex/lists
libraries and cel-go ext Strings, Sets, TwoVarComprehensions and Bindings are available
(cel_library lists what is not).

Cost: every call, selection, list/map literal and comprehension step charges units, and string
or list building charges by size *before* allocating (the model follows cel-go's runtime cost
roughly); past `cost_limit` (default 1,000,000, upstream's CELSelectorExpressionMaxCost) the
evaluation stops with `CelCostExceeded`. Steps are counted, never clocked.

Profiles: at compile time the AST is searched for what it reads of `device` (cel_compile.Reads):
the driver, single attributes/capacities by (domain, id), whole domains when a domain map is used
as a value, everything when `device` itself is. The values read form the device's profile key;
the result (bool or error) is memoised per key, so N identical devices cost one evaluation.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from services.cel.compiler import (
    DEVICE_SLOT,
    CompileError,
    Program,
    Reads,
    compile_expression,
)
from services.cel.semver import Version
from services.cel.values import (
    EMPTY_MAP,
    CostExceeded,
    DeviceValue,
    DomainMap,
    EvalError,
    Frame,
    Stopped,
    type_name,
)
from services.common.dra.model import AttributeType, AttributeValue, Device
from services.common.dra.quantity import Quantity
from services.common.errors import DeadlineExceeded, InvalidArgument

__all__ = [
    "DEFAULT_COST_LIMIT",
    "MAX_EXPRESSION_LENGTH",
    "DEFAULT_REQUEST_COST",
    "CelBudgetExhausted",
    "CelCostExceeded",
    "CelMeter",
    "CelDevice",
    "CelError",
    "CompiledSelector",
    "SelectorCache",
    "Version",
]

_T = TypeVar("_T")
DEFAULT_COST_LIMIT = 1_000_000  # resourceapi.CELSelectorExpressionMaxCost
MAX_EXPRESSION_LENGTH = 10 * 1024  # resourceapi.CELSelectorExpressionMaxLength
_NO_SUCH_KEY_HINT = (
    '. consider guarding the check with has() (e.g. has(device.attributes["<domain>"].<id>))'
    " or the `in` operator for optional fields; optional chaining (.?) is not supported"
)


class CelError(InvalidArgument):
    """A selector that does not compile, or that failed on a device (a runtime error)."""

    def __init__(self, expression: str, detail: str, *, phase: str = "runtime") -> None:
        shown = expression if len(expression) <= 200 else expression[:197] + "..."
        super().__init__(f"CEL {phase} error: {detail} (expression: {shown})")
        self.expression = expression
        self.detail = detail
        self.phase = phase


class CelCostExceeded(CelError):
    """The evaluation ran past the cost limit (upstream: "actual cost limit exceeded")."""


DEFAULT_REQUEST_COST = 2_000_000
"""CEL cost units one request may spend over all its evaluations: what two expressions at
upstream's per-expression limit may cost (here ~5 s of CPU each at ~180,000 units/s), while a
typical request — a few selectors of tens of units over a few hundred device profiles — spends
well under 1% of it. Upstream bounds each expression only; a service that evaluates on behalf
of many callers must bound the request too."""


class CelMeter:
    """One request's CEL spending: units left over all its evaluations, and its `stop` check
    (deadline or cancellation, the caller's), consulted during long evaluations. It counts the
    request's own real evaluations and memo hits too (`evaluations`, `profile_hits`): the
    cache's totals are shared by every thread, so their deltas are no request's."""

    __slots__ = ("evaluations", "limit", "profile_hits", "remaining", "stop")

    def __init__(self, limit: int = DEFAULT_REQUEST_COST, stop: Callable[[], bool] | None = None):
        self.limit = limit
        self.remaining = limit
        self.stop = stop
        self.evaluations = 0
        self.profile_hits = 0


class CelBudgetExhausted(Exception):  # noqa: N818 - the request's, not the expression's
    """The request's CEL evaluations spent its CelMeter (see DEFAULT_REQUEST_COST)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"CEL evaluations of this request ran past {limit:,} cost units")
        self.limit = limit


# --- the device projection ---------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CelDevice:
    """What a selector sees of a device. Keys as written in the slice: a bare `productName` is
    in the driver's domain, `resource.kubernetes.io/pciBusID` is qualified.

    Compares and hashes by identity (its maps are not hashable); the converted CEL maps and
    profile pieces are cached on the instance, so reuse one CelDevice per device.
    """

    driver: str
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, Quantity]
    allow_multiple_allocations: bool = False
    _cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def from_device(cls, driver: str, device: Device) -> CelDevice:
        return cls(
            driver,
            device.attributes,
            {name: c.value for name, c in device.capacity.items()},
            device.allow_multiple_allocations,
        )

    def attribute(self, domain: str, ident: str) -> AttributeValue | None:
        """The attribute `domain`/`ident`, qualified name first, then the bare name."""
        value = self.attributes.get(f"{domain}/{ident}")
        if value is None and domain == self.driver:
            value = self.attributes.get(ident)
        return value

    def capacity_of(self, domain: str, ident: str) -> Quantity | None:
        value = self.capacity.get(f"{domain}/{ident}")
        if value is None and domain == self.driver:
            value = self.capacity.get(ident)
        return value

    def attribute_domains(self) -> dict[str, dict[str, AttributeValue]]:
        return self._cached("attribute-domains", lambda: _by_domain(self.attributes, self.driver))

    def capacity_domains(self) -> dict[str, dict[str, Quantity]]:
        return self._cached("capacity-domains", lambda: _by_domain(self.capacity, self.driver))

    def invalid_version(self) -> str:
        """Why some version attribute does not parse ("" if all do). Upstream converts every
        attribute before evaluating, so such a device fails every selector."""
        return str(self._cached("invalid-version", self._find_invalid_version))

    def projection(self) -> DeviceValue:
        """The `device` value an expression evaluates against (built once, on first need)."""
        return self._cached("projection", self._project)

    def _find_invalid_version(self) -> str:
        for name, value in self.attributes.items():
            if value.type is AttributeType.VERSION:
                parsed = _parse_version(str(value.value))
                if isinstance(parsed, str):
                    return f"attribute {name}: {parsed}"
        return ""

    def _project(self) -> DeviceValue:
        attributes = DomainMap()
        for domain, ids in self.attribute_domains().items():
            attributes[domain] = {ident: _attribute_value(v) for ident, v in ids.items()}
        capacity = DomainMap(self.capacity_domains())
        return DeviceValue(self.driver, attributes, capacity, self.allow_multiple_allocations)

    def _cached(self, key: str, build: Callable[[], _T]) -> _T:
        value = self._cache.get(key)
        if value is None:
            value = self._cache.setdefault(key, build())
        return cast(_T, value)


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, slash, ident = name.partition("/")
    return (domain, ident) if slash else (driver, name)


def _by_domain(values: Mapping[str, Any], driver: str) -> dict[str, dict[str, Any]]:
    """Group by domain; a qualified name wins over the same bare name (`attribute()` agrees)."""
    grouped: dict[str, dict[str, Any]] = {}
    for qualified in (False, True):
        for name, value in values.items():
            if ("/" in name) == qualified:
                domain, ident = _split(name, driver)
                grouped.setdefault(domain, {})[ident] = value
    return grouped


def _attribute_value(value: AttributeValue) -> Any:
    if value.type is AttributeType.VERSION:
        parsed = _parse_version(str(value.value))
        if isinstance(parsed, str):
            raise ValueError(parsed)
        return parsed
    return value.value


@functools.lru_cache(maxsize=4096)
def _parse_version(text: str) -> Version | str:
    """A version attribute, parsed once per distinct string (devices share driver versions);
    the error message instead if it is not semver."""
    try:
        return Version.parse(text)
    except ValueError as exc:
        return str(exc)


# --- profiles ----------------------------------------------------------------------------

KeyPart = Callable[[CelDevice], Hashable]


def _key_parts(reads: Reads) -> list[KeyPart]:
    """One getter per value the expression reads; their results form the profile key."""
    if reads.whole_device:
        return [_whole_device]
    parts: list[KeyPart] = []
    if reads.driver:
        parts.append(lambda d: d.driver)
    if reads.allow_multiple_allocations:
        parts.append(lambda d: d.allow_multiple_allocations)
    # Whole maps: the driver decides which domain each bare name is in, so it is part of the key.
    if reads.attributes_all:
        parts.append(lambda d: (d.driver, frozenset(d.attributes.items())))
    if reads.capacity_all:
        parts.append(lambda d: (d.driver, frozenset(d.capacity.items())))
    parts.extend(_domain_part(domain, capacity=False) for domain in reads.attribute_domains)
    parts.extend(_domain_part(domain, capacity=True) for domain in reads.capacity_domains)
    parts.extend(_id_part(domain, ident, capacity=False) for domain, ident in reads.attribute_ids)
    parts.extend(_id_part(domain, ident, capacity=True) for domain, ident in reads.capacity_ids)
    return parts


def _domain_part(domain: str, *, capacity: bool) -> KeyPart:
    def part(device: CelDevice) -> Hashable:
        grouped = device.capacity_domains() if capacity else device.attribute_domains()
        return frozenset(grouped.get(domain, EMPTY_MAP).items())

    return part


def _id_part(domain: str, ident: str, *, capacity: bool) -> KeyPart:
    if capacity:
        return lambda device: device.capacity_of(domain, ident)
    return lambda device: device.attribute(domain, ident)


def _whole_device(device: CelDevice) -> Hashable:
    return (
        device.driver,
        frozenset(device.attributes.items()),
        frozenset(device.capacity.items()),
        device.allow_multiple_allocations,
    )


# --- compiled selectors ------------------------------------------------------------------


class _Stats:
    """Counters shared by a cache and its selectors (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.evaluations = 0
        self.compile_hits = 0
        self.compile_misses = 0
        self.profile_hits = 0


@dataclass(frozen=True)
class _Failure:
    """A memoised error: re-raised as a fresh exception each time."""

    error_type: type[CelError]
    detail: str


_Outcome = bool | _Failure


class CompiledSelector:
    """One compiled expression. `matches` is memoised per device profile and thread-safe."""

    def __init__(
        self, expression: str, program: Program, cost_limit: int, max_profiles: int, stats: _Stats
    ) -> None:
        self.expression = expression
        self.reads = program.reads
        self._run = program.run
        self._cost_limit = cost_limit
        self._max_profiles = max_profiles
        self._stats = stats
        self._parts = _key_parts(program.reads)
        self._memo: dict[Hashable, _Outcome] = {}
        self._lock = threading.Lock()

    def profile_key(self, device: CelDevice) -> Hashable:
        """The values of `device` this expression reads: devices with equal keys get equal
        results."""
        parts = self._parts
        if len(parts) == 1:
            return parts[0](device)
        return tuple(part(device) for part in parts)

    def matches(self, device: CelDevice, meter: CelMeter | None = None) -> bool:
        """True/False, or CelError (CelCostExceeded) for a runtime error on this device.
        With `meter`, the call counts in it (a real evaluation or a memo hit), a real
        evaluation spends from it (CelBudgetExhausted when it cannot) and stops with
        DeadlineExceeded when the meter's `stop` says so; neither is remembered as the device
        profile's outcome."""
        invalid = device.invalid_version()
        if invalid:
            raise CelError(self.expression, invalid)
        key = self.profile_key(device)
        outcome = self._memo.get(key)
        if outcome is None:
            outcome = self._evaluate(device.projection(), meter)
            with self._lock:
                if len(self._memo) >= self._max_profiles:
                    del self._memo[next(iter(self._memo))]
                self._memo[key] = outcome
        else:
            with self._stats.lock:
                self._stats.profile_hits += 1
            if meter is not None:
                meter.profile_hits += 1
        if isinstance(outcome, _Failure):
            raise outcome.error_type(self.expression, outcome.detail)
        return outcome

    def _evaluate(self, projection: DeviceValue, meter: CelMeter | None) -> _Outcome:
        with self._stats.lock:
            self._stats.evaluations += 1
        limit = self._cost_limit
        if meter is not None:
            meter.evaluations += 1
            if meter.stop is not None and meter.stop():
                raise DeadlineExceeded("CEL evaluation: the request's time ran out")
            if meter.remaining <= 0:
                raise CelBudgetExhausted(meter.limit)
            limit = min(limit, meter.remaining)
        frame = Frame({DEVICE_SLOT: projection}, limit, meter.stop if meter else None)
        try:
            result = self._run(frame)
        except Stopped:
            raise DeadlineExceeded("CEL evaluation: the request's time ran out") from None
        except CostExceeded:
            if limit < self._cost_limit:  # the request's budget, not the expression's limit
                assert meter is not None
                meter.remaining = 0
                raise CelBudgetExhausted(meter.limit) from None
            return _Failure(
                CelCostExceeded, f"actual cost limit exceeded (limit {self._cost_limit} units)"
            )
        except EvalError as exc:
            detail = str(exc)
            if detail.startswith("no such key"):
                detail += _NO_SUCH_KEY_HINT
            return _Failure(CelError, detail)
        except RecursionError:
            return _Failure(CelError, "evaluation nests too deeply")
        finally:
            if meter is not None:
                meter.remaining -= max(0, limit - frame.budget)
        if type(result) is not bool:
            return _Failure(CelError, f"must evaluate to bool, not {type_name(result)}")
        return result

    def __repr__(self) -> str:
        return f"CompiledSelector({self.expression!r})"


class SelectorCache:
    """Compiles each distinct expression once (bounded LRU of successful compiles) and counts
    real evaluations. Share one per process; safe to use from many threads."""

    def __init__(
        self,
        max_entries: int = 1024,
        max_profiles_per_selector: int = 65536,
        cost_limit: int = DEFAULT_COST_LIMIT,
        *,
        allow_multiple_allocations_field: bool = True,
    ) -> None:
        """`allow_multiple_allocations_field=False` makes `device.allowMultipleAllocations` a
        compile error, as upstream does with the DRAConsumableCapacity gate off."""
        if max_entries < 1 or max_profiles_per_selector < 1 or cost_limit < 1:
            raise ValueError("max_entries, max_profiles_per_selector and cost_limit must be >= 1")
        self._max_entries = max_entries
        self._max_profiles = max_profiles_per_selector
        self._cost_limit = cost_limit
        self._multi_alloc_field = allow_multiple_allocations_field
        self._entries: OrderedDict[str, CompiledSelector] = OrderedDict()
        self._lock = threading.Lock()
        self._stats = _Stats()

    def compile(self, expression: str) -> CompiledSelector:
        """The compiled selector for `expression`; CelError (phase "compile") if invalid."""
        with self._lock:
            selector = self._entries.get(expression)
            if selector is not None:
                self._entries.move_to_end(expression)
                self._stats.compile_hits += 1
                return selector
            self._stats.compile_misses += 1
        selector = self._compile(expression)
        with self._lock:
            selector = self._entries.setdefault(expression, selector)
            self._entries.move_to_end(expression)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return selector

    def _compile(self, expression: str) -> CompiledSelector:
        if len(expression) > MAX_EXPRESSION_LENGTH:
            raise CelError(
                expression,
                f"expression is {len(expression)} characters, more than {MAX_EXPRESSION_LENGTH}",
                phase="compile",
            )
        try:
            program = compile_expression(
                expression, allow_multiple_allocations_field=self._multi_alloc_field
            )
        except CompileError as exc:
            raise CelError(expression, str(exc), phase="compile") from None
        return CompiledSelector(
            expression, program, self._cost_limit, self._max_profiles, self._stats
        )

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def evaluations(self) -> int:
        """Real CEL evaluations performed (memo hits excluded), across all selectors."""
        return self._stats.evaluations

    @property
    def compile_hits(self) -> int:
        return self._stats.compile_hits

    @property
    def compile_misses(self) -> int:
        return self._stats.compile_misses

    @property
    def profile_hits(self) -> int:
        return self._stats.profile_hits
