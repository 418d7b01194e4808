// attncc/core/trace.cuh: a clock trace of one CTA's phases, for bench/clock_trace.py. Off (every
// ATTNCC_TRACE a no-op, the kernels unchanged) unless the source defines ATTNCC_TRACE_CTA, the
// block index to trace, before it includes the kernel headers.
//
// ATTNCC_TRACE(who, role, slot, event): where `who` holds (one thread of a role), the SM's clock64
// into trace_clock[role][slot][event] of the traced CTA; a role is a warp group (0, 1: the consumers,
// 2: the producer), a slot its pair or tile of the CTA's stream, an event a phase boundary (the
// schedule's own numbering: bench/clock_trace.py names them). The host reads the array back through
// attncc_trace_read (and zeroes it through attncc_trace_clear) of the built library; both return
// a cudaError_t.
#pragma once

#ifdef ATTNCC_TRACE_CTA
#include <cuda_runtime.h>

namespace attncc {
constexpr int kTraceRoles = 3, kTraceSlots = 1024, kTraceEvents = 8;
__device__ unsigned long long trace_clock[kTraceRoles][kTraceSlots][kTraceEvents];

__device__ __forceinline__ void trace(bool who, int role, int slot, int event) {
  if (who && blockIdx.x == ATTNCC_TRACE_CTA && slot >= 0 && slot < kTraceSlots) {
    unsigned long long c;
    asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(c)::"memory");
    trace_clock[role][slot][event] = c;
  }
}
}  // namespace attncc

// dst holds `bytes`, which must be the array's size (else cudaErrorInvalidValue, nothing read).
extern "C" int attncc_trace_read(unsigned long long* dst, size_t bytes) {
  if (bytes != sizeof(attncc::trace_clock)) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaMemcpyFromSymbol(dst, attncc::trace_clock, sizeof(attncc::trace_clock)));
}
extern "C" int attncc_trace_clear() {
  static unsigned long long zeros[attncc::kTraceRoles * attncc::kTraceSlots * attncc::kTraceEvents];
  return static_cast<int>(cudaMemcpyToSymbol(attncc::trace_clock, zeros, sizeof(zeros)));
}
#define ATTNCC_TRACE(who, role, slot, event) ::attncc::trace((who), (role), (slot), (event))
#else
#define ATTNCC_TRACE(who, role, slot, event) ((void)0)
#endif
