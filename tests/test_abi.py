"""The C ABI (templates/include/attncc/abi.h) and its host mirror (attncc/abi.py), on CPU.

abi.h is the one definition of the ABI version and the tensor limit; the ctypes struct must
match a C compiler's layout of AttnccArgs field for field; a library built for another ABI
is refused with a message that says what to do."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import textwrap
import warnings
from pathlib import Path

import pytest

import attncc
import attncc.build
from attncc import abi

from support import have_nvcc

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")


def _c_program(tmp_path: Path, body: str) -> str:
    src = tmp_path / "probe.c"
    src.write_text(textwrap.dedent(f"""\
        #include <stddef.h>
        #include <stdio.h>
        #include "attncc/abi.h"
        int main(void) {{
        {body}
          return 0;
        }}
        """))
    exe = tmp_path / "probe"
    subprocess.run([CC, "-I", str(abi.HEADER.parent.parent), str(src), "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


def _checked_mirror(tmp_path, struct, extra: str = "") -> dict:
    """A C compiler's offset of every field of ctypes struct `struct` (its C name the class's)
    and its size, asserted equal to the mirror's; returns what `extra`'s printf lines print."""
    names = [name for name, _ in struct._fields_]
    body = "\n".join(f'  printf("{n} %zu\\n", offsetof({struct.__name__}, {n}));' for n in names)
    body += f'\n  printf("sizeof %zu\\n", sizeof({struct.__name__}));' + extra
    c = dict(line.split() for line in _c_program(tmp_path, body).splitlines())
    for name in names:
        assert int(c[name]) == getattr(struct, name).offset, name
    assert int(c["sizeof"]) == ctypes.sizeof(struct)
    return c


@needs_cc
def test_ctypes_mirror_matches_the_c_layout(tmp_path):
    c = _checked_mirror(tmp_path, abi.AttnccArgs, '\n  printf("ABI_VERSION %d\\n", ATTNCC_ABI_VERSION);'
                                                 '\n  printf("MAX_TENSORS %d\\n", ATTNCC_MAX_TENSORS);')
    assert int(c["ABI_VERSION"]) == abi.ABI_VERSION and int(c["MAX_TENSORS"]) == abi.MAX_TENSORS


@needs_cc
def test_ctypes_mirror_of_the_write_arguments_matches_the_c_layout(tmp_path):
    c = _checked_mirror(tmp_path, abi.AttnccWriteArgs,
                        '\n  printf("MAX_SEGMENTS %d\\n", ATTNCC_MAX_SEGMENTS);\n  printf("FLAG_SLOT %d\\n", ATTNCC_FLAG_SLOT);'
                        '\n  printf("F32 %d\\nBF16 %d\\nF16 %d\\n", ATTNCC_VALUES_F32, ATTNCC_VALUES_BF16, ATTNCC_VALUES_F16);')
    assert int(c["MAX_SEGMENTS"]) == abi.MAX_SEGMENTS == len(abi.AttnccWriteArgs().values)
    assert int(c["FLAG_SLOT"]) == abi.FLAG_SLOT
    assert [int(c[k]) for k in ("F32", "BF16", "F16")] == [abi.VALUE_DTYPES[k] for k in ("float32", "bfloat16", "float16")]


def test_version_and_tensor_limit_come_from_the_header():
    text = abi.HEADER.read_text()
    assert f"#define ATTNCC_ABI_VERSION {abi.ABI_VERSION}\n" in text
    assert f"#define ATTNCC_MAX_TENSORS {abi.MAX_TENSORS}\n" in text
    assert len(abi.AttnccArgs().tensors) == abi.MAX_TENSORS
    with pytest.raises(RuntimeError, match="defines no ATTNCC_NOPE"):
        abi.header_define("ATTNCC_NOPE")


def _fake_library(tmp_path: Path, exports: str) -> Path:
    src = tmp_path / "fake.c"
    src.write_text(exports)
    lib = tmp_path / "fake.so"
    subprocess.run([CC, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, capture_output=True)
    return lib


@needs_cc
def test_library_of_another_version_is_refused(tmp_path):
    lib = _fake_library(tmp_path, f"int attncc_abi_version(void) {{ return {abi.ABI_VERSION + 1}; }}\n"
                                  f"int attncc_args_size(void) {{ return {ctypes.sizeof(abi.AttnccArgs)}; }}\n")
    with pytest.raises(abi.AbiMismatch) as info:
        abi.Library(lib)
    message = str(info.value)
    assert str(lib) in message and f"version {abi.ABI_VERSION + 1}" in message
    assert f"speaks version {abi.ABI_VERSION}" in message and "rebuild" in message


@needs_cc
def test_library_with_another_struct_size_is_refused(tmp_path):
    lib = _fake_library(tmp_path, f"int attncc_abi_version(void) {{ return {abi.ABI_VERSION}; }}\n"
                                  f"int attncc_args_size(void) {{ return {ctypes.sizeof(abi.AttnccArgs) + 8}; }}\n")
    with pytest.raises(abi.AbiMismatch, match=f"{ctypes.sizeof(abi.AttnccArgs) + 8} bytes"):
        abi.Library(lib)


@needs_cc
def test_library_with_another_write_struct_size_is_refused(tmp_path):
    exports = (f"int attncc_abi_version(void) {{ return {abi.ABI_VERSION}; }}\n"
               f"int attncc_args_size(void) {{ return {ctypes.sizeof(abi.AttnccArgs)}; }}\n")
    lib = _fake_library(tmp_path, exports + f"int attncc_write_args_size(void) {{ return "
                                            f"{ctypes.sizeof(abi.AttnccWriteArgs) - 8}; }}\n")
    with pytest.raises(abi.AbiMismatch, match=f"AttnccWriteArgs of {ctypes.sizeof(abi.AttnccWriteArgs) - 8} bytes"):
        abi.Library(lib)
    (tmp_path / "none").mkdir()
    lib = _fake_library(tmp_path / "none", exports)
    with pytest.raises(abi.AbiMismatch, match="exports no attncc_write_args_size"):
        abi.Library(lib)


@needs_cc
def test_library_from_before_the_versioned_abi_is_refused(tmp_path):
    lib = _fake_library(tmp_path, "int attncc_launch(const void* a) { return 0; }\n")
    with pytest.raises(abi.AbiMismatch, match="exports no attncc_abi_version.*older"):
        abi.Library(lib)




@pytest.mark.skipif(not have_nvcc(), reason="nvcc not found")
def test_a_built_library_passes_the_check(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = attncc.compile("examples/gqa8.attn").plan
    library, _, _ = attncc.build.compile_source(plan, tmp_path, progress=False)
    dll = ctypes.CDLL(str(library))
    assert dll.attncc_abi_version() == abi.ABI_VERSION
    assert dll.attncc_args_size() == ctypes.sizeof(abi.AttnccArgs)
    abi.check_abi(dll, library)  # no error
