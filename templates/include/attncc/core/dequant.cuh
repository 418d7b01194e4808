// attncc/core/dequant.cuh: raw record rows (raw mode) -> the 16-bit staged tile.
//
// For an fp8 run, staged value = elem(float(fp8) * scale), the scale being the fp32 of the
// value's group; for a 16-bit run, a plain copy. One pass per KV tile by all threads; each
// thread converts 16 fp8 values (one 16-byte raw chunk, one scale) into two 16-byte chunks of
// the staged tile. Zero-filled raw rows (masked tokens) convert to zeros.
#pragma once

#include "attncc/core/common.cuh"
#include "attncc/core/copy.cuh"
#include "attncc/core/ptx.cuh"

namespace attncc {

// Two fp8 values (low byte first) -> two floats, exactly (via half: every e4m3 and e5m2 value
// is a half).
template <Dtype D>
__device__ __forceinline__ float2 fp8x2_to_float2(uint16_t v) {
  static_assert(is_fp8(D), "fp8 only");
  constexpr __nv_fp8_interpretation_t kind = D == Dtype::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), kind);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// 16 fp8 values (one uint4) times `scale` -> 16 elements of type E (two uint4).
template <Dtype D, Dtype E>
__device__ __forceinline__ void dequant16(const uint4& in, float scale, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = fp8x2_to_float2<D>(static_cast<uint16_t>(w[i] & 0xffff));
    const float2 b = fp8x2_to_float2<D>(static_cast<uint16_t>(w[i] >> 16));
    o[2 * i] = Elem16<E>::pack(a.x * scale, a.y * scale);
    o[2 * i + 1] = Elem16<E>::pack(b.x * scale, b.y * scale);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// Convert the raw rows at `raw` (Cfg::kRawPitchBytes apart, copy.cuh) of one KV tile into the staged tile at `tile`
// (layout Rows). Caller synchronises before (raw rows landed) and after (tile complete).
template <class Cfg, class Rows, int kThreads>
__device__ __forceinline__ void dequant_tile(uint32_t raw, uint32_t tile, int tid) {
  constexpr int kRawPitch = Cfg::kRawPitchBytes;
  static_for<Cfg::kNumSources>([&](auto si) {
    constexpr int kI = decltype(si)::value;
    constexpr Source src = Cfg::kSources[kI];
    if constexpr (!is_fp8(src.dtype)) {
      for_each_item<Cfg::kTileN, src.data_bytes() / 16, kThreads>(tid, [&](int tok, int ch) {
        const uint4 v = lds128(raw + tok * kRawPitch + src.raw_offset + ch * 16);
        sts128(tile + Rows::chunk_offset(tok, src.smem_col / 8 + ch), v);
      });
    } else {
      static_assert(src.seg_lo % 16 == 0 && src.scale_group % 16 == 0,
                    "fp8 runs start on, and scale groups span, multiples of 16 values");
      // one unit = 16 fp8 values
      for_each_item<Cfg::kTileN, src.width / 16, kThreads>(tid, [&](int tok, int ch) {
        const uint32_t row = raw + tok * kRawPitch;
        const int group = (src.seg_lo + ch * 16) / src.scale_group - src.scale_first_group;
        const float scale = lds32f(row + src.raw_scale_offset + group * 4);
        const uint4 v = lds128(row + src.raw_offset + ch * 16);
        uint4 lo, hi;
        dequant16<src.dtype, Cfg::kElem>(v, scale, lo, hi);
        sts128(tile + Rows::chunk_offset(tok, src.smem_col / 8 + 2 * ch), lo);
        sts128(tile + Rows::chunk_offset(tok, src.smem_col / 8 + 2 * ch + 1), hi);
      });
    }
  });
}

}  // namespace attncc
