// SPDX-License-Identifier: BSD-3-Clause
// examples/cli.hpp: the command line of multi_gpu_train, train_csv, benchmarks/train_bench and
// benchmarks/cpu_standardize_bench.
//
// Args reads an option's value, and numbers whole (no trailing text, within range); every bad value is a
// dpmlp::InputError that names the option, so each program reports it as it reports any bad input.
//
// Parser is a program's table of options: parse() reads the command line from it and usage() writes --help
// from it, so the help cannot miss an option or show a stale default (a default shown is the bound
// variable's value when the table is built, unless the option says otherwise). Adding an option is one line:
//
//   cli::Parser p("prog", "[OPTION]...", "What prog does.");
//   p.value("--steps", "S", o.steps, "training steps");  // any integer type, double or std::string
//   p.flag("--graph", o.graph, "replay steps as a CUDA graph");
//   p.custom("--engine", "NAME", "automatic", "the engine", [&](const cli::Args& a, int& i) { ... });
//   if (!p.parse(argc, argv)) ...                          // -h or --help: print p.usage(), exit 0
#pragma once

#include <dpmlp/errors.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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
  int int_value(int& i) const { return integer_as<int>(i); }
  // Any integer type: a value outside T's range is refused as int_value refuses it; a negative value for an
  // unsigned T "must not be negative".
  template <class T>
  T integer_as(int& i) const {
    const std::string flag = argv_[i];
    const long long v = integer(i);  // i is now at the value
    if (std::is_unsigned<T>::value && v < 0) throw dpmlp::InputError(flag + " must not be negative");
    using Limits = std::numeric_limits<T>;
    if ((std::is_signed<T>::value && v < static_cast<long long>(Limits::min())) ||
        (v > 0 && static_cast<unsigned long long>(v) > static_cast<unsigned long long>(Limits::max()))) {
      throw dpmlp::InputError(flag + ": out of range: '" + argv_[i] + "'");
    }
    return static_cast<T>(v);
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

class Parser {
 public:
  // A reader of one option: i is at the option's name in argv; it reads the value (Args moves i on to it).
  using Read = std::function<void(const Args&, int&)>;

  // program: the name in the usage line and the errors; synopsis: what follows it on the usage line;
  // summary: one or two sentences of what the program does.
  Parser(std::string program, std::string synopsis, std::string summary)
      : program_(std::move(program)), synopsis_(std::move(synopsis)), summary_(std::move(summary)) {}

  // A flag (no value): sets target to `to`.
  Parser& flag(const std::string& name, bool& target, const std::string& meaning, bool to = true) {
    return add(name, "", "", meaning, [&target, to](const Args&, int&) { target = to; });
  }
  // An option whose value is read into target. --help shows target's current value as the default unless
  // `shown` is given (an empty string shows none).
  template <class T>
  Parser& value(const std::string& name, const std::string& placeholder, T& target, const std::string& meaning) {
    return value(name, placeholder, target, meaning, shown_value(target));
  }
  template <class T>
  Parser& value(const std::string& name, const std::string& placeholder, T& target, const std::string& meaning,
                const std::string& shown) {
    return add(name, placeholder, shown, meaning, [&target](const Args& a, int& i) {
      if constexpr (std::is_same<T, std::string>::value) {
        target = a.value(i);
      } else if constexpr (std::is_floating_point<T>::value) {
        target = static_cast<T>(a.real(i));
      } else {
        static_assert(std::is_integral<T>::value, "cli::Parser::value: a string, a number or an integer");
        target = a.integer_as<T>(i);
      }
    });
  }
  // Anything else: `read` reads the value itself (placeholder empty: a flag, and read must not read a value).
  Parser& custom(const std::string& name, const std::string& placeholder, const std::string& shown,
                 const std::string& meaning, Read read) {
    return add(name, placeholder, shown, meaning, std::move(read));
  }
  // Arguments that are not options (train_csv's DATA.csv); without this, one is an error.
  Parser& operands(std::function<void(const std::string&)> take) {
    operands_ = std::move(take);
    return *this;
  }
  // A command line for the Examples section, with what it does (optional).
  Parser& example(const std::string& command, const std::string& what = "") {
    examples_.emplace_back(command, what);
    return *this;
  }
  // A paragraph after the options and examples (exit status, where to read more).
  Parser& note(const std::string& text) {
    notes_.push_back(text);
    return *this;
  }

  // Reads argv[1..] left to right. Returns false when -h or --help comes (nothing after it is read, and the
  // caller prints usage() and exits 0); throws dpmlp::InputError for an unknown option or a bad value.
  // An argument "-" alone is an operand.
  bool parse(int argc, char** argv) const {
    const Args args(argc, argv);
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "-h" || a == "--help") return false;
      const Option* o = find(a);
      if (o) {
        o->read(args, i);
      } else if (a.size() > 1 && a[0] == '-') {
        throw dpmlp::InputError("unknown option '" + a + "' (try '" + program_ + " --help')");
      } else if (operands_) {
        operands_(a);
      } else {
        throw dpmlp::InputError("unexpected argument '" + a + "' (try '" + program_ + " --help')");
      }
    }
    return true;
  }

  // The --help text: usage line, summary, options with their defaults, examples, notes.
  std::string usage() const {
    std::string s = "Usage: " + synopsis_line() + "\n" + wrap(summary_, 0, 0) + "\nOptions:\n";
    std::size_t column = 0;
    for (const Option& o : options_) column = std::max(column, head(o).size());
    column = std::min<std::size_t>(column + 4, kMaxColumn);
    auto entry = [&](const std::string& left, const std::string& text) {
      std::string line = "  " + left;
      if (line.size() + 2 > column) {
        s += line + "\n";
        line.clear();
      }
      line.resize(column, ' ');
      s += wrap(text, column, line.size()).insert(0, line);
    };
    for (const Option& o : options_) {
      // kKeep: "(default: X)" stays on one line.
      entry(head(o), o.shown.empty() ? o.meaning : o.meaning + " (default:" + kKeep + o.shown + ")");
    }
    entry("-h, --help", "print this help and exit");
    if (!examples_.empty()) {
      s += "\nExamples:\n";
      for (const auto& e : examples_) {
        s += "  " + e.first + "\n";
        if (!e.second.empty()) s += wrap(e.second, 6, 6).insert(0, std::string(6, ' '));
      }
    }
    for (const std::string& n : notes_) s += "\n" + wrap(n, 0, 0);
    return s;
  }
  void print_usage(std::FILE* out = stdout) const {
    std::fputs(usage().c_str(), out);
    std::fflush(out);
  }

  const std::string& program() const { return program_; }

 private:
  static constexpr std::size_t kWidth = 79, kMaxColumn = 30;
  static constexpr char kKeep = '\x1f';  // a space that wrap() does not break at

  struct Option {
    std::string name, placeholder, shown, meaning;
    Read read;
  };

  Parser& add(const std::string& name, const std::string& placeholder, const std::string& shown,
              const std::string& meaning, Read read) {
    if (find(name) || name == "-h" || name == "--help") {
      throw std::logic_error("cli::Parser: option " + name + " twice");
    }
    options_.push_back(Option{name, placeholder, shown, meaning, std::move(read)});
    return *this;
  }
  const Option* find(const std::string& name) const {
    for (const Option& o : options_) {
      if (o.name == name) return &o;
    }
    return nullptr;
  }
  static std::string head(const Option& o) { return o.placeholder.empty() ? o.name : o.name + " " + o.placeholder; }
  std::string synopsis_line() const { return program_ + (synopsis_.empty() ? "" : " " + synopsis_); }

  template <class T>
  static std::string shown_value(const T& v) {
    if constexpr (std::is_same<T, std::string>::value) {
      return v;
    } else if constexpr (std::is_floating_point<T>::value) {
      char text[32];
      std::snprintf(text, sizeof text, "%g", static_cast<double>(v));
      return text;
    } else {
      return std::to_string(v);
    }
  }

  // `text` as lines of at most kWidth columns; the first line starts at column `first` (the caller writes
  // what comes before it), the others are indented to `indent`. Ends with a newline.
  static std::string wrap(const std::string& text, std::size_t indent, std::size_t first) {
    std::string out, word;
    std::size_t at = first;
    bool line_empty = true;
    auto put = [&] {
      if (word.empty()) return;
      if (!line_empty && at + 1 + word.size() > kWidth) {
        out += "\n" + std::string(indent, ' ');
        at = indent;
        line_empty = true;
      }
      if (!line_empty) {
        out += ' ';
        ++at;
      }
      std::replace(word.begin(), word.end(), kKeep, ' ');
      out += word;
      at += word.size();
      line_empty = false;
      word.clear();
    };
    for (char c : text) {
      if (c == ' ') {
        put();
      } else if (c == '\n') {
        put();
        out += "\n" + std::string(indent, ' ');
        at = indent;
        line_empty = true;
      } else {
        word += c;
      }
    }
    put();
    return out + "\n";
  }

  std::string program_, synopsis_, summary_;
  std::vector<Option> options_;
  std::function<void(const std::string&)> operands_;
  std::vector<std::pair<std::string, std::string>> examples_;
  std::vector<std::string> notes_;
};

// An MPI program's command line, read on every rank before Kokkos starts (so --help and a bad option start no
// device): parse, then check(); a bad option or value is an InputError that every rank throws together
// (dpmlp::all_or_none). False when --help asked for the usage, which rank 0 has printed.
template <class Check>
bool read_command_line(const Parser& parser, int argc, char** argv, MPI_Comm comm, const Check& check) {
  bool run = true;
  dpmlp::all_or_none(comm, [&] {
    run = parser.parse(argc, argv);
    if (run) check();
  });
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (!run && rank == 0) parser.print_usage(stdout);
  return run;
}

}  // namespace cli
