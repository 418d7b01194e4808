// attncc/hopper/tma.cuh: the Hopper family's TMA copies of KV boxes (PTX ISA 9.7.9.27
// cp.async.bulk.tensor; the tensor map, CUDA driver API cuTensorMapEncodeTiled).
//
// Each cache tensor is described to the TMA unit as a 3-D tensor of 16-bit elements
//     { record (kTokenStride / 2 elements), token of a page (P), page (num_pages) }
// at the call's token and page strides (abi.h: multiples of 16 bytes, a 16-byte aligned base),
// copied in boxes of { 64 columns, kTmaRows tokens, 1 page } with the 128-byte swizzle: a box of
// tile_n tokens (a page of tile_n or more), or of a whole page of kTmaRows (a multiple of 8) at
// row j kTmaRows of it, lands in a stage's box (1024-byte aligned) exactly as the consumers' wgmma
// descriptors read it (sw128). The maps are built by the host per launch (a pure host
// function, no device work) and passed as a __grid_constant__ parameter.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attncc/abi.h"
#include "attncc/core/common.cuh"
#include "attncc/hopper/traits.cuh"

namespace attncc {
namespace hopper {

// The tensor maps of a plan's cache tensors (a kernel parameter; the same type for a plan and
// its ContiguousCache kernels).
template <int kTensors>
struct TmaMaps {
  CUtensorMap map[kTensors];
};

// Fills the maps of the call's cache tensors (nothing when the plan copies by cp.async).
template <class Cfg>
cudaError_t encode_tma_maps(TmaMaps<Cfg::kNumTensors>& maps, const AttnccArgs& a) {
  if constexpr (Cfg::kTmaRows == 0) {
    return cudaSuccess;
  } else {
    static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled = nullptr;
    if (encode_tiled == nullptr) {
      cudaDriverEntryPointQueryResult found;
      void* fn = nullptr;
      const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
      if (err != cudaSuccess) return err;
      if (found != cudaDriverEntryPointSuccess || fn == nullptr) return cudaErrorNotSupported;
      encode_tiled = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
    const CUtensorMapDataType type = Cfg::kElem == Dtype::kFP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    for (int t = 0; t < Cfg::kNumTensors; ++t) {
      const cuuint64_t dims[3] = {static_cast<cuuint64_t>(Cfg::kTokenStride[t] / 2), static_cast<cuuint64_t>(Cfg::kPageSize),
                                  static_cast<cuuint64_t>(a.num_pages > 0 ? a.num_pages : 1)};
      const cuuint64_t strides[2] = {static_cast<cuuint64_t>(a.token_stride[t]), static_cast<cuuint64_t>(a.page_stride[t])};
      const cuuint32_t box[3] = {kBoxCols, static_cast<cuuint32_t>(Cfg::kTmaRows), 1};
      const cuuint32_t element_strides[3] = {1, 1, 1};
      const CUresult r = encode_tiled(&maps.map[t], type, 3, const_cast<void*>(a.tensors[t]), dims, strides, box, element_strides,
                                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
    }
    return cudaSuccess;
  }
}

// One TMA copy: the box at element coordinates (col, token of the page, page) of `map` into
// shared memory at dst, its bytes counted on mbarrier `bar` (complete_tx).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int col, int token, int page, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(token), "r"(page), "r"(bar)
      : "memory");
}

}  // namespace hopper
}  // namespace attncc
