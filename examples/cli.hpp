// SPDX-License-Identifier: BSD-3-Clause
// examples/cli.hpp: the command-line reading that multi_gpu_train, train_csv and benchmarks/train_bench
// share. An option's value, and numbers read whole (no trailing text, within range); every bad value is a
// dpmlp::InputError that names the option, so each program reports it as it reports any bad input.
#pragma once

#include <dpmlp/errors.hpp>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

namespace cli {

class Args {
 public:
  Args(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // The value after option argv[i]; i moves on to it.
  std::string value(int& i) const {
    if (i + 1 >= argc_) throw dpmlp::InputError(std::string("option ") + argv_[i] + " needs a value");
    return argv_[++i];
  }
  long long integer(int& i) const {
    const std::string flag = argv_[i], text = value(i);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (end == text.c_str() || *end != '\0' || errno == ERANGE) {
      throw dpmlp::InputError(flag + ": not an integer: '" + text + "'");
    }
    return v;
  }
  // An int option; a value past int's range is refused (a cast would wrap it, to a value that may pass the
  // program's own checks: --steps 4294967297 would run one step).
  int int_value(int& i) const {
    const std::string flag = argv_[i];
    const long long v = integer(i);  // i is now at the value
    if (v < INT_MIN || v > INT_MAX) throw dpmlp::InputError(flag + ": out of range: '" + argv_[i] + "'");
    return static_cast<int>(v);
  }
  double real(int& i) const {
    const std::string flag = argv_[i], text = value(i);
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0') throw dpmlp::InputError(flag + ": not a number: '" + text + "'");
    return v;
  }

 private:
  int argc_;
  char** argv_;
};

}  // namespace cli
