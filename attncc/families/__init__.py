"""Kernel families: each target's families in preference order. The lowering
(attncc/lower.py) walks them and takes the first that accepts the spec and every knob the
user wrote. A new family is a module here (its Family subclass and KernelConfig), a folder
of device headers under templates/include/attncc/<family>/ that includes only core/ and its
own headers, whose launch.cuh names its kernels as core/launch.cuh takes them (templates/decode.cu.j2,
every family's translation unit, includes it); it is added to FAMILIES below, in the place of its
preference."""
from __future__ import annotations

from .base import COMMON_KNOBS, Family, KernelConfig, Refusal
from .hopper import HopperConfig, HopperFamily
from .mma_sync import MmaSyncConfig, MmaSyncFamily

FAMILIES: tuple[Family, ...] = (HopperFamily(), MmaSyncFamily())


def for_target(target: str) -> tuple[Family, ...]:
    """The target's families, most preferred first."""
    return tuple(f for f in FAMILIES if target in f.targets)


def by_name(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


__all__ = ["COMMON_KNOBS", "FAMILIES", "Family", "HopperConfig", "HopperFamily", "KernelConfig", "MmaSyncConfig",
           "MmaSyncFamily", "Refusal", "by_name", "for_target"]
