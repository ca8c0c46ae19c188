"""Reading one Kueue object's fields as Kueue's CRDs and webhooks check them: the error types
(`FieldError`, `KueueViolation`), where an object came from (`ObjectRef`) and the typed field
readers (`Checker`), each of which records a violation and returns a harmless value."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from services.common.dra.names import label_name_errors
from services.common.dra.quantity import Quantity
from services.common.errors import FieldViolation

_INT32 = (-(2**31), 2**31 - 1)


class FieldError(StrEnum):
    """What is wrong with a field, in Kubernetes' field-error words (field.ErrorType), plus
    gpualloc's own: an unknown field (kubectl --validate=strict) and a refusal."""

    REQUIRED = "Required value"
    INVALID = "Invalid value"
    DUPLICATE = "Duplicate value"
    NOT_SUPPORTED = "Unsupported value"
    NOT_FOUND = "Not found"
    TOO_MANY = "Too many"
    TOO_LONG = "Too long"
    FORBIDDEN = "Forbidden"
    UNKNOWN = "Unknown field"
    REFUSED = "Not honoured by gpualloc"  # valid Kueue that gpualloc cannot honour: refused


@dataclass(frozen=True)
class ObjectRef:
    """Where an object came from (`kueue/queues.yaml[2]`, `spec.quota.kueue.objects[0]`) and
    what it is."""

    origin: str
    kind: str = ""
    name: str = ""

    def __str__(self) -> str:
        what = " ".join(part for part in (self.kind, self.name) if part)
        return f"{self.origin} ({what})" if what else self.origin


@dataclass(frozen=True)
class KueueViolation(FieldViolation):
    """One bad field of one Kueue object: `path` is the field path inside the object
    (`spec.resourceGroups[0].flavors[1].resources[0].lendingLimit`), `error` its type."""

    error: FieldError = FieldError.INVALID
    origin: str = ""
    kind: str = ""
    name: str = ""

    def __str__(self) -> str:
        what = " ".join(part for part in (self.kind, self.name) if part)
        where = f"{self.origin}: {what}" if what else self.origin
        at = f" {self.path}" if self.path else ""
        return f"{where}:{at}: {self.error}: {self.description}"


class Checker:
    """Typed field readers over one object: each records a KueueViolation and returns a
    harmless value."""

    def __init__(
        self,
        errors: list[FieldViolation],
        ref: ObjectRef,
        *,
        version: str = "",
        prefix: str = "",
    ) -> None:
        self.errors = errors
        self.ref = ref
        self.version = version
        self.prefix = prefix

    def fail(self, error: FieldError, path: str, description: str) -> None:
        if self.prefix:  # a field of the policy itself: a plain violation at its full path
            full = f"{self.prefix}.{path}" if path else self.prefix
            self.errors.append(KueueViolation(full, description, error))
            return
        self.errors.append(
            KueueViolation(path, description, error, self.ref.origin, self.ref.kind, self.ref.name)
        )

    def mapping(self, value: object, path: str, allowed: Iterable[str] | None) -> Mapping[str, Any]:
        if value is None:
            self.fail(FieldError.REQUIRED, path, "")
            return {}
        if not isinstance(value, Mapping):
            self.fail(FieldError.INVALID, path, f"must be a mapping, got {type(value).__name__}")
            return {}
        if allowed is not None:
            known = set(allowed)
            for key in value:
                if key not in known:
                    where = f"{path}.{key}" if path else str(key)
                    self.fail(FieldError.UNKNOWN, where, f"known: {', '.join(sorted(known))}")
        return value

    def sequence(self, value: object, path: str) -> Sequence[object]:
        if value is None:
            self.fail(FieldError.REQUIRED, path, "")
            return ()
        if not isinstance(value, list):
            self.fail(FieldError.INVALID, path, f"must be a list, got {type(value).__name__}")
            return ()
        return value

    def string(self, value: object, path: str, *, required: bool = True) -> str:
        if value is None or value == "":
            if required:
                self.fail(FieldError.REQUIRED, path, "")
            return ""
        if not isinstance(value, str):
            self.fail(FieldError.INVALID, path, f"must be a string, got {type(value).__name__}")
            return ""
        return value

    def choice(self, value: object, path: str, choices: Sequence[str]) -> bool:
        if value in choices:
            return True
        self.fail(
            FieldError.NOT_SUPPORTED, path, f"{value!r}: supported values: {', '.join(choices)}"
        )
        return False

    def int32(self, value: object, path: str) -> int:
        if value is None:
            self.fail(FieldError.REQUIRED, path, "")
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(FieldError.INVALID, path, f"must be an integer, got {value!r}")
            return 0
        if not _INT32[0] <= value <= _INT32[1]:
            self.fail(FieldError.INVALID, path, "must fit in 32 bits")
            return 0
        return value

    def int64(self, value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(FieldError.INVALID, path, f"must be an integer, got {value!r}")
            return 0
        if not -(2**63) <= value < 2**63:
            self.fail(FieldError.INVALID, path, "must fit in 64 bits")
            return 0
        return value

    def quantity(self, value: object, path: str, *, negative_ok: bool = False) -> Quantity | None:
        if value is None:
            self.fail(FieldError.REQUIRED, path, "")
            return None
        if isinstance(value, bool) or not isinstance(value, int | str):
            self.fail(FieldError.INVALID, path, f"must be an integer or a quantity, got {value!r}")
            return None
        try:
            quantity = Quantity.parse(str(value))
        except ValueError as error:
            self.fail(FieldError.INVALID, path, str(error))
            return None
        if quantity.value < 0 and not negative_ok:
            self.fail(FieldError.INVALID, path, "must be greater than or equal to 0")
            return None
        return quantity

    def resource_name(self, value: object, path: str) -> str:
        """A resource name (corev1.ResourceName as Kueue checks it: a qualified name)."""
        name = self.string(value, path)
        if len(name) > 253:
            self.fail(FieldError.INVALID, path, "must not exceed 253 characters")
            return ""
        for problem in label_name_errors(name) if name else ():
            self.fail(FieldError.INVALID, path, problem)
        return name
