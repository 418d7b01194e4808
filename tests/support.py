"""Helpers shared by the CPU tests."""
from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import attncc
import attncc.build
from attncc.families.base import SLAB_COLS

# small specs of every cache kind: packed, GQA, sparse fp8, separate fp8 with a shared segment
MLA_SMALL = """
attention mla_small {
    heads q = 4, kv = 1
    cache paged(4) {
        latent: bf16[64]
        rope:   bf16[32]
    }
    key   = latent ++ rope
    value = latent
    query len <= 2 causal
    scale 0.125
}
"""

GQA_SMALL = """
attention gqa_small {
    heads q = 8, kv = 2
    cache paged(4) {
        k: fp16[64]
        v: fp16[64]
    }
    key   = k
    value = v
    query len <= 2
}
"""

SPARSE_SMALL = """
attention sparse_small {
    heads q = 4, kv = 1
    cache paged(4) {
        latent: e4m3[64] scale fp32 per 16
        rope:   bf16[32]
    }
    key   = latent ++ rope
    value = latent
    tokens topk 6
    query len <= 2
}
"""

SEPARATE_SMALL = """
attention separate_small {
    heads q = 8, kv = 2
    cache paged(4) separate {
        latent: e5m2[64] scale fp32 per 16
        rope:   bf16[32] shared
    }
    key   = latent ++ rope
    value = latent
    query len <= 2 causal
}
"""


def compile_quiet(source, family=None):
    """attncc.compile without a tolerated knob's "not yet applied" warning (`family`: on that
    kernel family only, attncc.testing.on_family)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if family:
            from attncc import testing

            return testing.on_family(source, family)
        return attncc.compile(source)


def have_nvcc() -> bool:
    """The CUDA toolkit's nvcc is here (compile-only tests run; nothing needs a GPU)."""
    try:
        attncc.build.nvcc()
        attncc.build.nvcc_version()
    except (attncc.build.BuildError, OSError, subprocess.CalledProcessError):
        return False
    return True


def load_script(path: Path, name: str):
    """A script of the repository (examples/, bench/: not a package) as a module named `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def load_example(name: str):
    """examples/<name>.py as a module."""
    return load_script(Path(__file__).resolve().parent.parent / "examples" / f"{name}.py", name)


@contextlib.contextmanager
def no_host_sync():
    """The work enqueued so far finished, then any host sync inside raises (torch's sync
    debug mode): for calls that must not read the device back."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def seesaw_of(plan):
    """A relay plan with the seesaw's consumers instead (both groups compute S, WG1's products
    value first, the vote's skipped rescales, hopper.py's seesaw registers and its group-fence
    and producer-fence rules): what the lowering chose before the relay."""
    import dataclasses

    from attncc.families import hopper

    cfg = plan.config
    assert cfg.relay
    group_fence = hopper.fences_groups(True, crossover=cfg.crossover, relay=False, seesaw=True)  # (relay: fp8 runs)
    return dataclasses.replace(plan, config=dataclasses.replace(
        cfg, relay=False, value_first=True, skip_unmoved=hopper.skips_unmoved(seesaw=True, relay=False),
        group_fence=group_fence,
        producer_fences=hopper.fences_in_producer(tma_rows=cfg.tma_rows, group_fence=group_fence, crossover=cfg.crossover),
        consumer_registers=hopper.CONSUMER_REGISTERS,
        wg1_registers=hopper.CONSUMER_REGISTERS, producer_registers=hopper.PRODUCER_REGISTERS))


# Kernel-config choices a plan does not take, each on the plans it would change: (spec[~seesaw],
# FIELD=VALUE[:FIELD=VALUE...]): the other side of a choice an A/B made (skip_unmoved,
# producer_fences, tma_rows: hopper.py's explain gives the figures), so that both sides keep
# building (tests/test_build.py) and giving the same bits (tests/test_gpu.py) and a later A/B can
# still compare them.
CHOICES = [
    # skip_unmoved=false: every rescale of O, as before the vote. The seesaw's forms: bf16, two sets
    # of stages, sparse, crossover with value first, an fp8 seesaw
    *[(name, "skip_unmoved=false") for name in ("mla", "mla_page1_h128", "gla2_seesaw", "sparse_bf16_h128",
                                                 "mla_fp8_crossover", "mla_fp8_per128_h64~seesaw")],
    # producer_fences=true where not taken: the producer lands and fences a bf16 cp.async plan's
    # boxes (seesaw page 1, stacked page 5, sparse bf16), the consumers fence none
    *[(name, "producer_fences=true") for name in ("mla_page1_h128", "gla2_page5", "sparse_bf16_h128")],
    # tma_rows=0 producer_fences=false: a page-16 or page-32 plan's tiles by cp.async, the consumers
    # fencing, as lowered before TMA took a copy a page and box (seesaw and stacked)
    *[(name, "tma_rows=0:producer_fences=false") for name in ("mla_page16", "mla_page32_h128", "gla_g96")],
    # spread_copies: a one-page tile's box copies by thread 0 alone (stacked, as before) and by the
    # four producer warps in turn (seesaw)
    ("gla2", "spread_copies=false"), ("mla", "spread_copies=true"),
    # overlap=false on a stacked plan that takes it: a tile's S after the softmax and O += P V of the
    # one before (as before the overlap), at the 232 / 40 registers the overlap's plan has
    ("gla2", "overlap=false"), ("gla2_page5", "overlap=false"),
    # whole_parts=true where not taken: the seesaw's paged cp.async producer on parts of whole sequences
    ("mla_page1_h128", "whole_parts=true"),
    # value_first_rows: the 16-bit cp.async seesaw without its value-first form (0: every call on the
    # plain seesaw) and with it at every call (256: s_q 2 too)
    ("mla_page1_h128", "value_first_rows=0"), ("mla_page1_h128", "value_first_rows=256"),
    # producer_fences=false where taken: an fp8 plan's rope box fenced by the consumers (relay
    # sparse and dense, stacked)
    *[(name, "producer_fences=false") for name in ("sparse_fp8_h128", "mla_fp8_per32_page16", "gla_fp8_e5m2")],
    # producer_q=false where taken: the consumers load each piece's Q themselves (TMA and cp.async seesaw)
    ("mla", "producer_q=false"), ("mla_page1_h128", "producer_q=false"),
    # q_tma, off (measured ~1 % either way, session 56): the Q tile by TMA on every consumer form
    # (seesaw by TMA and by cp.async with its value-first form, both with producer_q's later pieces;
    # stacked of 64 heads x 2 tokens and of 128 heads; the sparse relay; crossover's clusters)
    *[(name, "q_tma=true") for name in ("mla", "mla_page1_h128", "gla2", "mqa256_h128", "sparse_fp8_h128",
                                        "mla_fp8_crossover")],
]


def combine_slabs(d_v: int) -> tuple[int, bool]:
    """A combine row's 128-column slabs (core/combine.cuh kSlabs) and whether it merges them in pairs
    (kPairs: an even number, four or more; the pairs are a combine kernel of their own)."""
    slabs = -(-d_v // SLAB_COLS)
    return slabs, slabs % 2 == 0 and slabs > 2


def form_of(plan, name: str):
    """The plan a CHOICES entry changes: the spec's own, or (name~seesaw) its relay plan's seesaw form."""
    return seesaw_of(plan) if name.endswith("~seesaw") else plan
