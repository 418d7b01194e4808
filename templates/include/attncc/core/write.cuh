// attncc/core/write.cuh: write_cache's kernel (abi.h's AttnccWriteArgs), for any family.
//
// One CTA per token, one launch for the whole record: each segment's values (fp32, bf16 or
// fp16, any token and head strides) are converted to the segment's dtype and stored at the
// token's slot; an fp8 segment is quantized per scale group as attncc/storage.py's quantize
// states it (the contract), bit for bit:
//   amax  = max |v| over the group (NaN if any v is NaN)
//   scale = amax / max_finite if amax > 0, else 1            (IEEE division)
//   q     = fp8(clamp(v / scale, -max_finite, max_finite))    (IEEE division, round to nearest
//                                                              even, NaN stays NaN)
// One warp per (copy, group): its lanes hold the group's values, reduce amax with shuffles,
// and lane 0 stores the scale. A slot of -1 is skipped; one out of range is skipped and flagged.
#pragma once

#include "attncc/abi.h"
#include "attncc/core/common.cuh"

namespace attncc {

constexpr int kWriteThreads = 128;  // one CTA per token: four warps
constexpr int kWriteWarps = kWriteThreads / 32;

// Element i of a values row in the call's dtype (ATTNCC_VALUES_*), as float (exactly).
__device__ __forceinline__ float load_value(const void* row, int dtype, long long i) {
  if (dtype == ATTNCC_VALUES_BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(row)[i]);
  if (dtype == ATTNCC_VALUES_F16) return __half2float(static_cast<const __half*>(row)[i]);
  return static_cast<const float*>(row)[i];
}

__host__ __device__ constexpr int value_bytes(int dtype) { return dtype == ATTNCC_VALUES_F32 ? 4 : 2; }

template <Dtype D>
__device__ __forceinline__ uint8_t to_fp8(float x) {
  static_assert(is_fp8(D), "fp8 only");
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, D == Dtype::kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

// One copy of a 16-bit segment (store kI of the plan): values row `src` -> bytes at `dst`.
template <class Cfg, int kI>
__device__ __forceinline__ void store_16bit(const char* src, int dtype, unsigned char* dst, int tid) {
  constexpr Store kS = Cfg::kStores[kI];
  using T = typename Elem16<kS.dtype>::T;
  for (int e = tid; e < kS.dim; e += kWriteThreads) {
    const T v = Elem16<kS.dtype>::from_float(load_value(src, dtype, e));
    if constexpr (kS.offset_bytes % 2 == 0 && kS.head_stride_bytes % 2 == 0) {
      reinterpret_cast<T*>(dst)[e] = v;
    } else {  // a packed record may place a 16-bit segment at an odd byte
      const uint16_t bits = *reinterpret_cast<const uint16_t*>(&v);
      dst[2 * e] = static_cast<unsigned char>(bits);
      dst[2 * e + 1] = static_cast<unsigned char>(bits >> 8);
    }
  }
}

// One scale group of one copy of an fp8 segment (store kI), by one warp.
template <class Cfg, int kI>
__device__ __forceinline__ void store_fp8_group(const char* src, int dtype, unsigned char* dst, unsigned char* scale_at, int lane) {
  constexpr Store kS = Cfg::kStores[kI];
  constexpr int kPerLane = (kS.scale_group + 31) / 32;
  constexpr float kTop = kS.max_finite;
  static_assert(kTop > 0.0f, "an fp8 segment's range");
  float v[kPerLane];
  float amax = 0.0f;
  bool nan = false;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int e = lane + 32 * k;
    v[k] = e < kS.scale_group ? load_value(src, dtype, e) : 0.0f;
    nan |= isnan(v[k]);
    amax = fmaxf(amax, fabsf(v[k]));
  }
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  // a NaN in the group makes amax NaN, and NaN > 0 is false: the scale is 1
  const float scale = (__any_sync(0xffffffffu, nan) || !(amax > 0.0f)) ? 1.0f : __fdiv_rn(amax, kTop);
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int e = lane + 32 * k;
    if (e >= kS.scale_group) break;
    const float x = __fdiv_rn(v[k], scale);
    dst[e] = to_fp8<kS.dtype>(isnan(x) ? x : fminf(fmaxf(x, -kTop), kTop));
  }
  if (lane == 0) {
    if constexpr (kS.scale_offset_bytes % 4 == 0 && kS.scale_head_stride_bytes % 4 == 0) {
      *reinterpret_cast<float*>(scale_at) = scale;
    } else {  // a packed record may place its scales at any byte
      const uint32_t bits = __float_as_uint(scale);
#pragma unroll
      for (int b = 0; b < 4; ++b) scale_at[b] = static_cast<unsigned char>(bits >> (8 * b));
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(kWriteThreads, 1) write_cache_kernel(const __grid_constant__ AttnccWriteArgs a) {
  const int token = blockIdx.x;
  const long long slot = a.slots_are_64bit ? static_cast<const long long*>(a.slots)[token]
                                           : static_cast<const int*>(a.slots)[token];
  if (slot == -1) return;  // padding
  if (slot < 0 || slot >= 1LL * a.num_pages * Cfg::kPageSize) {
    if (threadIdx.x == 0 && a.flags != nullptr) atomicOr(a.flags, ATTNCC_FLAG_SLOT);
    return;
  }
  // unsigned: a division by the constant page size is a multiply (a signed 64-bit one is a call)
  const unsigned long long page = static_cast<unsigned long long>(slot) / Cfg::kPageSize;
  const long long in_page = static_cast<long long>(static_cast<unsigned long long>(slot) - page * Cfg::kPageSize);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  static_for<Cfg::kNumStores>([&](auto si) {
    constexpr int kI = decltype(si)::value;
    constexpr Store kS = Cfg::kStores[kI];
    const int dtype = a.value_dtype[kI];
    const char* const values = static_cast<const char*>(a.values[kI]) + token * a.value_token_stride[kI] * value_bytes(dtype);
    const long long head_values = a.value_head_stride[kI] * value_bytes(dtype);
    unsigned char* const record = static_cast<unsigned char*>(a.tensors[kS.tensor]) + static_cast<long long>(page) * a.page_stride[kS.tensor] +
                                  in_page * a.token_stride[kS.tensor] + kS.offset_bytes;
    const long long head = Cfg::kHeadAxis[kS.tensor] ? a.head_stride[kS.tensor] : kS.head_stride_bytes;
    if constexpr (!is_fp8(kS.dtype)) {
      for (int j = 0; j < kS.copies; ++j) store_16bit<Cfg, kI>(values + j * head_values, dtype, record + j * head, tid);
    } else {
      static_assert(kS.scale_group > 0 && kS.dim % kS.scale_group == 0, "fp8 segments have whole scale groups");
      constexpr int kGroups = kS.dim / kS.scale_group;
      unsigned char* const scales = static_cast<unsigned char*>(a.tensors[kS.scale_tensor]) + static_cast<long long>(page) * a.page_stride[kS.scale_tensor] +
                                    in_page * a.token_stride[kS.scale_tensor] + kS.scale_offset_bytes;
      const long long scale_head = Cfg::kHeadAxis[kS.scale_tensor] ? a.head_stride[kS.scale_tensor] : kS.scale_head_stride_bytes;
      for (int u = warp; u < kS.copies * kGroups; u += kWriteWarps) {
        const int j = u / kGroups, g = u % kGroups;
        store_fp8_group<Cfg, kI>(values + j * head_values + g * kS.scale_group * value_bytes(dtype), dtype,
                            record + j * head + g * kS.scale_group,
                            scales + j * scale_head + 4 * g, lane);
      }
    }
  });
}

// The launch: checks what it can without reading the device, then one kernel.
template <class Cfg>
int write_cache_checked(const AttnccWriteArgs* args) {
  if (args == nullptr) return cudaErrorInvalidValue;
  const AttnccWriteArgs& a = *args;
  if (a.n < 0 || a.num_pages < 0) return cudaErrorInvalidValue;
  if (a.n == 0) return cudaSuccess;
  if (a.slots == nullptr) return cudaErrorInvalidValue;
  for (int i = 0; i < Cfg::kNumTensors; ++i)
    if (a.tensors[i] == nullptr) return cudaErrorInvalidValue;
  for (int i = 0; i < Cfg::kNumStores; ++i)
    if (a.values[i] == nullptr || a.value_dtype[i] < ATTNCC_VALUES_F32 || a.value_dtype[i] > ATTNCC_VALUES_F16)
      return cudaErrorInvalidValue;
  write_cache_kernel<Cfg><<<a.n, kWriteThreads, 0, static_cast<cudaStream_t>(a.stream)>>>(a);
  return cudaGetLastError();
}

// The generated attncc_write_cache. A record of more segments than AttnccWriteArgs holds is not
// written here (cudaErrorNotSupported: the host writes it with torch ops).
template <class Cfg>
int write_cache_launch(const AttnccWriteArgs* args) {
  if constexpr (Cfg::kNumStores > ATTNCC_MAX_SEGMENTS) {
    return cudaErrorNotSupported;
  } else {
    return write_cache_checked<Cfg>(args);
  }
}

}  // namespace attncc
