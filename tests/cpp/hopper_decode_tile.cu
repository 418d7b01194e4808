// Device driver for tests/test_wgmma.py: one CTA of the Hopper family's decode, warp-
// specialized, on the pieces of attncc/hopper/: 64 query rows against T tokens.
//   warp group 0 (producer): per KV tile, waits EMPTY[s], copies K [64 x 128] and V [64 x 128]
//     into stage s (cp.async, 128B-swizzled, zero-filled past T), waits for its copies, fences
//     them to the async proxy and arrives FULL[s];
//   warp group 1 (consumer): S = Q K^T (wgmma SS), online softmax on the accumulators (rows past
//     T masked), O += P V (wgmma RS: P from registers, V N-major), arrives EMPTY[s];
//     then out = O / l and lse = ln(sum exp) per row.
// Not a kernel of the family yet: the first run of the pipeline that family will use.
#include <cuda_bf16.h>

#include <cstdint>

#include "attncc/hopper/barrier.cuh"
#include "attncc/hopper/wgmma.cuh"

namespace {

constexpr int kM = 64, kN = 64, kD = 128, kDV = 128, kStages = 2;
constexpr int kTileBytes = kN * 128;                  // one 64-column tile of a KV stage
constexpr int kQBytes = kM * kD * 2;                  // 2 tiles
constexpr int kKBytes = kN * kD * 2, kVBytes = kN * kDV * 2;
constexpr int kStageBytes = kKBytes + kVBytes;
constexpr int kSmem = kQBytes + kStages * kStageBytes + 64;  // + the barriers
constexpr float kLog2e = 1.4426950408889634f;

__device__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

// rows x cols of a row-major bf16 matrix (rows from `first`, up to `limit`) -> stage tiles
__device__ void copy_rows(uint32_t dst, const __nv_bfloat16* src, int first, int limit, int cols, int tid, int threads) {
  for (int i = tid; i < kN * cols / 8; i += threads) {
    const int r = i / (cols / 8), c = i % (cols / 8);
    const bool valid = first + r < limit;
    const __nv_bfloat16* p = src + static_cast<long long>(valid ? first + r : 0) * cols + c * 8;
    cp_async_16(dst + (c / 8) * kTileBytes + attncc::hopper::sw128(r, c % 8), p, valid);
  }
}

__global__ void __launch_bounds__(256, 1) decode_tile(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                                      const __nv_bfloat16* v, int tokens, float scale,
                                                      float* out, float* lse) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sq = smem_u32(smem), skv = sq + kQBytes;
  const uint32_t bars = skv + kStages * kStageBytes;  // FULL[s] at bars + 8 s, EMPTY[s] at bars + 16 + 8 s
  auto full = [&](int s) { return bars + 8 * s; };
  auto empty = [&](int s) { return bars + 16 + 8 * s; };
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  const int n_tiles = (tokens + kN - 1) / kN;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      attncc::hopper::mbarrier_init(full(s), 128);
      attncc::hopper::mbarrier_init(empty(s), 128);
    }
    attncc::hopper::fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer
    attncc::hopper::setmaxnreg_dec<56>();
    for (int i = 0; i < n_tiles; ++i) {
      const int s = i % kStages;
      attncc::hopper::mbarrier_wait(empty(s), ((i / kStages) & 1) ^ 1);  // a fresh barrier's "previous" phase is done
      const uint32_t dst = skv + s * kStageBytes;
      copy_rows(dst, k, i * kN, tokens, kD, t, 128);
      copy_rows(dst + kKBytes, v, i * kN, tokens, kDV, t, 128);
      asm volatile("cp.async.wait_all;\n" ::: "memory");
      attncc::hopper::fence_async_shared();
      attncc::hopper::mbarrier_arrive(full(s));
    }
    return;
  }

  // ---- consumer
  attncc::hopper::setmaxnreg_inc<232>();
  for (int i = t; i < kM * kD / 8; i += 128) {  // Q, by plain loads
    const int r = i / (kD / 8), c = i % (kD / 8);
    *reinterpret_cast<uint4*>(smem + (c / 8) * (kM * 128) + attncc::hopper::sw128(r, c % 8)) =
        reinterpret_cast<const uint4*>(q + r * kD)[c];
  }
  attncc::hopper::fence_async_shared();
  asm volatile("bar.sync 1, 128;\n" ::: "memory");

  const float c = scale * kLog2e;
  float o[kDV / 2];
#pragma unroll
  for (int j = 0; j < kDV / 2; ++j) o[j] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int lane = t % 32, col0 = 2 * (lane % 4);
  for (int i = 0; i < n_tiles; ++i) {
    const int s = i % kStages;
    const uint32_t kt = skv + s * kStageBytes, vt = kt + kKBytes;
    attncc::hopper::mbarrier_wait(full(s), (i / kStages) & 1);
    float sc[kN / 2];
#pragma unroll
    for (int j = 0; j < kN / 2; ++j) sc[j] = 0.f;
    attncc::hopper::fence();
#pragma unroll
    for (int k0 = 0; k0 < kD; k0 += 16)
      attncc::hopper::mma_ss<kN, false>(sc, attncc::hopper::desc_k_major(sq, kM * 128, k0),
                                        attncc::hopper::desc_k_major(kt, kTileBytes, k0), k0 > 0);
    attncc::hopper::commit_group();
    attncc::hopper::wait_group<0>();
    // online softmax: rows g (h = 0) and g + 8 (h = 1) of this warp's 16
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int b = 0; b < kN / 8; ++b)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = i * kN + 8 * b + col0 + (j & 1);
        float& x = sc[4 * b + j];
        x = col < tokens ? x * c : -INFINITY;
        mx[j >> 1] = fmaxf(mx[j >> 1], x);
      }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m[h], mx[h]);
      alpha[h] = m_new == -INFINITY ? 1.f : exp2f(m[h] - m_new);
      m[h] = m_new;
      l[h] *= alpha[h];
    }
#pragma unroll
    for (int b = 0; b < kN / 8; ++b)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float& x = sc[4 * b + j];
        x = m[j >> 1] == -INFINITY ? 0.f : exp2f(x - m[j >> 1]);
        l[j >> 1] += x;
      }
#pragma unroll
    for (int b = 0; b < kDV / 8; ++b)
#pragma unroll
      for (int j = 0; j < 4; ++j) o[4 * b + j] *= alpha[j >> 1];
    uint32_t p[kN / 16][4];
#pragma unroll
    for (int j = 0; j < kN / 16; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(sc[8 * j + 2 * r], sc[8 * j + 2 * r + 1]);
        p[j][r] = *reinterpret_cast<const uint32_t*>(&h);
      }
    attncc::hopper::fence();
#pragma unroll
    for (int j = 0; j < kN / 16; ++j)
      attncc::hopper::mma_rs<kDV, true>(o, p[j], attncc::hopper::desc_n_major(vt, kTileBytes, 16 * j), 1);
    attncc::hopper::commit_group();
    attncc::hopper::wait_group<0>();
    attncc::hopper::mbarrier_arrive(empty(s));
  }
  const int row = 16 * (t / 32) + lane / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
#pragma unroll
    for (int b = 0; b < kDV / 8; ++b) {
      out[(row + 8 * h) * kDV + 8 * b + col0] = o[4 * b + 2 * h] * inv;
      out[(row + 8 * h) * kDV + 8 * b + col0 + 1] = o[4 * b + 2 * h + 1] * inv;
    }
    if (lane % 4 == 0) lse[row + 8 * h] = l[h] > 0.f ? (m[h] + log2f(l[h])) / kLog2e : -INFINITY;
  }
}

}  // namespace

// q [64 x 128], k [tokens x 128], v [tokens x 128] bf16; out [64 x 128], lse [64] float32.
extern "C" int attncc_test_decode_tile(const void* q, const void* k, const void* v, int tokens, float scale,
                                       float* out, float* lse) {
  cudaError_t err = cudaFuncSetAttribute(decode_tile, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  decode_tile<<<1, 256, kSmem>>>(reinterpret_cast<const __nv_bfloat16*>(q), reinterpret_cast<const __nv_bfloat16*>(k),
                                 reinterpret_cast<const __nv_bfloat16*>(v), tokens, scale, out, lse);
  err = cudaGetLastError();
  return err != cudaSuccess ? err : cudaDeviceSynchronize();
}
