#pragma once
// MpiCommunicator: the Communicator of dist/communicator.h over MPI, for buffers in host memory
// (no CUDA-aware MPI is assumed: GPU buffers go through NCCL). Built when CMake finds MPI
// (OpenMPI from Debian: libopenmpi-dev); otherwise asking for it is an error saying so.
//
// MPI is initialized at the first mpi_world_communicator() call (MPI_Init_thread with
// MPI_THREAD_FUNNELED: one thread of the process calls MPI; abort() is the one exception, called
// by the watchdog's thread to end a job that hangs) unless something initialized it
// before, and finalized at exit (std::atexit) when this code initialized it, as mpirun requires.
// f32 reduces with MPI_FLOAT's own sum and max; bf16 with user operations that add (or compare)
// in f32 and round each partial result to bf16 (core/dtype.h); avg divides the sum by size() in
// f32 and rounds once more for bf16.

#include <memory>

#include "core/status.h"
#include "dist/communicator.h"

namespace lathe {

// Whether this lathe was built with MPI.
bool mpi_available();

// The communicator of every process mpirun started (MPI_COMM_WORLD, duplicated). Errors: a build
// without MPI; MPI_Init failing.
Result<std::unique_ptr<Communicator>> mpi_world_communicator();

}  // namespace lathe
