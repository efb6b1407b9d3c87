// Umbrella header.
#pragma once

#include "ulysses/all_to_all.hpp"
#include "ulysses/attention.hpp"
#include "ulysses/bf16.hpp"
#include "ulysses/checked.hpp"
#include "ulysses/communicator.hpp"
#include "ulysses/comm_volume.hpp"
#include "ulysses/mpi_communicator.hpp"
#include "ulysses/context_parallel.hpp"
#include "ulysses/error.hpp"
#include "ulysses/npy.hpp"
#include "ulysses/planner.hpp"
#include "ulysses/reference.hpp"
#include "ulysses/sharding.hpp"
#include "ulysses/tensor.hpp"
#include "ulysses/threads.hpp"
#include "ulysses/trace.hpp"
