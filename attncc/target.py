"""Facts about the machines attncc builds for, in one place: per target (the schedule's
`target`: shared memory, SM count, register file, named barriers, what the arch has) and
per GPU (the ceilings `explain` and `bench` compare with). Lowerings, the split policy and
the cost model read these; nothing else states them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str                  # the schedule's `target` value
    arch_flag: str             # nvcc's -gencode for it
    sm_count: int              # the split heuristic's default; a launch reads the real count
    smem_per_block: int        # the largest dynamic shared memory one CTA may ask for
    smem_per_sm: int           # shared memory of one SM, CTAs' reservations included
    smem_reserved_per_block: int  # the runtime's own shared memory per resident CTA
    registers_per_sm: int
    max_registers_per_thread: int
    max_threads_per_sm: int
    named_barriers: int        # bar.sync ids 0..n-1 (0 is __syncthreads)
    wgmma: bool                # warpgroup MMA (sm_90a)
    clusters: bool             # thread-block clusters and distributed shared memory
    dependent_launch: bool     # programmatic dependent launch (griddepcontrol, sm_90)

    def ctas_per_sm(self, threads: int, smem_bytes: int, registers_per_thread: int) -> int:
        """Resident CTAs of one kernel on one SM, by threads, shared memory and registers
        (registers allocated per warp in units of 256)."""
        by_threads = self.max_threads_per_sm // threads
        by_smem = self.smem_per_sm // (smem_bytes + self.smem_reserved_per_block)
        per_warp = -(-registers_per_thread * 32 // 256) * 256
        by_regs = self.registers_per_sm // (per_warp * (threads // 32))
        return max(0, min(by_threads, by_smem, by_regs))


TARGETS = {
    # H100 / H200 (sm_90a: wgmma, setmaxnreg and clusters need the `a` target)
    "sm90a": Target("sm90a", "-gencode=arch=compute_90a,code=sm_90a", sm_count=132,
                    smem_per_block=227 * 1024, smem_per_sm=228 * 1024, smem_reserved_per_block=1024,
                    registers_per_sm=65536, max_registers_per_thread=255, max_threads_per_sm=2048,
                    named_barriers=16, wgmma=True, clusters=True, dependent_launch=True),
    # A100
    "sm80": Target("sm80", "-gencode=arch=compute_80,code=sm_80", sm_count=108,
                   smem_per_block=163 * 1024, smem_per_sm=164 * 1024, smem_reserved_per_block=1024,
                   registers_per_sm=65536, max_registers_per_thread=255, max_threads_per_sm=2048,
                   named_barriers=16, wgmma=False, clusters=False, dependent_launch=False),
}


@dataclass(frozen=True)
class Ceilings:
    """What one GPU was measured to do on the device machine (DESIGN.md, bench/RESULTS.md)."""

    name: str
    target: str
    bandwidth: float  # bytes/s, device-to-device copy
    flops: float      # FLOP/s, bf16 GEMM 8192³


GPUS = {"h200": Ceilings("NVIDIA H200", "sm90a", 4.2e12, 756e12)}
