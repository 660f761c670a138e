// SPDX-License-Identifier: BSD-3-Clause
// libFuzzer harness for the CSV parser: parse_csv on arbitrary text. A malformed table must end in
// dpmlp::InputError; a crash, a sanitizer report, any other exception or a leak is a finding. A table that
// parses must be rectangular: every row has as many values as the header has columns.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include "dpmlp/csv.hpp"
#include "dpmlp/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const dpmlp::CsvTable t = dpmlp::parse_csv(text, "fuzz.csv");
    if (t.values.size() != static_cast<std::size_t>(t.rows) * t.columns.size()) std::abort();
    if (t.lines.size() != static_cast<std::size_t>(t.rows)) std::abort();
    t.require_column("y");  // the column lookup and its error message (which prints header names)
  } catch (const dpmlp::InputError&) {
    // The documented outcome for bad input.
  }
  return 0;
}
