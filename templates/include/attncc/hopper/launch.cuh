// attncc/hopper/launch.cuh: the Hopper family's kernels as core/launch.cuh's launch sequence
// takes them: the decode kernels of hopper/kernel.cuh, started with the call's TMA tensor maps
// (hopper/tma.cuh) and, for crossover, in clusters of row-block pairs.
#pragma once

#include <cuda_runtime.h>

#include "attncc/abi.h"
#include "attncc/hopper/kernel.cuh"
#include "attncc/hopper/tma.cuh"
#include "attncc/hopper/traits.cuh"

namespace attncc {
namespace hopper {

// Config C's value-first form (seesaw.cuh: WG1 takes its product of tile a before S_b): the
// second form of a plan with kValueFirstRows > 0 (hopper.py), which a call takes where a kv head
// has at most that many query rows (s_q x group): the products per cache byte are then few and the
// cp.async producer sets the pace.
template <class C>
struct ValueFirst : C {
  static constexpr bool kValueFirst = true;
};

struct Family {
  template <class C>
  static auto decode() { return decode_kernel<C>; }
  template <class C>
  static auto parts() { return decode_parts_kernel<C>; }

  template <class C>
  static constexpr bool has_second() { return C::kValueFirstRows > 0; }
  template <class C>
  using Second = ValueFirst<C>;
  template <class C>
  static bool takes_second(const AttnccArgs& a) { return a.s_q * C::kGroup <= C::kValueFirstRows; }

  template <class Cfg, class Kernel>
  static cudaError_t start(Kernel kernel, unsigned ctas, const AttnccArgs& a, cudaStream_t stream) {
    MapsOf<Cfg> maps;  // the cache tensors for TMA (where the plan copies so), and q with q_tma
    cudaError_t err = encode_tma_maps<Cfg>(maps, a);
    if (err != cudaSuccess) return err;
    constexpr int kClusterCtas = HopperTraits<Cfg>::kClusterCtas;
    if constexpr (kClusterCtas > 1) {  // crossover: clusters of row-block pairs (lanes come in pairs)
      if (ctas % kClusterCtas != 0) return cudaErrorInvalidConfiguration;
      cudaLaunchAttribute cluster[1];
      cluster[0].id = cudaLaunchAttributeClusterDimension;
      cluster[0].val.clusterDim.x = kClusterCtas;
      cluster[0].val.clusterDim.y = 1;
      cluster[0].val.clusterDim.z = 1;
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(ctas);
      config.blockDim = dim3(Cfg::kThreads);
      config.dynamicSmemBytes = Cfg::kSmemBytes;
      config.stream = stream;
      config.attrs = cluster;
      config.numAttrs = 1;
      return cudaLaunchKernelEx(&config, kernel, a, maps);
    } else {
      kernel<<<ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a, maps);
      return cudaGetLastError();
    }
  }
};

}  // namespace hopper
}  // namespace attncc
