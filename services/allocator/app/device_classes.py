"""The DeviceClasses an allocator knows: built-in, configured, and inline per request.

Order of precedence, lowest first: the built-in NVIDIA classes (app/deviceclasses.yaml next to
this module), then the files and directories of GPUALLOC_DEVICE_CLASSES in order, then the
classes a request carries inline (for that call only). A later class replaces an earlier one
of the same name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from services.common.dra.model import DeviceClass
from services.common.errors import InvalidArgument
from services.common.manifests import load_manifests

__all__ = ["BUILTIN_DEVICE_CLASSES", "load_device_classes", "with_inline"]

BUILTIN_DEVICE_CLASSES = Path(__file__).with_name("deviceclasses.yaml")


def load_device_classes(
    paths: Sequence[str] = (), *, builtin: bool = True
) -> dict[str, DeviceClass]:
    """Classes by name from the built-in file (unless `builtin` is False) and `paths`; objects
    of other kinds in those files are an error (a typo'd path should not pass silently)."""
    sources = [str(BUILTIN_DEVICE_CLASSES)] if builtin else []
    classes: dict[str, DeviceClass] = {}
    for obj in load_manifests([*sources, *paths]):
        if not isinstance(obj, DeviceClass):
            raise InvalidArgument.at(
                "GPUALLOC_DEVICE_CLASSES",
                f"expected DeviceClass objects only, found a {type(obj).__name__}",
            )
        classes[obj.name] = obj
    return classes


def with_inline(
    known: Mapping[str, DeviceClass], inline: Iterable[DeviceClass]
) -> Mapping[str, DeviceClass]:
    """The classes a call sees: `known` shadowed by the request's own."""
    extra = {device_class.name: device_class for device_class in inline}
    return {**known, **extra} if extra else known
