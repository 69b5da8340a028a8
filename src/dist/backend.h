#pragma once
// What the backend-neutral runtime needs from the OpenMPI backend.
#include <memory>

#include "sinter/dist.h"

namespace sinter::dist::detail {
std::shared_ptr<ProcessGroup> make_mpi_world();  // MPI_Init and MPI_COMM_WORLD; finalized at exit
[[noreturn]] void mpi_abort(int code);
}  // namespace sinter::dist::detail
