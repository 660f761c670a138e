// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/csv.hpp: reading a numeric CSV file, and a deterministic train/test split.
//
//   dpmlp::CsvTable t = dpmlp::read_csv("data.csv");      // t.columns, t.rows, t.values (row-major double)
//   const int target = t.require_column("y");             // InputError naming the file and the columns
//   auto split = dpmlp::split_rows(t.rows, 0.2, /*seed*/ 0);   // split.train, split.test: row indices
//
// The format: the first line is a header of column names (after a UTF-8 byte order mark, which is skipped);
// every other non-blank line is a data row of as many fields as the header, separated by commas. Spaces and
// tabs around a field are ignored, and so are a trailing "\r" (CRLF files) and blank lines. Header names may be wrapped in double quotes ("x1"); names must
// be non-empty and distinct. Data fields must be finite decimal numbers (as strtod reads them in the C
// locale: 1, -2.5, 3e-4); there is no quoting, no missing-value marker, no comment syntax.
//
// Every error is an InputError whose message names the file, the 1-based line number (the header is line
// 1) and the column (its 1-based number and its name). Text from the file in a message (a name, a field) has
// every byte outside printable ASCII shown as '?', as the .npy reader shows its header, so that a file cannot
// send control sequences to the terminal that prints the message:
//   data.csv:7: column 3 ('x2'): not a number: 'abc'
//   data.csv:9: 3 fields, but the header has 4 columns
//   data.csv:4: column 2 ('x1'): not finite: 'nan'
//   data.csv: empty file (no header line)
//   data.csv:1: no data rows (the file has only a header)
//   data.csv:1: no column 'y' (the header has: x1, x2, x3)
//
// The split (split_rows) depends on the row count, the fraction and the seed only: not on the rank count,
// the machine or the build. Row i draws u_i = dpmlp::random::uniform(PRNGKey(seed), i) (JAX's float32
// uniform, element i of jax.random.uniform(PRNGKey(seed), (rows,)) with jax_threefry_partitionable on); the
// rows sorted by (u_i, i) ascending, the first round(fraction * rows) are the test rows, the rest train. Both
// lists come back in increasing row order.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "dpmlp/errors.hpp"
#include "dpmlp/files.hpp"
#include "dpmlp/random.hpp"

namespace dpmlp {

namespace detail {
namespace csv {

// `text` for a message: bytes outside printable ASCII (control bytes, ESC, DEL, anything >= 0x80) as '?'.
inline std::string printable(const std::string& text) {
  std::string out(text);
  for (char& c : out) {
    if (!(c >= 32 && c < 127)) c = '?';
  }
  return out;
}

}  // namespace csv
}  // namespace detail

struct CsvTable {
  std::string source;                // the file name (or the name given to parse_csv), for messages
  std::vector<std::string> columns;  // the header's names, in file order
  std::int64_t rows = 0;             // data rows
  std::vector<double> values;        // rows x columns(), row-major
  std::vector<std::int64_t> lines;   // each data row's 1-based line number in the file

  int cols() const { return static_cast<int>(columns.size()); }
  double operator()(std::int64_t row, int col) const { return values[static_cast<std::size_t>(row) * columns.size() + col]; }

  // The index of the column called `name`, or -1.
  int find_column(const std::string& name) const {
    for (std::size_t i = 0; i < columns.size(); ++i) {
      if (columns[i] == name) return static_cast<int>(i);
    }
    return -1;
  }

  // The index of the column called `name`; InputError (naming the file, line 1 and the columns) if none.
  int require_column(const std::string& name) const {
    using detail::csv::printable;
    const int c = find_column(name);
    if (c >= 0) return c;
    std::string have;
    for (std::size_t i = 0; i < columns.size(); ++i) have += (i ? ", " : "") + printable(columns[i]);
    throw InputError(source + ":1: no column '" + printable(name) + "' (the header has: " + have + ")");
  }
};

namespace detail {
namespace csv {

inline bool is_blank(char c) { return c == ' ' || c == '\t'; }

// [begin, end) without the spaces and tabs around it.
inline std::pair<const char*, const char*> trim(const char* begin, const char* end) {
  while (begin < end && is_blank(*begin)) ++begin;
  while (end > begin && is_blank(end[-1])) --end;
  return {begin, end};
}

// Splits [begin, end) at commas into trimmed fields.
inline void split_fields(const char* begin, const char* end, std::vector<std::pair<const char*, const char*>>& out) {
  out.clear();
  const char* field = begin;
  for (const char* p = begin;; ++p) {
    if (p == end || *p == ',') {
      out.push_back(trim(field, p));
      if (p == end) break;
      field = p + 1;
    }
  }
}

inline std::string shown(const char* begin, const char* end) {
  std::string s(begin, end);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return printable(s);
}

}  // namespace csv
}  // namespace detail

// Parses CSV text (the format above). `source` names the text in error messages.
inline CsvTable parse_csv(const std::string& text, const std::string& source) {
  using detail::csv::shown;
  CsvTable t;
  t.source = source;
  std::vector<std::pair<const char*, const char*>> fields;
  std::string number;  // a NUL-terminated copy of one field, for strtod
  const char* p = text.data();
  const char* const end = p + text.size();
  // A UTF-8 byte order mark (spreadsheet programs write one) is not part of the first column's name.
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) p += 3;
  std::int64_t line = 0;
  bool have_header = false;
  while (p < end) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
    const char* line_end = nl ? nl : end;
    const char* next = nl ? nl + 1 : end;
    ++line;
    if (line_end > p && line_end[-1] == '\r') --line_end;
    const auto content = detail::csv::trim(p, line_end);
    p = next;
    if (content.first == content.second) continue;  // blank line
    if (std::memchr(content.first, '\0', static_cast<std::size_t>(content.second - content.first))) {
      throw InputError(source + ":" + std::to_string(line) + ": a NUL byte (is this a text file?)");
    }
    detail::csv::split_fields(content.first, content.second, fields);
    if (!have_header) {
      std::unordered_set<std::string> seen;
      for (std::size_t i = 0; i < fields.size(); ++i) {
        const char* b = fields[i].first;
        const char* e = fields[i].second;
        if (e - b >= 2 && *b == '"' && e[-1] == '"') {
          ++b;
          --e;
        }
        std::string name(b, e);
        const std::string where = source + ":" + std::to_string(line) + ": column " + std::to_string(i + 1);
        if (name.empty()) throw InputError(where + " of the header has no name");
        if (!seen.insert(name).second) {
          throw InputError(where + ": the name '" + detail::csv::printable(name) + "' appears twice in the header");
        }
        t.columns.push_back(std::move(name));
      }
      have_header = true;
      continue;
    }
    if (fields.size() != t.columns.size()) {
      throw InputError(source + ":" + std::to_string(line) + ": " + std::to_string(fields.size()) + " field" +
                       (fields.size() == 1 ? "" : "s") + ", but the header has " + std::to_string(t.columns.size()) +
                       " column" + (t.columns.size() == 1 ? "" : "s"));
    }
    for (std::size_t i = 0; i < fields.size(); ++i) {
      const char* b = fields[i].first;
      const char* e = fields[i].second;
      auto where = [&] {
        return source + ":" + std::to_string(line) + ": column " + std::to_string(i + 1) + " ('" +
               detail::csv::printable(t.columns[i]) + "')";
      };
      if (b == e) throw InputError(where() + ": empty field (missing values are not supported)");
      number.assign(b, e);
      char* stop = nullptr;
      errno = 0;
      const double v = std::strtod(number.c_str(), &stop);
      // strtod also takes hex floats and leading blanks; a field must be a plain decimal number.
      const bool hex = number.find_first_of("xX") != std::string::npos;
      if (stop != number.c_str() + number.size() || stop == number.c_str() || hex) {
        throw InputError(where() + ": not a number: '" + shown(b, e) + "'");
      }
      if (!std::isfinite(v)) throw InputError(where() + ": not finite: '" + shown(b, e) + "'");
      t.values.push_back(v);
    }
    t.lines.push_back(line);
    ++t.rows;
  }
  if (!have_header) throw InputError(source + ": empty file (no header line)");
  if (t.rows == 0) throw InputError(source + ":1: no data rows (the file has only a header)");
  return t;
}

// Reads and parses `path` (the format above). InputError if it cannot be read.
// A FIFO or a device is refused before anything could block on it.
inline CsvTable read_csv(const std::string& path) {
  std::FILE* f = detail::open_regular_for_reading(path, "");
  if (!f) throw InputError(path + ": cannot open: " + std::strerror(errno));
  std::string text;
  char chunk[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) text.append(chunk, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw InputError(path + ": read error");
  return parse_csv(text, path);
}

struct RowSplit {
  std::vector<std::int64_t> train, test;  // row indices, each in increasing order
};

// The deterministic split described at the top of this file. 0 <= test_fraction < 1; the test set gets
// round(test_fraction * rows) rows (half away from zero), the training set the rest (at least one row).
inline RowSplit split_rows(std::int64_t rows, double test_fraction, std::uint64_t seed) {
  if (rows <= 0) throw InputError("dpmlp::split_rows: no rows");
  if (!(test_fraction >= 0 && test_fraction < 1)) {
    throw InputError("dpmlp::split_rows: the test fraction must be in [0, 1), got " + std::to_string(test_fraction));
  }
  const std::int64_t n_test = static_cast<std::int64_t>(std::llround(test_fraction * static_cast<double>(rows)));
  if (n_test >= rows) {
    throw InputError("dpmlp::split_rows: a test fraction of " + std::to_string(test_fraction) + " of " +
                     std::to_string(rows) + " rows leaves no training rows");
  }
  const random::Key key = random::PRNGKey(seed);
  std::vector<std::pair<float, std::int64_t>> order(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) order[i] = {random::uniform(key, static_cast<std::uint64_t>(i)), i};
  std::sort(order.begin(), order.end());  // by draw, ties by row index
  RowSplit s;
  s.test.reserve(static_cast<std::size_t>(n_test));
  s.train.reserve(static_cast<std::size_t>(rows - n_test));
  for (std::int64_t i = 0; i < rows; ++i) (i < n_test ? s.test : s.train).push_back(order[i].second);
  std::sort(s.test.begin(), s.test.end());
  std::sort(s.train.begin(), s.train.end());
  return s;
}

}  // namespace dpmlp
