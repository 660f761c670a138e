// SPDX-License-Identifier: BSD-3-Clause
// dpmlp: data-parallel training of MLPs on Kokkos execution spaces, one MPI rank per device.
// The umbrella header: everything public.
#pragma once

#include "dpmlp/version.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/devices.hpp"
