// attncc/hopper/barrier.cuh: sm_90a pipeline primitives, one function per PTX instruction (PTX
// ISA 9.7.13.15 mbarrier, 9.7.9.25 cp.async.mbarrier.arrive, 9.7.13.4 membar/fence.proxy,
// 9.7.19.5 setmaxnreg): what a producer warp group and its consumers hand KV stages over with.
//
//   producer, stage s:  wait EMPTY[s] (phase), issue cp.async into s,
//                       cp_async_arrive(FULL[s])        the arrival lands when the copies do
//                       (or, producer_fences: wait for the copies, fence_async_shared(), arrive)
//   consumer, stage s:  wait FULL[s] (phase), fence_async_shared() before wgmma reads it
//                       (where the writer could not fence: traits.cuh, consumer_fences),
//                       ... wgmma ..., arrive(EMPTY[s]) once its products are done (wait_group)
//
// The Hopper family (kernel.cuh, produce.cuh, the consumers' headers) uses every one; the
// warp-specialized decode tile of tests/test_wgmma.py runs them alone on the device.
#pragma once

#include <cstdint>

namespace attncc {
namespace hopper {

// A barrier that completes a phase when `count` threads have arrived.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Make the inits visible to the async proxy and the other threads (after mbarrier_init, before
// the barrier's first use by another thread: with a __syncthreads).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}

// `count` arrivals at once (a warp group standing in for two: a stacked stage read by one group).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar, int count) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar), "r"(count) : "memory");
}

// This thread's arrival is counted when all its cp.async issued so far have landed (noinc:
// the arrival is one of the `count` the barrier was initialised with).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// An arrival that also expects `bytes` more of asynchronous copies (TMA, complete_tx) in the
// current phase: the phase completes when its arrivals are in and those bytes have landed.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Spin until phase `parity` (0, 1, 0, ...) of the barrier has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Generic-proxy writes (st.shared, cp.async) become visible to the async proxy (wgmma, TMA).
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Warp-group register budgets: producers give registers back, consumers take them.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace hopper
}  // namespace attncc
