// The process-group backend of a build without OpenMPI (SINTER_MPI=OFF, or AUTO where it was not
// found): every process is a world of one, and a job started by mpirun is refused with the reason
// rather than run as N unrelated single-process jobs.
#include <cstdlib>

#include "distributed/backend.h"

namespace sinter::dist::detail {

std::shared_ptr<ProcessGroup> make_mpi_world() {
  SINTER_THROW(DistError, "[dist] this process was started by mpirun (OMPI_COMM_WORLD_SIZE=", std::getenv("OMPI_COMM_WORLD_SIZE"),
               "), but this Sinter was built without OpenMPI (SINTER_MPI=OFF or not found): rebuild with libopenmpi-dev "
               "installed, or run one process");
}

void mpi_abort(int code) { std::_Exit(code); }

}  // namespace sinter::dist::detail
