#pragma once
// What the backend-neutral runtime needs from the OpenMPI backend.
#include <cstdint>
#include <memory>

#include "sinter/dist.h"

namespace sinter::dist::detail {
std::shared_ptr<ProcessGroup> make_mpi_world();  // MPI_Init and MPI_COMM_WORLD; finalized at exit
[[noreturn]] void mpi_abort(int code);
// Set by the MPI backend: answers the peers that ask where this rank is (what it waits in, from
// Work::wait's polling loop), so a rank whose deadline passed can name the ranks that never arrived.
extern void (*serve_peer_queries)(const char* waiting);
// Called by the backward of an all_gather that carries a "release_unit" attribute: FSDP drops the
// copy it gathered again for that parameter's backward once its gradient is reduce-scattered.
extern void (*fsdp_release)(int64_t unit, int64_t index);
// Called by an all_gather that carries a "prefetch_unit" attribute: the buffer FSDP's prefetch
// gathered into (waited for), or an undefined tensor when nothing was prefetched.
extern Tensor (*fsdp_prefetched)(int64_t unit, int64_t index);
}  // namespace sinter::dist::detail
