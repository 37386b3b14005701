// This process's rank in MPI_COMM_WORLD, for code that names or limits itself by rank without a Comm (errors,
// the config's warnings): asked of MPI while it runs, else the rank remembered at MPI init (0 without MPI).
// Defined in core/comm.cpp.
#pragma once

namespace tessera::core {

int current_world_rank();

}  // namespace tessera::core
