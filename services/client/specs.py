"""Claims from short specs ("4 x H100 nvlink", "1 x mig 1g.10gb else 2g.20gb") and the builders
behind them, which the Slurm and Kueue bridges use too.

Grammar (case-insensitive, whitespace-separated; `4x` and `4 x` are the same)::

    spec    := [COUNT ("x" | "*")] choice {"else" choice} {option}
    choice  := "mig" PROFILE       a MIG device of that profile, e.g. `mig 1g.10gb`
             | PROFILE             a MIG profile (e.g. `2g.20gb`), as an alternative after `else`
             | "gpu" | "any"       any whole GPU
             | MODEL               a whole GPU whose product name contains MODEL, e.g. `h100`
    option  := "nvlink"            the GPUs are pairwise NVLink-connected (topology constraint)
             | "same-pcie-root"    the devices share one PCIe root complex (DRA matchAttribute)
             | "same-model"        the devices are of one product (DRA matchAttribute)
             | "mem>=" QUANTITY    each device has at least this much memory, e.g. `mem>=40Gi`

COUNT defaults to 1. Several choices make a DRA `firstAvailable` request (tried in order, each
with the count); one choice makes an `exactly` request. Devices come from the NVIDIA DRA
driver's classes, `gpu.nvidia.com` for whole GPUs and `mig.nvidia.com` for MIG devices.

MODEL matching: the product name is lower-cased with spaces turned into underscores, and MODEL
must be a substring of it (`h100` matches `NVIDIA H100 80GB HBM3`,
`a100-sxm4` matches `NVIDIA A100-SXM4-40GB`); `DeviceChoice(exact_model=True)` matches a Slurm
GRES type exactly instead (a whole word of the name). `nvlink` is the gpualloc topology extension
(services/client/topology.py); it is left out for a single device, which is trivially connected.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from services.client.topology import (
    ANNOTATION,
    TopologyConstraint,
    TopologyKind,
    format_annotation,
)
from services.common.dra.model import (
    DeviceConstraint,
    DeviceRequest,
    DeviceSelector,
    DeviceSubRequest,
    ExactDeviceRequest,
    ResourceClaim,
)
from services.common.dra.quantity import Quantity
from services.common.errors import InvalidArgument

__all__ = [
    "GPU_CLASS",
    "MIG_CLASS",
    "PCIE_ROOT_ATTRIBUTE",
    "PRODUCT_ATTRIBUTE",
    "DeviceChoice",
    "RequestSpec",
    "build_claim",
    "claim_from_spec",
    "is_mig_profile",
    "memory_selector",
    "mig_profile_selector",
    "product_selector",
    "product_type_selector",
]

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
PRODUCT_ATTRIBUTE = f"{DRIVER}/productName"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"

_PROFILE = re.compile(r"^\d+(c\.\d+)?g\.\d+gb(\+me(\.all)?|\+gfx|-me)?$")
_MODEL = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_COUNT = re.compile(r"^(\d+)(x|\*)?$")
_NOT_MODELS = frozenset({"x", "*", "else", "mig", "nvlink", "same-pcie-root", "same-model"})


def is_mig_profile(text: str) -> bool:
    """`1g.10gb`, `3g.40gb`, `1c.3g.71gb`, `1g.10gb+me`: NVIDIA's MIG profile names."""
    return _PROFILE.match(text.lower()) is not None


def _cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def product_selector(model: str) -> str:
    """CEL: the device's product name, Slurm-normalised, contains `model`."""
    token = model.lower().replace(" ", "_")
    return (
        f"device.attributes['{DRIVER}'].productName.lowerAscii().replace(' ', '_')"
        f".contains({_cel_string(token)})"
    )


def product_type_selector(gres_type: str) -> str:
    """CEL: `gres_type` is a whole word of the product name (lower-cased, spaces as `_`; words
    split at `_` and `-`), as a Slurm GRES type names its gres.conf lines exactly: `a10` matches
    `NVIDIA A10`, not `NVIDIA A100 80GB`; `l4` does not match `NVIDIA L40S`."""
    token = re.escape(gres_type.lower().replace(" ", "_"))
    return (
        f"device.attributes['{DRIVER}'].productName.lowerAscii().replace(' ', '_')"
        f".matches({_cel_string(f'(^|[_-]){token}([_-]|$)')})"
    )


def mig_profile_selector(profile: str) -> str:
    """CEL: the MIG device has exactly this profile."""
    return f"device.attributes['{DRIVER}'].profile == {_cel_string(profile.lower())}"


def memory_selector(minimum: Quantity) -> str:
    """CEL: the device's memory capacity is at least `minimum`."""
    return f"device.capacity['{DRIVER}'].memory.compareTo(quantity('{minimum}')) >= 0"


def _dns(text: str) -> str:
    label = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return label[:63].strip("-") or "any"


@dataclass(frozen=True)
class DeviceChoice:
    """One way to satisfy a request: a whole GPU (optionally of a model) or a MIG profile."""

    mig_profile: str | None = None
    model: str | None = None
    exact_model: bool = False
    """The model is a Slurm GRES type: a whole word of the product name (else: contained)."""

    @property
    def device_class(self) -> str:
        return MIG_CLASS if self.mig_profile else GPU_CLASS

    @property
    def name(self) -> str:
        """A DNS label naming the choice, used as the firstAvailable sub-request name."""
        if self.mig_profile:
            return _dns(f"mig-{self.model or ''}-{self.mig_profile}")
        return _dns(self.model) if self.model else "gpu"

    def selectors(self, min_memory: Quantity | None = None) -> tuple[DeviceSelector, ...]:
        cel = []
        if self.model:
            exact = self.exact_model
            cel.append(product_type_selector(self.model) if exact else product_selector(self.model))
        if self.mig_profile:
            cel.append(mig_profile_selector(self.mig_profile))
        if min_memory is not None:
            cel.append(memory_selector(min_memory))
        return tuple(DeviceSelector(c) for c in cel)


@dataclass(frozen=True)
class RequestSpec:
    """One DRA request: `count` devices of the first choice that fits."""

    name: str
    count: int
    choices: tuple[DeviceChoice, ...] = (DeviceChoice(),)
    min_memory: Quantity | None = None

    def to_request(self) -> DeviceRequest:
        if len(self.choices) == 1:
            (choice,) = self.choices
            exact = ExactDeviceRequest(
                device_class_name=choice.device_class,
                selectors=choice.selectors(self.min_memory),
                count=self.count,
            )
            return DeviceRequest(self.name, exactly=exact)
        subrequests = tuple(
            DeviceSubRequest(
                name=choice.name,
                device_class_name=choice.device_class,
                selectors=choice.selectors(self.min_memory),
                count=self.count,
            )
            for choice in self.choices
        )
        return DeviceRequest(self.name, first_available=subrequests)

    @property
    def has_mig(self) -> bool:
        return any(c.mig_profile for c in self.choices)


def build_claim(
    name: str,
    requests: Sequence[RequestSpec],
    *,
    namespace: str = "default",
    nvlink: bool = False,
    same_pcie_root: bool = False,
    same_model: bool = False,
) -> ResourceClaim:
    """A ResourceClaim with the requests, DRA constraints, and the NVLink annotation when the
    claim asks for more than one whole GPU to be NVLink-connected."""
    if nvlink and any(r.has_mig for r in requests):
        raise InvalidArgument.at("nvlink", "NVLink connects whole GPUs, not MIG devices")
    constraints = []
    if same_pcie_root:
        constraints.append(DeviceConstraint(match_attribute=PCIE_ROOT_ATTRIBUTE))
    if same_model:
        constraints.append(DeviceConstraint(match_attribute=PRODUCT_ATTRIBUTE))
    annotations = {}
    if nvlink and sum(r.count for r in requests) > 1:
        annotations[ANNOTATION] = format_annotation(
            [TopologyConstraint(TopologyKind.NVLINK_CONNECTED)]
        )
    return ResourceClaim(
        name=name,
        namespace=namespace,
        requests=tuple(r.to_request() for r in requests),
        constraints=tuple(constraints),
        annotations=annotations,
    )


def claim_from_spec(spec: str, name: str = "claim", namespace: str = "default") -> ResourceClaim:
    """The claim a spec describes (grammar in the module docstring); InvalidArgument with the
    offending word otherwise."""
    tokens = _tokens(spec)
    count, tokens = _count(tokens, spec)
    choices: list[DeviceChoice] = []
    options: set[str] = set()
    min_memory: Quantity | None = None
    expect_choice = True
    i = 0
    while i < len(tokens):
        word = tokens[i]
        if expect_choice:
            if word == "mig":
                profile = tokens[i + 1] if i + 1 < len(tokens) else ""
                if not is_mig_profile(profile):
                    raise _bad(spec, "'mig' must be followed by a MIG profile such as 1g.10gb")
                choices.append(DeviceChoice(mig_profile=profile))
                i += 2
            else:
                choices.append(_choice(word, spec))
                i += 1
            expect_choice = False
        elif word == "else":
            expect_choice = True
            i += 1
        elif word in ("nvlink", "same-pcie-root", "same-model"):
            options.add(word)
            i += 1
        elif word.lower().startswith("mem>="):
            min_memory = _quantity(word[len("mem>=") :], spec)
            i += 1
        else:
            raise _bad(
                spec,
                f"unexpected {word!r} (options: nvlink, same-pcie-root, same-model, "
                "mem>=QUANTITY; alternatives are joined by 'else')",
            )
    if expect_choice:
        raise _bad(spec, "expected a device after 'else'" if choices else "no device named")
    request = RequestSpec("gpus", count, tuple(choices), min_memory)
    return build_claim(
        name,
        [request],
        namespace=namespace,
        nvlink="nvlink" in options,
        same_pcie_root="same-pcie-root" in options,
        same_model="same-model" in options,
    )


def _tokens(spec: str) -> list[str]:
    """Words, lower-cased except quantities (`mem>=40Gi`), whose suffixes are case-sensitive."""
    spaced = re.sub(r"^\s*(\d+)\s*([xX*])\s+", r"\1 x ", spec)
    return [w if w.lower().startswith("mem>=") else w.lower() for w in spaced.split()]


def _count(tokens: list[str], spec: str) -> tuple[int, list[str]]:
    if not tokens:
        raise _bad(spec, "empty spec")
    match = _COUNT.match(tokens[0])
    if match is None:
        return 1, tokens
    count = int(match.group(1))
    rest = tokens[1:]
    if match.group(2) is None and rest and rest[0] in ("x", "*"):
        rest = rest[1:]
    if not 1 <= count <= 32:
        raise _bad(spec, f"count must be between 1 and 32 (a claim's device limit), got {count}")
    return count, rest


def _choice(word: str, spec: str) -> DeviceChoice:
    if is_mig_profile(word):
        return DeviceChoice(mig_profile=word)
    if word in ("gpu", "any"):
        return DeviceChoice()
    if word in _NOT_MODELS or not _MODEL.match(word):
        raise _bad(spec, f"{word!r} is not a GPU model, MIG profile, 'gpu' or 'mig PROFILE'")
    return DeviceChoice(model=word)


def _quantity(text: str, spec: str) -> Quantity:
    try:
        return Quantity.parse(text)
    except (InvalidArgument, ValueError):
        raise _bad(spec, f"{text!r} is not a Kubernetes quantity (e.g. 40Gi)") from None


def _bad(spec: str, description: str) -> InvalidArgument:
    return InvalidArgument.at("spec", f"{spec!r}: {description}")
