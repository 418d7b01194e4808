// attncc/core/launch.cuh: host-side grid arithmetic and argument checks of a decode launch,
// for any family (used by the generated attncc_launch).
#pragma once

#include <atomic>

#include "attncc/abi.h"
#include "attncc/core/work.cuh"

namespace attncc {

template <class Cfg>
struct DecodeLaunch {
  static constexpr int kThreads = Cfg::kThreads;
  static constexpr int kSmemBytes = Cfg::kSmemBytes;

  // Decode CTAs per (batch entry, split); the split-mode grid is batch * num_splits * this.
  static int ctas_per_split(int s_q) { return lanes(s_q) * (Cfg::kSparse ? s_q : 1); }
  static int lanes(int s_q) { return CtaWork<Cfg>::lanes(s_q); }
  static long long ctas(const AttnccArgs& a) {
    return a.num_parts > 0 ? 1LL * a.num_parts * lanes(a.s_q) : 1LL * a.batch * a.num_splits * ctas_per_split(a.s_q);
  }

  // cudaSuccess when the launch may go ahead (batch 0: nothing to do, pointers unchecked).
  static cudaError_t check(const AttnccArgs& a) {
    if (a.s_q < 1 || a.s_q > Cfg::kMaxSq || a.batch < 0 || a.num_splits < 1 || a.num_parts < 0) return cudaErrorInvalidValue;
    if (a.num_parts > 0 && a.num_splits != 1) return cudaErrorInvalidValue;
    if (a.batch == 0) return cudaSuccess;
    if (!a.q || !a.out || !a.lse) return cudaErrorInvalidValue;
    if (Cfg::kSparse ? !a.indices : (!a.block_table || !a.seqlens)) return cudaErrorInvalidValue;
    if ((a.num_splits > 1 || a.num_parts > 0) && (!a.partial_out || !a.partial_lse)) return cudaErrorInvalidValue;
    if (ctas(a) > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    return cudaSuccess;
  }
};

// A kernel's dynamic shared-memory limit, raised once per device (bit d of `devices`): the
// attribute is a driver call, and a decode launch happens in every layer of every step.
struct SmemLimit {
  std::atomic<unsigned> devices{0};

  cudaError_t raise(const void* kernel, int bytes) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    const unsigned bit = device < 32 ? 1u << device : 0u;  // past 32 devices: every launch
    if (bit != 0u && (devices.load(std::memory_order_acquire) & bit) != 0u) return cudaSuccess;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess) devices.fetch_or(bit, std::memory_order_release);
    return err;
  }
};

}  // namespace attncc
