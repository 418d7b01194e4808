// Device driver for tests/test_wgmma.py: one warpgroup computes D[64 x N] = A[64 x K] B with
// attncc/hopper/wgmma.cuh, A and B staged into 128B-swizzled shared memory by the rule the
// header states. B is given as [N x K] (K-major, trans_b 0) or [K x N] (N-major, trans_b 1);
// `leading` and `stride`, when leading is not 0, replace the N-major descriptor's byte offsets
// (the test sweeps the two readings of the PTX tables); 0 takes the header's desc_n_major.
#include <cuda_bf16.h>

#include <cstdint>

#include "attncc/hopper/wgmma.cuh"

namespace {

constexpr int kM = 64, kN = 256, kK = 128;  // K: two 64-column tiles; N: the widest wgmma

__device__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// rows x cols (a multiple of 64) of a row-major bf16 matrix -> tiles of 64 columns, swizzled
__device__ void stage(unsigned char* dst, const __nv_bfloat16* src, int rows, int cols) {
  const int tile_bytes = rows * 128;
  for (int i = threadIdx.x; i < rows * cols / 8; i += blockDim.x) {
    const int r = i / (cols / 8), c = i % (cols / 8);  // 16-byte chunk c of row r
    *reinterpret_cast<uint4*>(dst + (c / 8) * tile_bytes + attncc::hopper::sw128(r, c % 8)) =
        reinterpret_cast<const uint4*>(src + r * cols)[c];
  }
}

// Accumulator d[64 x N] of one warpgroup (mma_ss's layout) -> row-major out [64 x N].
template <int N>
__device__ void store_acc(const float (&acc)[N / 2], float* out) {
  const int t = threadIdx.x, row = 16 * (t / 32) + (t % 32) / 4;
#pragma unroll
  for (int i = 0; i < N / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = 8 * i + 2 * (t % 4);
      out[(row + 8 * h) * N + col] = acc[4 * i + 2 * h];
      out[(row + 8 * h) * N + col + 1] = acc[4 * i + 2 * h + 1];
    }
}

template <bool kTransB>
__global__ void __launch_bounds__(128) tile_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d,
                                                   int leading, int stride) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* sa = smem;                  // A: 2 tiles of 64 rows
  unsigned char* sb = smem + kM * kK * 2;    // B: 2 tiles of N rows (K-major) or 4 of K rows (N-major)
  stage(sa, a, kM, kK);
  if (kTransB) {
    stage(sb, b, kK, kN);
  } else {
    stage(sb, b, kN, kK);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic writes -> async proxy
  __syncthreads();
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.f;
  // every k-step's descriptors before the fence (pinned there: the runtime choice of the N-major
  // reading would otherwise be computed between the wgmmas, and ptxas injects arrives, C7519)
  uint64_t da[kK / 16], db[kK / 16];
#pragma unroll
  for (int k0 = 0; k0 < kK; k0 += 16) {
    da[k0 / 16] = attncc::hopper::desc_k_major(smem_u32(sa), kM * 128, k0);
    db[k0 / 16] = kTransB ? (leading ? attncc::hopper::desc_n_major(smem_u32(sb), k0, leading, stride)
                                     : attncc::hopper::desc_n_major(smem_u32(sb), kK * 128, k0))
                          : attncc::hopper::desc_k_major(smem_u32(sb), kN * 128, k0);
    asm volatile("" : "+l"(da[k0 / 16]), "+l"(db[k0 / 16]));
  }
  attncc::hopper::fence();
#pragma unroll
  for (int k0 = 0; k0 < kK; k0 += 16) attncc::hopper::mma_ss<kN, kTransB>(acc, da[k0 / 16], db[k0 / 16], k0 > 0);
  attncc::hopper::commit_group();
  attncc::hopper::wait_group<0>();
  store_acc<kN>(acc, d);
}

// S = Q K^T (SS, K K-major: a KV tile [64 tokens x 128]), P = bf16(S) in registers, O = P V
// (RS, V N-major [64 tokens x 256]): the two products of a decode step, without the softmax.
__global__ void __launch_bounds__(128) qkv_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                                  const __nv_bfloat16* v, float* o) {
  constexpr int kT = 64, kD = 128, kV = 256;
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* sq = smem;                 // 2 tiles of 64 rows
  unsigned char* sk = sq + kM * kD * 2;     // 2 tiles of 64 tokens
  unsigned char* sv = sk + kT * kD * 2;     // 4 tiles of 64 tokens
  stage(sq, q, kM, kD);
  stage(sk, k, kT, kD);
  stage(sv, v, kT, kV);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  float s[kT / 2];
#pragma unroll
  for (int i = 0; i < kT / 2; ++i) s[i] = 0.f;
  attncc::hopper::fence();
#pragma unroll
  for (int k0 = 0; k0 < kD; k0 += 16)
    attncc::hopper::mma_ss<kT, false>(s, attncc::hopper::desc_k_major(smem_u32(sq), kM * 128, k0),
                                      attncc::hopper::desc_k_major(smem_u32(sk), kT * 128, k0), k0 > 0);
  attncc::hopper::commit_group();
  attncc::hopper::wait_group<0>();
  // P packed before the fence: registers an mma reads are written before wgmma.fence
  auto pack = [](float x, float y) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&h);
  };
  uint32_t p[kT / 16][4];
#pragma unroll
  for (int j = 0; j < kT / 16; ++j) {
    p[j][0] = pack(s[8 * j], s[8 * j + 1]), p[j][1] = pack(s[8 * j + 2], s[8 * j + 3]);
    p[j][2] = pack(s[8 * j + 4], s[8 * j + 5]), p[j][3] = pack(s[8 * j + 6], s[8 * j + 7]);
  }
  float acc[kV / 2];
#pragma unroll
  for (int i = 0; i < kV / 2; ++i) acc[i] = 0.f;
  attncc::hopper::fence();
#pragma unroll
  for (int j = 0; j < kT / 16; ++j)
    attncc::hopper::mma_rs<kV, true>(acc, p[j], attncc::hopper::desc_n_major(smem_u32(sv), kT * 128, 16 * j),
                                     j > 0);
  attncc::hopper::commit_group();
  attncc::hopper::wait_group<0>();
  store_acc<kV>(acc, o);
}

}  // namespace

// q [64 x 128], k [64 x 128], v [64 x 256] bf16, o [64 x 256] float32; returns a cudaError_t.
extern "C" int attncc_test_wgmma_qkv(const void* q, const void* k, const void* v, float* o) {
  const int smem = (64 * 128 + 64 * 128 + 64 * 256) * 2;
  cudaError_t err = cudaFuncSetAttribute(qkv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  qkv_kernel<<<1, 128, smem>>>(reinterpret_cast<const __nv_bfloat16*>(q), reinterpret_cast<const __nv_bfloat16*>(k),
                               reinterpret_cast<const __nv_bfloat16*>(v), o);
  err = cudaGetLastError();
  return err != cudaSuccess ? err : cudaDeviceSynchronize();
}

// a [64 x 128], b [256 x 128] (trans_b 0) or [128 x 256] (trans_b 1), d [64 x 256] float32,
// all device pointers; returns a cudaError_t.
extern "C" int attncc_test_wgmma(const void* a, const void* b, float* d, int trans_b, int leading, int stride) {
  const int smem = (kM * kK + kK * kN) * 2;
  auto* ka = reinterpret_cast<const __nv_bfloat16*>(a);
  auto* kb = reinterpret_cast<const __nv_bfloat16*>(b);
  cudaError_t err;
  if (trans_b) {
    err = cudaFuncSetAttribute(tile_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess) tile_kernel<true><<<1, 128, smem>>>(ka, kb, d, leading, stride);
  } else {
    err = cudaFuncSetAttribute(tile_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess) tile_kernel<false><<<1, 128, smem>>>(ka, kb, d, leading, stride);
  }
  if (err != cudaSuccess) return err;
  err = cudaGetLastError();
  return err != cudaSuccess ? err : cudaDeviceSynchronize();
}
