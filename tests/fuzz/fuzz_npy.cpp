// SPDX-License-Identifier: BSD-3-Clause
// libFuzzer harness for the .npy reader: the input is written to a scratch file and read with
// read_npy_header, load_npy<float>, load_npy<double> and load_npy(path, out, shape) into a buffer of the
// shape a model layer would expect. A malformed file must end in dpmlp::InputError; a crash, a sanitizer
// report (an overrun of the caller's buffer among them), any other exception or a leak is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include "dpmlp/errors.hpp"
#include "dpmlp/npy.hpp"
#include "fuzz_common.hpp"

namespace {

template <class T>
void load_any(const std::string& path) {
  try {
    const dpmlp::NpyArray<T> a = dpmlp::load_npy<T>(path);
    std::size_t count = 1;
    for (std::size_t d : a.shape) count *= d;
    if (a.data.size() != count) std::abort();
  } catch (const dpmlp::InputError&) {
  }
}

// The buffer is exactly the expected shape's size, so ASan reports any write past it.
template <class T>
void load_shaped(const std::string& path, const std::vector<std::size_t>& shape) {
  std::size_t count = 1;
  for (std::size_t d : shape) count *= d;
  std::vector<T> out(count);
  try {
    dpmlp::load_npy<T>(path, out.data(), shape);
  } catch (const dpmlp::InputError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = dpmlp_fuzz::write_scratch(data, size);
  try {
    (void)dpmlp::read_npy_header(path);
  } catch (const dpmlp::InputError&) {
  }
  load_any<float>(path);
  load_any<double>(path);
  load_shaped<float>(path, {3, 2});
  load_shaped<double>(path, {3, 2});
  load_shaped<double>(path, {2});
  load_shaped<float>(path, {});
  dpmlp_fuzz::remove_scratch();
  return 0;
}
