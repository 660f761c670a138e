// SPDX-License-Identifier: BSD-3-Clause
// The benchmarks' JSON strings: plain C++ (kernel_trace, a CUPTI library, includes it without dpmlp).
#pragma once

#include <cstdio>
#include <string>

// A string as a JSON string literal (quotes, backslashes and control characters escaped).
inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char code[8];
      std::snprintf(code, sizeof code, "\\u%04x", c);
      out += code;
    } else {
      out += c;
    }
  }
  return out + "\"";
}
