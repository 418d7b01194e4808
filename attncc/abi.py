"""The host's side of templates/include/attncc/abi.h: the ctypes mirror of AttnccArgs and
the loader of a built library, which refuses a library built for another ABI.

abi.h is the one definition of the ABI version, the cache-tensor and segment limits and the
flag bits: they are read from it here. The struct's fields are mirrored by hand; the loader compares its size with
the library's sizeof(AttnccArgs), and a CPU test compares every field's offset with a C
compiler's."""
from __future__ import annotations

import ctypes
import re
from functools import lru_cache
from pathlib import Path

from .resources import TEMPLATES_DIR

HEADER = TEMPLATES_DIR / "include" / "attncc" / "abi.h"


@lru_cache(maxsize=None)
def header_define(name: str) -> int:
    """An integer `#define` of abi.h."""
    found = re.search(rf"^#define {name} (\d+)\s*(?:/\*.*\*/\s*)?$", HEADER.read_text(), re.M)
    if found is None:
        raise RuntimeError(f"{HEADER} defines no {name}")
    return int(found.group(1))


ABI_VERSION = header_define("ATTNCC_ABI_VERSION")
MAX_TENSORS = header_define("ATTNCC_MAX_TENSORS")
MAX_SEGMENTS = header_define("ATTNCC_MAX_SEGMENTS")
# the bits a kernel ORs into AttnccArgs.flags for a bad value (devicecheck.py names them)
FLAG_SLOT = header_define("ATTNCC_FLAG_SLOT")
FLAG_PAGE = header_define("ATTNCC_FLAG_PAGE")
FLAG_SEQLEN = header_define("ATTNCC_FLAG_SEQLEN")
FLAG_INDEX = header_define("ATTNCC_FLAG_INDEX")
FLAG_SCHEDULE = header_define("ATTNCC_FLAG_SCHEDULE")
SCHEDULE_LINE_BYTES = header_define("ATTNCC_SCHEDULE_LINE_BYTES")  # a part's line of k.plan's schedule


class AttnccArgs(ctypes.Structure):
    """Mirror of abi.h's AttnccArgs, field for field."""

    _fields_ = [
        ("q", ctypes.c_void_p), ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p),
        ("tensors", ctypes.c_void_p * MAX_TENSORS),
        ("page_stride", ctypes.c_int * MAX_TENSORS), ("token_stride", ctypes.c_int * MAX_TENSORS),
        ("head_stride", ctypes.c_int * MAX_TENSORS), ("num_pages", ctypes.c_int),
        ("block_table", ctypes.c_void_p), ("block_table_stride", ctypes.c_int), ("block_table_cols", ctypes.c_int),
        ("seqlens", ctypes.c_void_p), ("indices", ctypes.c_void_p),
        ("partial_out", ctypes.c_void_p), ("partial_lse", ctypes.c_void_p),
        ("batch", ctypes.c_int), ("s_q", ctypes.c_int), ("num_splits", ctypes.c_int),
        ("num_parts", ctypes.c_int), ("schedule", ctypes.c_void_p), ("softmax_scale", ctypes.c_float), ("flags", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
    ]


class AttnccWriteArgs(ctypes.Structure):
    """Mirror of abi.h's AttnccWriteArgs, field for field."""

    _fields_ = [
        ("tensors", ctypes.c_void_p * MAX_TENSORS),
        ("page_stride", ctypes.c_int * MAX_TENSORS), ("token_stride", ctypes.c_int * MAX_TENSORS),
        ("head_stride", ctypes.c_int * MAX_TENSORS), ("num_pages", ctypes.c_int),
        ("slots", ctypes.c_void_p), ("slots_are_64bit", ctypes.c_int), ("n", ctypes.c_int),
        ("values", ctypes.c_void_p * MAX_SEGMENTS), ("value_dtype", ctypes.c_int * MAX_SEGMENTS),
        ("value_token_stride", ctypes.c_longlong * MAX_SEGMENTS),
        ("value_head_stride", ctypes.c_longlong * MAX_SEGMENTS),
        ("flags", ctypes.c_void_p), ("stream", ctypes.c_void_p),
    ]


# AttnccWriteArgs.value_dtype of a values tensor, by torch dtype name
VALUE_DTYPES = {"float32": header_define("ATTNCC_VALUES_F32"), "bfloat16": header_define("ATTNCC_VALUES_BF16"),
                "float16": header_define("ATTNCC_VALUES_F16")}


class AbiMismatch(RuntimeError):
    """A library built for another ABI than this attncc's."""


class Library:
    """A loaded kernel library (C ABI): attncc_launch(const AttnccArgs*) and
    attncc_write_cache(const AttnccWriteArgs*) -> cudaError_t."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.dll = ctypes.CDLL(str(self.path))
        check_abi(self.dll, self.path)
        self.dll.attncc_launch.argtypes = [ctypes.POINTER(AttnccArgs)]
        self.dll.attncc_launch.restype = ctypes.c_int
        self.dll.attncc_write_cache.argtypes = [ctypes.POINTER(AttnccWriteArgs)]
        self.dll.attncc_write_cache.restype = ctypes.c_int
        self.dll.attncc_plan_schedule.argtypes = [ctypes.POINTER(AttnccArgs), ctypes.c_void_p]
        self.dll.attncc_plan_schedule.restype = ctypes.c_int
        self._ctas_per_sm = None

    def ctas_per_sm(self) -> int:
        """Decode CTAs one SM holds at once (the occupancy API, asked once)."""
        if self._ctas_per_sm is None:
            self._ctas_per_sm = max(1, self.dll.attncc_ctas_per_sm())
        return self._ctas_per_sm

    def launch(self, args: AttnccArgs) -> None:
        status = self.dll.attncc_launch(ctypes.byref(args))
        if status != 0:
            self.fail(status)

    def plan_schedule(self, args: AttnccArgs, lines: int) -> None:
        """A step's schedule (abi.h attncc_plan_schedule) into the device buffer at `lines`."""
        status = self.dll.attncc_plan_schedule(ctypes.byref(args), ctypes.c_void_p(lines))
        if status != 0:
            self.fail(status)

    def write_cache(self, args: AttnccWriteArgs) -> None:
        status = self.dll.attncc_write_cache(ctypes.byref(args))
        if status != 0:
            self.fail(status)

    def fail(self, status: int) -> None:
        """Raise the error of a launch that returned `status` (a cudaError_t)."""
        raise RuntimeError(f"attncc kernel launch failed: CUDA error {status} "
                           f"({cuda_error_name(status)}) in {self.path}")


def check_abi(dll, path) -> None:
    """Refuse a library whose ABI version, AttnccArgs or AttnccWriteArgs size is not this attncc's."""
    try:
        version, size = dll.attncc_abi_version(), dll.attncc_args_size()
    except AttributeError:
        raise AbiMismatch(f"{path} exports no attncc_abi_version: it was built by an attncc "
                          f"older than ABI version {ABI_VERSION}; delete it (or its cache "
                          "entry) and build again") from None
    if version != ABI_VERSION or size != ctypes.sizeof(AttnccArgs):
        raise AbiMismatch(f"{path} was built for attncc ABI version {version} (AttnccArgs of "
                          f"{size} bytes); this attncc speaks version {ABI_VERSION} "
                          f"({ctypes.sizeof(AttnccArgs)} bytes): rebuild the library")
    if not hasattr(dll, "attncc_write_args_size"):
        raise AbiMismatch(f"{path} exports no attncc_write_args_size (ABI version {ABI_VERSION} has "
                          "write_cache's kernel): rebuild the library")
    write_size = dll.attncc_write_args_size()
    if write_size != ctypes.sizeof(AttnccWriteArgs):
        raise AbiMismatch(f"{path} was built with an AttnccWriteArgs of {write_size} bytes; this attncc's "
                          f"is {ctypes.sizeof(AttnccWriteArgs)} bytes: rebuild the library")


def cuda_error_name(status: int) -> str:
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            runtime = ctypes.CDLL(name)
        except OSError:
            continue
        runtime.cudaGetErrorString.restype = ctypes.c_char_p
        return runtime.cudaGetErrorString(status).decode()
    return "unknown"
