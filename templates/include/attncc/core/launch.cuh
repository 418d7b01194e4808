// attncc/core/launch.cuh: host-side grid arithmetic, argument checks and the launch sequence of
// a decode call, for any family (the generated translation unit's attncc_launch and
// attncc_ctas_per_sm call launch<Cfg, Family> and ctas_per_sm<Cfg, Family>). A family names its
// kernels and how one starts:
//     struct Family {
//       template <class C> static auto decode();   // the split-mode kernel of config C
//       template <class C> static auto parts();    // the part-mode kernel
//       template <class C, class Kernel>           // its launch on `ctas` CTAs
//       static cudaError_t start(Kernel kernel, unsigned ctas, const AttnccArgs& a, cudaStream_t stream);
//     };
// and may give a plan's kernels a second form, the same plan with one choice the other way that
// only some calls gain from (hopper's value-first seesaw where a kv head has few query rows; the
// combine is the plan's either way); a family without one declares nothing of it:
//       template <class C> static constexpr bool has_second();             // C's kernels have one,
//       template <class C> using Second = ...;                              // ... its config,
//       template <class C> static bool takes_second(const AttnccArgs& a);  // ... the calls that take it
#pragma once

#include <atomic>
#include <type_traits>

#include "attncc/abi.h"
#include "attncc/core/combine.cuh"
#include "attncc/core/paging.cuh"
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

// CTAs of the part-mode kernel an SM holds (the lowering's part count asks), 0 on an error.
template <class Cfg, class Family>
int ctas_per_sm() {
  const auto kernel = Family::template parts<Cfg>();
  int n = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, DecodeLaunch<Cfg>::kSmemBytes) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, DecodeLaunch<Cfg>::kThreads, DecodeLaunch<Cfg>::kSmemBytes) != cudaSuccess)
    return 0;
  return n;
}

// The decode kernel of config Form (of the contiguous cache where the call's strides allow,
// core/paging.cuh; split or part mode as the call says) started on the call's grid.
template <class Form, class Family>
cudaError_t start_decode(const AttnccArgs& a, cudaStream_t stream) {
  using Contiguous = ContiguousCache<Form>;
  const bool contiguous = cache_is_contiguous<Form>(a);
  const auto kernel = a.num_parts > 0 ? (contiguous ? Family::template parts<Contiguous>() : Family::template parts<Form>())
                                      : (contiguous ? Family::template decode<Contiguous>() : Family::template decode<Form>());
  static SmemLimit limits[4];  // one per kernel above
  const cudaError_t err =
      limits[(a.num_parts > 0 ? 2 : 0) + (contiguous ? 1 : 0)].raise(reinterpret_cast<const void*>(kernel), DecodeLaunch<Form>::kSmemBytes);
  if (err != cudaSuccess) return err;
  return Family::template start<Form>(kernel, static_cast<unsigned>(DecodeLaunch<Form>::ctas(a)), a, stream);
}

// Whether Family gives Cfg's kernels a second form (a family without has_second: none).
template <class Family, class Cfg, class = void>
struct HasSecondForm : std::false_type {};
template <class Family, class Cfg>
struct HasSecondForm<Family, Cfg, std::enable_if_t<Family::template has_second<Cfg>()>> : std::true_type {};

// A decode call: checks, the decode kernel (the plan's form or, where the family has a second
// form and the call takes it, that), then the combine.
template <class Cfg, class Family>
int launch(const AttnccArgs* args) {
  if (args == nullptr) return cudaErrorInvalidValue;
  const AttnccArgs& a = *args;
  cudaError_t err = DecodeLaunch<Cfg>::check(a);
  if (err != cudaSuccess || a.batch == 0) return err;
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  if constexpr (HasSecondForm<Family, Cfg>::value) {
    err = Family::template takes_second<Cfg>(a) ? start_decode<typename Family::template Second<Cfg>, Family>(a, stream)
                                                : start_decode<Cfg, Family>(a, stream);
  } else {
    err = start_decode<Cfg, Family>(a, stream);
  }
  return err != cudaSuccess ? err : CombineLaunch<Cfg>::launch(a, stream);
}

}  // namespace attncc
