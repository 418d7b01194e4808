// Device driver for tests/test_dequant.py: core/dequant.cuh's dequant16 over n chunks of 16 fp8
// bytes, chunk i times scales[i], into 16 elements each (a thread a chunk), for each (fp8, elem)
// pair: the test compares them bit for bit with torch's float8 -> float, times the scale, -> elem.
#include <cstdint>

#include "attncc/core/dequant.cuh"

namespace {

template <attncc::Dtype D, attncc::Dtype E>
__global__ void dequant_chunks(const uint4* in, const float* scales, uint4* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) attncc::dequant16<D, E>(in[i], scales[i], out[2 * i], out[2 * i + 1]);
}

template <attncc::Dtype D, attncc::Dtype E>
int launch(const void* in, const float* scales, void* out, int n) {
  dequant_chunks<D, E><<<(n + 127) / 128, 128>>>(static_cast<const uint4*>(in), scales, static_cast<uint4*>(out), n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

// fp8: 0 e4m3, 1 e5m2; elem: 0 bf16, 1 fp16. Returns a cudaError_t (cudaErrorInvalidValue for
// an unknown pair).
extern "C" int attncc_dequant_probe(int fp8, int elem, const void* in, const float* scales, void* out, int n) {
  using attncc::Dtype;
  if (fp8 == 0 && elem == 0) return launch<Dtype::kE4M3, Dtype::kBF16>(in, scales, out, n);
  if (fp8 == 0 && elem == 1) return launch<Dtype::kE4M3, Dtype::kFP16>(in, scales, out, n);
  if (fp8 == 1 && elem == 0) return launch<Dtype::kE5M2, Dtype::kBF16>(in, scales, out, n);
  if (fp8 == 1 && elem == 1) return launch<Dtype::kE5M2, Dtype::kFP16>(in, scales, out, n);
  return static_cast<int>(cudaErrorInvalidValue);
}
