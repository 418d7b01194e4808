// Compiled by tests/test_wgmma.py (sm_90a, not run): every primitive of attncc/hopper/barrier.cuh
// in the order a producer/consumer hand-over uses them, each twice (inline asm labels must not
// collide), under the launch bounds setmaxnreg needs.
#include "attncc/hopper/barrier.cuh"

__global__ void __launch_bounds__(256, 1) handover(int* out) {
  __shared__ __align__(8) unsigned long long full;
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&full));
  if (threadIdx.x == 0) {
    attncc::hopper::mbarrier_init(bar, 128);
    attncc::hopper::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    attncc::hopper::setmaxnreg_dec<40>();
    attncc::hopper::cp_async_arrive(bar);
    attncc::hopper::mbarrier_arrive(bar);
  } else {
    attncc::hopper::setmaxnreg_inc<232>();
    attncc::hopper::mbarrier_wait(bar, 0);
    attncc::hopper::fence_async_shared();
    attncc::hopper::mbarrier_wait(bar, 1);
    out[threadIdx.x] = 1;
  }
}
