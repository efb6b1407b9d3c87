// TorchCommunicator — a third Communicator backend: a torch.distributed process group (gloo for
// CPU tensors), so programs launched by torchrun, without MPI, run the library as under mpirun.
// The byte counters, agreement, tracer and watchdog are the base class's, as for every backend.
//
// It lives in the Python binding because torch.distributed is a Python API: every hook takes the
// GIL and calls a small Python transport object (python/ulysses/_torch_comm.py) that wraps this
// rank's memory as torch tensors (no copy) and posts the operation with async_op=True. The
// returned Work is polled under the watchdog with the GIL released between polls; when the
// watchdog fires the waiting rank prints the watchdog's line and exits with its code, and
// torchrun's agent ends the other ranks (what MPI_Abort does under mpirun).
//
// Operations gloo lacks are composed here from the ones it has, never padded on the wire where it
// can be avoided: a reduce-scatter is an all-to-all then a sum in rank order (identical results on
// every run); an all-gather of unequal blocks pads to the largest; a gather is an all-gather.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "ulysses/comm/communicator.hpp"

namespace ulysses {

// Not collective. A communicator over `transport`, a python/ulysses/_torch_comm.py transport: its
// attributes rank and size place this process in the group, me and name say who waited on what
// in the watchdog's line ("torch global rank 3, host h"; "torch group of global ranks [2, 3]").
std::shared_ptr<Communicator> make_torch_communicator(pybind11::object transport);

}  // namespace ulysses
