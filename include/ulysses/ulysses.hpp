// Umbrella header: everything but the MPI backend (mpi_communicator.hpp, which includes
// <mpi.h>; link ulysses::mpi to use it).
#pragma once

#include "ulysses/all_to_all.hpp"
#include "ulysses/attention.hpp"
#include "ulysses/balancer.hpp"
#include "ulysses/bf16.hpp"
#include "ulysses/checked.hpp"
#include "ulysses/communicator.hpp"
#include "ulysses/communicator_factory.hpp"
#include "ulysses/comm_volume.hpp"
#include "ulysses/context_parallel.hpp"
#include "ulysses/error.hpp"
#include "ulysses/npy.hpp"
#include "ulysses/lengths.hpp"
#include "ulysses/local_communicator.hpp"
#include "ulysses/planner.hpp"
#include "ulysses/reference.hpp"
#include "ulysses/sharding.hpp"
#include "ulysses/tensor.hpp"
#include "ulysses/threads.hpp"
#include "ulysses/trace.hpp"
#include "ulysses/version.hpp"
