// SPDX-License-Identifier: BSD-3-Clause
// dpmlp: data-parallel training of MLPs on Kokkos execution spaces, one MPI rank per device.
// The umbrella header: everything public.
#pragma once

#include "dpmlp/version.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/files.hpp"
#include "dpmlp/digest.hpp"
#include "dpmlp/devices.hpp"
#include "dpmlp/random.hpp"
#include "dpmlp/linalg/gemm.hpp"
#include "dpmlp/comm/communicator.hpp"
#include "dpmlp/reduction.hpp"
#include "dpmlp/standardizer.hpp"
#include "dpmlp/mlp.hpp"
#include "dpmlp/jacobian.hpp"
#include "dpmlp/optim.hpp"
#include "dpmlp/engine/options.hpp"
#include "dpmlp/engine/plan.hpp"
#include "dpmlp/trainer_options.hpp"
#include "dpmlp/epoch_order.hpp"
#include "dpmlp/data_parallel_trainer.hpp"
#include "dpmlp/checkpoint.hpp"
#include "dpmlp/callbacks.hpp"
#include "dpmlp/csv.hpp"
#include "dpmlp/eigen_interop.hpp"
#include "dpmlp/npy.hpp"
