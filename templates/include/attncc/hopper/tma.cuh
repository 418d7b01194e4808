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
//
// q_tma (the plan's kQTma): q [b, s_q, h_q, d_k] as a 5-D tensor
//     { column (d_k), head of the group (group), kv head (h_kv), query token (s_q), batch (b) }
// copied in boxes of { 64 columns, kQTmaHeads heads, 1, kQTmaTokens tokens, 1 }: a box is a
// 64-column box of the CTA's Q tile, its rows in the CTA's order (query token, head of the
// group: core/work.cuh), and rows past the call's s_q or the group are outside the tensor,
// which TMA fills with zeros, as copy_q's cp.async does past the CTA's rows.
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

// The tensor maps of a plan's cache tensors and, with q_tma, of q (a kernel parameter; the same
// type for a plan and its ContiguousCache kernels: MapsOf).
template <int kTensors, bool kWithQ>
struct TmaMaps {
  CUtensorMap map[kTensors];
};
template <int kTensors>
struct TmaMaps<kTensors, true> {
  CUtensorMap map[kTensors];
  CUtensorMap q;
};
template <class Cfg>
using MapsOf = TmaMaps<Cfg::kNumTensors, Cfg::kQTma>;

// cuTensorMapEncodeTiled, from the driver (once).
inline cudaError_t tensor_map_encoder(PFN_cuTensorMapEncodeTiled_v12000& encode_tiled) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn_once = nullptr;
  if (fn_once == nullptr) {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess) return err;
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) return cudaErrorNotSupported;
    fn_once = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  encode_tiled = fn_once;
  return cudaSuccess;
}

// q_tma: the map of the call's q (the header's 5-D view).
template <class Cfg>
cudaError_t encode_q_map(CUtensorMap& map, PFN_cuTensorMapEncodeTiled_v12000 encode_tiled, const AttnccArgs& a) {
  static_assert(Cfg::kQTmaHeads * Cfg::kQTmaTokens == Cfg::kTileM, "q_tma: a box is the CTA's rows");
  static_assert(!Cfg::kSparse || Cfg::kQTmaTokens == 1, "q_tma: a sparse CTA's rows are one query token's heads");
  constexpr cuuint64_t kRow = static_cast<cuuint64_t>(Cfg::kDK) * 2;  // bytes of a q row
  const cuuint64_t s_q = static_cast<cuuint64_t>(a.s_q > 0 ? a.s_q : 1), batch = static_cast<cuuint64_t>(a.batch > 0 ? a.batch : 1);
  const cuuint64_t dims[5] = {static_cast<cuuint64_t>(Cfg::kDK), static_cast<cuuint64_t>(Cfg::kGroup),
                              static_cast<cuuint64_t>(Cfg::kHeadsKV), s_q, batch};
  const cuuint64_t strides[4] = {kRow, kRow * Cfg::kGroup, kRow * Cfg::kHeadsQ, kRow * Cfg::kHeadsQ * s_q};
  const cuuint32_t box[5] = {kBoxCols, static_cast<cuuint32_t>(Cfg::kQTmaHeads), 1, static_cast<cuuint32_t>(Cfg::kQTmaTokens), 1};
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  // (16-bit elements copied as they are: their type does not matter to the copy)
  const CUresult r = encode_tiled(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 5, const_cast<void*>(a.q), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Fills the maps of the call's cache tensors (nothing when the plan copies by cp.async) and, with
// q_tma, q's.
template <class Cfg>
cudaError_t encode_tma_maps(MapsOf<Cfg>& maps, const AttnccArgs& a) {
  if constexpr (Cfg::kTmaRows == 0 && !Cfg::kQTma) {
    return cudaSuccess;
  } else {
    PFN_cuTensorMapEncodeTiled_v12000 encode_tiled;
    const cudaError_t err = tensor_map_encoder(encode_tiled);
    if (err != cudaSuccess) return err;
    if constexpr (Cfg::kQTma) {
      const cudaError_t q_err = encode_q_map<Cfg>(maps.q, encode_tiled, a);
      if (q_err != cudaSuccess) return q_err;
    }
    if constexpr (Cfg::kTmaRows == 0) return cudaSuccess;
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

// q_tma: one box of the Q tile, at element coordinates (col, head of the group, kv head, query
// token, batch) of q's map, into shared memory at dst, counted on mbarrier `bar`.
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const CUtensorMap* map, int col, int head_of_group, int head, int token,
                                            int batch, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(head_of_group), "r"(head), "r"(token), "r"(batch), "r"(bar)
      : "memory");
}

}  // namespace hopper
}  // namespace attncc
