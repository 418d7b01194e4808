// attncc/core/trace.cuh: a clock trace of one CTA's phases, for bench/clock_trace.py. Off (every
// ATTNCC_TRACE a no-op, the kernels unchanged) unless the source defines ATTNCC_TRACE_CTA, the
// block index to trace, before it includes the kernel headers.
//
// ATTNCC_TRACE(who, role, slot, event): where `who` holds (one thread of a role), the SM's clock64
// into trace_clock[role][slot][event] of the traced CTA; a role is a warp group (0, 1: the consumers,
// 2: the producer), a slot its pair or tile of the CTA's stream, an event a phase boundary (the
// schedule's own numbering: bench/clock_trace.py names them); role 3 is the consumers' pieces (slot:
// the piece's first pair in the stream; 0 the piece begins, 1 its Q has landed, 2 its results are
// written); role 4 (kTraceStart) the CTA's start, in slot 0 (0 the barriers are initialized, 1 warp 0
// has started the walk (part mode), 2 the CTA has met, 3 the producer and 4 the consumers are past
// setmaxnreg: thread 0 of each; the producer's thread 0 in its first piece: 5 the piece's length
// read, 6 its first tile's page numbers read, each event's condition waiting for the value).
// ATTNCC_TRACE_SPAN(end), thread 0 of every CTA (not only the traced one): the global timer (ns)
// and the SM clock when the CTA begins (end 0) and when it is done (end 1), so that the
// host sees the grid's balance and the clock's rate. The host reads the arrays back through
// attncc_trace_read and attncc_trace_read_span (and zeroes both through attncc_trace_clear) of the
// built library; each returns a cudaError_t.
#pragma once

#ifdef ATTNCC_TRACE_CTA
#include <cuda_runtime.h>

namespace attncc {
constexpr int kTraceRoles = 5, kTraceSlots = 1024, kTraceEvents = 8, kTraceCtas = 4096;
constexpr int kTraceStart = 4;  // the role of the CTA's start (slot 0)
__device__ unsigned long long trace_clock[kTraceRoles][kTraceSlots][kTraceEvents];
__device__ unsigned long long trace_span[kTraceCtas][2][2];  // [cta][begin, end][global ns, clock]

__device__ __forceinline__ void trace(bool who, int role, int slot, int event) {
  if (who && blockIdx.x == ATTNCC_TRACE_CTA && slot >= 0 && slot < kTraceSlots) {
    unsigned long long c;
    asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(c)::"memory");
    trace_clock[role][slot][event] = c;
  }
}

__device__ __forceinline__ void trace_span_at(int end) {
  if (threadIdx.x == 0 && blockIdx.x < kTraceCtas) {
    unsigned long long ns, c;
    asm volatile("mov.u64 %0, %%globaltimer;\nmov.u64 %1, %%clock64;\n" : "=l"(ns), "=l"(c)::"memory");
    trace_span[blockIdx.x][end][0] = ns;
    trace_span[blockIdx.x][end][1] = c;
  }
}
}  // namespace attncc

// dst holds `bytes`, which must be the array's size (else cudaErrorInvalidValue, nothing read).
extern "C" int attncc_trace_read(unsigned long long* dst, size_t bytes) {
  if (bytes != sizeof(attncc::trace_clock)) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaMemcpyFromSymbol(dst, attncc::trace_clock, sizeof(attncc::trace_clock)));
}
extern "C" int attncc_trace_read_span(unsigned long long* dst, size_t bytes) {
  if (bytes != sizeof(attncc::trace_span)) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaMemcpyFromSymbol(dst, attncc::trace_span, sizeof(attncc::trace_span)));
}
extern "C" int attncc_trace_clear() {
  static unsigned long long zeros[attncc::kTraceRoles * attncc::kTraceSlots * attncc::kTraceEvents];
  static unsigned long long span_zeros[attncc::kTraceCtas * 4];
  const cudaError_t e = cudaMemcpyToSymbol(attncc::trace_clock, zeros, sizeof(zeros));
  return static_cast<int>(e != cudaSuccess ? e : cudaMemcpyToSymbol(attncc::trace_span, span_zeros, sizeof(span_zeros)));
}
#define ATTNCC_TRACE(who, role, slot, event) ::attncc::trace((who), (role), (slot), (event))
#define ATTNCC_TRACE_SPAN(end) ::attncc::trace_span_at(end)
#else
#define ATTNCC_TRACE(who, role, slot, event) ((void)0)
#define ATTNCC_TRACE_SPAN(end) ((void)0)
#endif
