// tests/test_wgmma.py's host probe of wgmma.cuh's descriptor arithmetic: desc_plus(desc_sw128(a), n)
// against desc_sw128(a + n) over shared-memory addresses and offsets (no device needed).
#include <cstdint>

#include "attncc/hopper/wgmma.cuh"

using attncc::hopper::desc_plus;
using attncc::hopper::desc_sw128;

// Addresses a < limit and offsets n < max_offset with a + n < limit, both multiples of 16 (every
// tile and k-step offset the kernels form is), for the leading and stride offsets given: how many
// advanced descriptors differ from the one built at the advanced address.
extern "C" long long probe_desc_mismatches(uint32_t limit, uint32_t max_offset, uint32_t leading, uint32_t stride) {
  long long bad = 0;
  for (uint32_t a = 0; a < limit; a += 16) {
    const uint64_t d = desc_sw128(a, leading, stride);
    for (uint32_t n = 0; n < max_offset && a + n < limit; n += 16) bad += desc_plus(d, n) != desc_sw128(a + n, leading, stride);
  }
  return bad;
}

extern "C" uint64_t probe_desc_plus(uint64_t d, uint32_t n) { return desc_plus(d, n); }
extern "C" uint64_t probe_desc_sw128(uint32_t a, uint32_t leading, uint32_t stride) { return desc_sw128(a, leading, stride); }
