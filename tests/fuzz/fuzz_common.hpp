// SPDX-License-Identifier: BSD-3-Clause
// Shared by the harnesses whose reader takes a path: each input is written to one scratch file per process
// (in /dev/shm when there is one, so an execution costs no disk I/O), which is then read.
#pragma once
#include <unistd.h>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace dpmlp_fuzz {

inline const std::string& scratch_path() {
  static const std::string path = [] {
    const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/dpmlp_fuzz_" + std::to_string(static_cast<long long>(::getpid()));
  }();
  return path;
}

// Replaces the scratch file's contents with the input; a failure to write is the machine's, not a finding.
inline const std::string& write_scratch(const std::uint8_t* data, std::size_t size) {
  const std::string& path = scratch_path();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
  return path;
}

inline void remove_scratch() { std::remove(scratch_path().c_str()); }

}  // namespace dpmlp_fuzz
