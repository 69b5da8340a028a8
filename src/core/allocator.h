#pragma once
// CPU memory: 64-byte aligned blocks, cached by size class when freed, so a loop that allocates
// the same shapes every step (every training and decode step does) reuses them instead of paying
// the kernel to map and zero fresh pages (large blocks) or glibc's memalign path (small ones, at
// most 64 kept per class).
#include <cstdint>

#include "sinter/tensor.h"

namespace sinter {

// The allocator registered for a device type other than the CPU; throws naming the device when
// none is.
const Allocator& device_allocator(DeviceType type);
// Whether any device beyond the CPU has registered an allocator (until then every tensor is on the CPU).
bool other_devices_registered();

void* cpu_alloc(int64_t nbytes);       // throws sinter::Error when out of memory
void cpu_free(void* p, int64_t nbytes);
int64_t cpu_cached_bytes();
void cpu_empty_cache();
// Bytes held by live tensors (requested sizes, cache excluded), and the most held since the last
// reset: what benchmarks report as a kernel's extra memory.
int64_t cpu_live_bytes();
int64_t cpu_peak_bytes();
void cpu_reset_peak();

}  // namespace sinter
