// SPDX-License-Identifier: BSD-3-Clause
// The CSV reader (csv.hpp): what it accepts, every refusal naming the file, the line and the column; and the
// deterministic train/test split.
#include <catch2/catch.hpp>

#include <dpmlp/csv.hpp>

#include <unistd.h>

#include <cstdio>
#include <set>
#include <string>

namespace {

// The InputError's message for parse_csv(text), or "" if it parses.
std::string refusal(const std::string& text, const std::string& name = "data.csv") {
  try {
    dpmlp::parse_csv(text, name);
  } catch (const dpmlp::InputError& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("csv: header, numbers, spaces, CRLF, blank lines, quoted names", "[csv]") {
  const auto t = dpmlp::parse_csv("x1, \"x 2\" ,y\r\n1,2.5,-3e-1\r\n\r\n  4 ,\t5 ,6\r\n7,8,9", "in.csv");
  CHECK(t.source == "in.csv");
  REQUIRE(t.columns == std::vector<std::string>{"x1", "x 2", "y"});
  REQUIRE(t.rows == 3);
  CHECK(t.cols() == 3);
  CHECK(t.values == std::vector<double>{1, 2.5, -0.3, 4, 5, 6, 7, 8, 9});
  CHECK(t(1, 2) == 6);
  CHECK(t.lines == std::vector<std::int64_t>{2, 4, 5});
  CHECK(t.find_column("y") == 2);
  CHECK(t.find_column("z") == -1);
  CHECK(t.require_column("x 2") == 1);
}

TEST_CASE("csv: a single column and a trailing newline", "[csv]") {
  const auto t = dpmlp::parse_csv("y\n1\n2\n", "one.csv");
  CHECK(t.rows == 2);
  CHECK(t.values == std::vector<double>{1, 2});
}

TEST_CASE("csv: ragged rows name the line and both counts", "[csv]") {
  CHECK(refusal("a,b,c\n1,2,3\n4,5\n") == "data.csv:3: 2 fields, but the header has 3 columns");
  CHECK(refusal("a,b\n1,2,3\n") == "data.csv:2: 3 fields, but the header has 2 columns");
  // Blank lines still count: the bad row is on line 4.
  CHECK(refusal("a,b\n\n1,2\n1\n") == "data.csv:4: 1 field, but the header has 2 columns");
  // A trailing comma is one more (empty) field.
  CHECK(refusal("a,b\n1,2,\n") == "data.csv:2: 3 fields, but the header has 2 columns");
}

TEST_CASE("csv: non-numeric fields name the line, the column number and name", "[csv]") {
  CHECK(refusal("x1,x2,y\n1,2,3\n4,abc,6\n") == "data.csv:3: column 2 ('x2'): not a number: 'abc'");
  CHECK(refusal("x1,x2,y\n1,2,3x\n") == "data.csv:2: column 3 ('y'): not a number: '3x'");
  CHECK(refusal("x1,y\n1 2,3\n") == "data.csv:2: column 1 ('x1'): not a number: '1 2'");
  CHECK(refusal("x1,y\n0x10,3\n") == "data.csv:2: column 1 ('x1'): not a number: '0x10'");
  CHECK(refusal("x1,y\n\"1\",3\n") == "data.csv:2: column 1 ('x1'): not a number: '\"1\"'");
  CHECK(refusal("x1,y\n1,,\n").find("data.csv:2: 3 fields") == 0);
  CHECK(refusal("x1,y\n,3\n") == "data.csv:2: column 1 ('x1'): empty field (missing values are not supported)");
}

TEST_CASE("csv: NaN and Inf are refused", "[csv]") {
  CHECK(refusal("a,b\n1,nan\n") == "data.csv:2: column 2 ('b'): not finite: 'nan'");
  CHECK(refusal("a,b\n1,2\nInf,2\n") == "data.csv:3: column 1 ('a'): not finite: 'Inf'");
  CHECK(refusal("a,b\n-infinity,2\n") == "data.csv:2: column 1 ('a'): not finite: '-infinity'");
  CHECK(refusal("a,b\n1e999,2\n") == "data.csv:2: column 1 ('a'): not finite: '1e999'");
}

TEST_CASE("csv: empty file, blank file, header only", "[csv]") {
  CHECK(refusal("") == "data.csv: empty file (no header line)");
  CHECK(refusal("\n  \n\r\n") == "data.csv: empty file (no header line)");
  CHECK(refusal("a,b,c\n") == "data.csv:1: no data rows (the file has only a header)");
  CHECK(refusal("a,b,c") == "data.csv:1: no data rows (the file has only a header)");
}

TEST_CASE("csv: bad headers", "[csv]") {
  CHECK(refusal("a,,c\n1,2,3\n") == "data.csv:1: column 2 of the header has no name");
  CHECK(refusal("a,b,a\n1,2,3\n") == "data.csv:1: column 3: the name 'a' appears twice in the header");
}

TEST_CASE("csv: a missing target column names the file and the columns there are", "[csv]") {
  const auto t = dpmlp::parse_csv("x1,x2\n1,2\n", "d.csv");
  try {
    t.require_column("y");
    FAIL("no error");
  } catch (const dpmlp::InputError& e) {
    CHECK(std::string(e.what()) == "d.csv:1: no column 'y' (the header has: x1, x2)");
  }
}

TEST_CASE("csv: a UTF-8 byte order mark before the header is not part of the first name", "[csv]") {
  // The reproducer: a spreadsheet's CSV, whose first column could then not be found by its name (the error
  // showed an invisible character).
  const auto t = dpmlp::parse_csv("\xEF\xBB\xBFy,x1\r\n1,2\r\n", "bom.csv");
  REQUIRE(t.columns == std::vector<std::string>{"y", "x1"});
  CHECK(t.require_column("y") == 0);
  CHECK(t.values == std::vector<double>{1, 2});
  CHECK(t.lines == std::vector<std::int64_t>{2});
  // Only at the start of the text: elsewhere the bytes are a name's, and a data row's are not a number.
  CHECK(refusal("y\n\xEF\xBB\xBF" "1\n") == "data.csv:2: column 1 ('y'): not a number: '???1'");
}

TEST_CASE("csv: text from the file in a message has no control bytes (terminal escapes)", "[csv]") {
  // The reproducer: a header name carrying ESC sequences, printed raw to the terminal in the error message.
  const std::string evil = "a\x1b]0;owned\x07\x1b[2J";
  const auto t = dpmlp::parse_csv(evil + ",y\n1,2\n", "evil.csv");
  CHECK(t.columns[0] == evil);  // the name itself is kept; only messages show it sanitized
  std::string message;
  try {
    t.require_column("z\x1b[1m");
  } catch (const dpmlp::InputError& e) {
    message = e.what();
  }
  CHECK(message == "evil.csv:1: no column 'z?[1m' (the header has: a?]0;owned??[2J, y)");
  CHECK(refusal(evil + ",y\n1,x\x1b[5m\n") == "data.csv:2: column 2 ('y'): not a number: 'x?[5m'");
  CHECK(refusal(evil + ",y\nabc,2\n") == "data.csv:2: column 1 ('a?]0;owned??[2J'): not a number: 'abc'");
  CHECK(refusal("b\x9b" "31m,b\x9b" "31m\n1,2\n") ==
        "data.csv:1: column 2: the name 'b?31m' appears twice in the header");
  CHECK(dpmlp::detail::csv::printable(std::string("t\x7f\r\n\0", 5)) == "t????");
}

TEST_CASE("csv: read_csv reads a file, and names one it cannot open", "[csv]") {
  char path[] = "/tmp/dpmlp_test_csv_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const std::string body = "a,b\n1,2\n3,4\n";
  REQUIRE(write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size()));
  close(fd);
  const auto t = dpmlp::read_csv(path);
  CHECK(t.source == path);
  CHECK(t.values == std::vector<double>{1, 2, 3, 4});
  std::remove(path);
  try {
    dpmlp::read_csv("/nonexistent/dir/data.csv");
    FAIL("no error");
  } catch (const dpmlp::InputError& e) {
    CHECK(std::string(e.what()).find("/nonexistent/dir/data.csv: cannot open") == 0);
  }
}

TEST_CASE("split: sizes, disjoint, covering, sorted, deterministic, seed-dependent", "[csv][split]") {
  for (std::int64_t rows : {1, 2, 10, 442, 1001}) {
    for (double f : {0.0, 0.2, 0.5}) {
      const auto n_test = static_cast<std::size_t>(std::llround(f * rows));
      if (n_test >= static_cast<std::size_t>(rows)) {
        CHECK_THROWS_AS(dpmlp::split_rows(rows, f, 7), dpmlp::InputError);
        continue;
      }
      const auto s = dpmlp::split_rows(rows, f, 7);
      INFO("rows " << rows << " fraction " << f);
      CHECK(s.test.size() == n_test);
      CHECK(s.train.size() == static_cast<std::size_t>(rows) - n_test);
      std::set<std::int64_t> all(s.train.begin(), s.train.end());
      all.insert(s.test.begin(), s.test.end());
      CHECK(all.size() == static_cast<std::size_t>(rows));
      CHECK(*all.begin() == 0);
      CHECK(*all.rbegin() == rows - 1);
      CHECK(std::is_sorted(s.train.begin(), s.train.end()));
      CHECK(std::is_sorted(s.test.begin(), s.test.end()));
      const auto again = dpmlp::split_rows(rows, f, 7);
      CHECK(again.train == s.train);
      CHECK(again.test == s.test);
    }
  }
  CHECK(dpmlp::split_rows(1000, 0.2, 1).test != dpmlp::split_rows(1000, 0.2, 2).test);
  // The rule, spelled out: the test rows are those with the smallest draws.
  const auto s = dpmlp::split_rows(50, 0.1, 3);
  const auto key = dpmlp::random::PRNGKey(3);
  float largest_test = 0, smallest_train = 2;
  for (auto i : s.test) largest_test = std::max(largest_test, dpmlp::random::uniform(key, i));
  for (auto i : s.train) smallest_train = std::min(smallest_train, dpmlp::random::uniform(key, i));
  CHECK(largest_test <= smallest_train);
}

TEST_CASE("split: bad fractions", "[csv][split]") {
  CHECK_THROWS_AS(dpmlp::split_rows(10, 1.0, 0), dpmlp::InputError);
  CHECK_THROWS_AS(dpmlp::split_rows(10, -0.1, 0), dpmlp::InputError);
  CHECK_THROWS_AS(dpmlp::split_rows(10, 0.96, 0), dpmlp::InputError);  // rounds to 10 test rows
  CHECK_THROWS_AS(dpmlp::split_rows(0, 0.2, 0), dpmlp::InputError);
}
