// attncc/mma_sync/launch.cuh: the mma_sync family's kernels as core/launch.cuh's launch sequence
// takes them: the decode kernels of mma_sync/kernel.cuh, a plain launch.
#pragma once

#include <cuda_runtime.h>

#include "attncc/abi.h"
#include "attncc/mma_sync/kernel.cuh"

namespace attncc {
namespace mma_sync {

struct Family {
  template <class C>
  static auto decode() { return decode_kernel<C>; }
  template <class C>
  static auto parts() { return decode_parts_kernel<C>; }

  template <class Cfg, class Kernel>
  static cudaError_t start(Kernel kernel, unsigned ctas, const AttnccArgs& a, cudaStream_t stream) {
    kernel<<<ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a);
    return cudaGetLastError();
  }
};

}  // namespace mma_sync
}  // namespace attncc
