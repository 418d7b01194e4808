// bench/racecheck_probe.cu: does compute-sanitizer racecheck accept a release by bar.arrive
// and an acquire by bar.sync on a named barrier (the Hopper family's row-state exchange)?
//
//   nvcc -arch=sm_90a -o /tmp/probe bench/racecheck_probe.cu
//   compute-sanitizer --tool racecheck /tmp/probe arrive   # group A arrives, group B syncs
//   compute-sanitizer --tool racecheck /tmp/probe sync     # both groups sync (the control)
//   compute-sanitizer --tool racecheck /tmp/probe none     # no barrier at all (a real race)
//   compute-sanitizer --tool racecheck /tmp/probe mbarrier # mbarrier arrive (release) / wait (acquire)
//
// Two groups of 128 threads hand a row of values back and forth through shared memory, 64
// rounds: A writes, signals on barrier 1; B waits on 1, reads, writes its own, signals on 2;
// A waits on 2, reads. Per the PTX ISA (barrier.cta), an arrive makes the arriving thread's
// prior writes visible to the threads that complete the barrier by waiting on it, so the
// `arrive` variant is race-free; it prints the sum so that a wrong read shows.
#include <cstdio>
#include <cstdint>
#include <cstring>

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile("{\n.reg .pred p;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}

__global__ void probe(int mode, int* out) {
  __shared__ int a_row[128], b_row[128];
  __shared__ __align__(8) unsigned long long bars[2];
  const uint32_t bar1 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0])), bar2 = bar1 + 8;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;\n" ::"r"(bar1) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;\n" ::"r"(bar2) : "memory");
  }
  __syncthreads();
  const int t = threadIdx.x % 128;
  const bool group_a = threadIdx.x < 128;
  int sum = 0;
  for (int round = 0; round < 64; ++round) {
    if (group_a) {
      a_row[t] = round * 1000 + t;
      if (mode == 0) bar_arrive(1, 256); else if (mode == 1) bar_sync(1, 256); else if (mode == 3) mbar_arrive(bar1);
      if (mode == 0 || mode == 1) bar_sync(2, 256); else if (mode == 3) mbar_wait(bar2, round & 1);
      sum += b_row[127 - t];
    } else {
      if (mode == 0 || mode == 1) bar_sync(1, 256); else if (mode == 3) mbar_wait(bar1, round & 1);
      sum += a_row[127 - t];
      b_row[t] = round * 1000 + t + 7;
      if (mode == 0) bar_arrive(2, 256); else if (mode == 1) bar_sync(2, 256); else if (mode == 3) mbar_arrive(bar2);
    }
  }
  atomicAdd(out, sum);
}

int main(int argc, char** argv) {
  const char* names[] = {"arrive", "sync", "none", "mbarrier"};
  int mode = 0;
  for (int i = 0; i < 4; ++i)
    if (argc > 1 && !strcmp(argv[1], names[i])) mode = i;
  int* out;
  cudaMalloc(&out, sizeof(int));
  cudaMemset(out, 0, sizeof(int));
  probe<<<1, 256>>>(mode, out);
  int h = 0;
  cudaMemcpy(&h, out, sizeof(int), cudaMemcpyDeviceToHost);
  const cudaError_t err = cudaGetLastError();
  // sum over rounds r, threads t of (1000 r + 127 - t) + (1000 r + 127 - t + 7)
  long long want = 0;
  for (int r = 0; r < 64; ++r)
    for (int t = 0; t < 128; ++t) want += 2LL * (1000 * r + 127 - t) + 7;
  printf("mode %s: sum %d, expected %lld (%s), %s\n", names[mode], h, want,
         h == static_cast<int>(want) ? "equal" : "DIFFERENT", cudaGetErrorString(err));
  return err != cudaSuccess;
}
