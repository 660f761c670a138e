// SPDX-License-Identifier: BSD-3-Clause
#pragma once

#define DPMLP_VERSION_MAJOR 0
#define DPMLP_VERSION_MINOR 1
#define DPMLP_VERSION_PATCH 0
#define DPMLP_VERSION_STRING "0.1.0"
