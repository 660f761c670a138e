// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/exceptions.hpp: the exceptions dpmlp throws. Include dpmlp/errors.hpp, which also has agree().
#pragma once

#include <mpi.h>

#include <stdexcept>
#include <string>

namespace dpmlp {

// Any error dpmlp reports.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input: data, shapes, options, files. The message names what is wrong and where (row, column, line).
class InputError : public Error {
 public:
  using Error::Error;
};

// A communication or backend failure (MPI, NCCL, CUDA), or a collective that timed out (comm/timed.hpp).
class CommError : public Error {
 public:
  using Error::Error;
};

// A collective waited past its timeout, or this rank learned that another rank's did (comm/timed.hpp). The
// communicator it names is abandoned and the ranks may not all be able to act: a program should end, with
// MPI_Abort rather than MPI_Finalize (which waits for every rank).
class CollectiveTimeout : public CommError {
 public:
  using CommError::CommError;
};

// Training went wrong (a non-finite loss).
class TrainingError : public Error {
 public:
  using Error::Error;
};

namespace detail {
inline void check_mpi(int code, const char* what) {
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING] = {0};
    int len = 0;
    MPI_Error_string(code, text, &len);
    throw CommError(std::string("dpmlp: ") + what + " failed: " + text);
  }
}
}  // namespace detail

}  // namespace dpmlp
