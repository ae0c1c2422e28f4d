// MPI's communicator (engine/communicator.hpp), in the dpgrad-mpi library
// (built with meson -Dmpi=enabled or auto, DPGRAD_HAVE_MPI in engine/config.hpp;
// pkg-config dpgrad-mpi, CMake dpgrad::mpi). The plain dpgrad library links no
// MPI. Programs linked with dpgrad-mpi that only want "MPI when started by
// mpirun or srun" call world_communicator() (engine/communicator.hpp) and need
// not include this header.
#pragma once

#include <memory>

#include <mpi.h>

#include "engine/communicator.hpp"

namespace dpgrad {

/// A communicator over `comm` (not freed; MPI must be initialised and stay so
/// while it is used). Every operation checks MPI's return code and throws
/// std::runtime_error on an error.
std::shared_ptr<Communicator> mpi_communicator(MPI_Comm comm);

}  // namespace dpgrad
