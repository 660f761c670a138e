// SPDX-License-Identifier: BSD-3-Clause
// tests/json_lite.hpp: a small JSON reader for the tests' reference files (tests/data/*.json).
//
// It reads all of RFC 8259 (objects, arrays, numbers, strings with every escape, true/false/null) plus the
// NaN / Infinity / -Infinity tokens that Python's json.dump writes by default. Numbers keep their source text
// next to the double, because a double is not enough for everything a reference file holds: uint32 values
// survive a double, but uint64 seeds and exact-integer checks should not depend on that, so as_u32 / as_u64 /
// as_i64 parse the text itself. Objects keep their key order. Errors throw json_lite::Error with the byte
// offset. Test-only: it favours clarity over speed (the reference files are a few kilobytes to a few
// megabytes).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <locale>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace json_lite {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };

  Value() = default;

  static Value make_null() { return Value(); }
  static Value make_bool(bool b) {
    Value v;
    v.type_ = Type::Bool;
    v.bool_ = b;
    return v;
  }
  static Value make_number(double d, std::string raw) {
    Value v;
    v.type_ = Type::Number;
    v.number_ = d;
    v.text_ = std::move(raw);
    return v;
  }
  static Value make_string(std::string s) {
    Value v;
    v.type_ = Type::String;
    v.text_ = std::move(s);
    return v;
  }
  static Value make_array() {
    Value v;
    v.type_ = Type::Array;
    return v;
  }
  static Value make_object() {
    Value v;
    v.type_ = Type::Object;
    return v;
  }

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_number() const { return type_ == Type::Number; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }

  bool as_bool() const {
    expect(Type::Bool, "a boolean");
    return bool_;
  }

  double as_double() const {
    expect(Type::Number, "a number");
    return number_;
  }
  float as_float() const { return static_cast<float>(as_double()); }

  // The number exactly as it appears in the file ("4070199207", "1.622642159461975", "NaN").
  const std::string& raw() const {
    expect(Type::Number, "a number");
    return text_;
  }

  // Exact integer conversions from the source text; they reject fractions, exponents and out-of-range values
  // instead of rounding, so a reference value is either read exactly or not at all.
  std::uint64_t as_u64() const {
    const std::string& t = raw();
    if (t.empty() || t[0] == '-') fail_int(t, "a non-negative integer");
    return parse_digits(t, 0, std::numeric_limits<std::uint64_t>::max());
  }
  std::uint32_t as_u32() const {
    const std::string& t = raw();
    if (t.empty() || t[0] == '-') fail_int(t, "a non-negative integer");
    return static_cast<std::uint32_t>(parse_digits(t, 0, std::numeric_limits<std::uint32_t>::max()));
  }
  std::int64_t as_i64() const {
    const std::string& t = raw();
    const bool negative = !t.empty() && t[0] == '-';
    const std::uint64_t limit = negative
                                    ? std::uint64_t(1) << 63
                                    : static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    const std::uint64_t magnitude = parse_digits(t, negative ? 1 : 0, limit);
    if (!negative) return static_cast<std::int64_t>(magnitude);
    // -2^63 has no positive counterpart in int64, so negate in unsigned arithmetic.
    return magnitude == (std::uint64_t(1) << 63) ? std::numeric_limits<std::int64_t>::min()
                                                 : -static_cast<std::int64_t>(magnitude);
  }
  int as_int() const {
    const std::int64_t v = as_i64();
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) fail_int(raw(), "an int");
    return static_cast<int>(v);
  }

  const std::string& as_string() const {
    expect(Type::String, "a string");
    return text_;
  }

  // Arrays.
  std::size_t size() const {
    if (type_ == Type::Array) return array_.size();
    if (type_ == Type::Object) return object_.size();
    throw Error("json_lite: size() of a value that is neither an array nor an object");
  }
  // A template over integer types, because a plain size_t overload would make v[0] ambiguous with the
  // const char* key overload (0 is also a null pointer constant).
  template <class I, typename std::enable_if<std::is_integral<I>::value, int>::type = 0>
  const Value& operator[](I i) const {
    expect(Type::Array, "an array");
    if (is_negative(i, std::is_signed<I>()) || static_cast<std::uint64_t>(i) >= array_.size()) {
      throw Error("json_lite: index " + std::to_string(i) + " out of range (size " +
                  std::to_string(array_.size()) + ")");
    }
    return array_[static_cast<std::size_t>(i)];
  }
  const std::vector<Value>& items() const {
    expect(Type::Array, "an array");
    return array_;
  }
  void push_back(Value v) {
    expect(Type::Array, "an array");
    array_.push_back(std::move(v));
  }

  // Objects. operator[] throws on a missing key (naming it), so a typo in a test is a clear failure.
  bool contains(const std::string& key) const { return find(key) != nullptr; }
  const Value* find(const std::string& key) const {
    expect(Type::Object, "an object");
    for (const auto& kv : object_) {
      if (kv.first == key) return &kv.second;
    }
    return nullptr;
  }
  const Value& operator[](const std::string& key) const {
    const Value* v = find(key);
    if (v == nullptr) throw Error("json_lite: no key \"" + key + "\"");
    return *v;
  }
  const Value& operator[](const char* key) const { return (*this)[std::string(key)]; }
  const std::vector<std::pair<std::string, Value>>& members() const {
    expect(Type::Object, "an object");
    return object_;
  }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (const auto& kv : members()) out.push_back(kv.first);
    return out;
  }
  // Later duplicates replace earlier ones, as in Python's json module.
  void set(std::string key, Value v) {
    expect(Type::Object, "an object");
    for (auto& kv : object_) {
      if (kv.first == key) {
        kv.second = std::move(v);
        return;
      }
    }
    object_.emplace_back(std::move(key), std::move(v));
  }

  // Nested arrays of numbers, flattened in row-major order ([[1, 2], [3]] -> 1, 2, 3); a lone number gives
  // one element. Handy for arrays shaped like the JAX arrays they came from.
  std::vector<double> flat_doubles() const {
    std::vector<double> out;
    flatten(out, [](const Value& v) { return v.as_double(); });
    return out;
  }
  std::vector<float> flat_floats() const {
    std::vector<float> out;
    flatten(out, [](const Value& v) { return v.as_float(); });
    return out;
  }
  std::vector<std::uint32_t> flat_u32() const {
    std::vector<std::uint32_t> out;
    flatten(out, [](const Value& v) { return v.as_u32(); });
    return out;
  }
  std::vector<std::uint64_t> flat_u64() const {
    std::vector<std::uint64_t> out;
    flatten(out, [](const Value& v) { return v.as_u64(); });
    return out;
  }

 private:
  // Split by signedness so that no compiler sees (and warns about) "unsigned < 0".
  template <class I>
  static bool is_negative(I i, std::true_type) {
    return i < 0;
  }
  template <class I>
  static bool is_negative(I, std::false_type) {
    return false;
  }

  static const char* type_name(Type t) {
    switch (t) {
      case Type::Null:
        return "null";
      case Type::Bool:
        return "a boolean";
      case Type::Number:
        return "a number";
      case Type::String:
        return "a string";
      case Type::Array:
        return "an array";
      case Type::Object:
        return "an object";
    }
    return "?";
  }

  void expect(Type t, const char* what) const {
    if (type_ != t) throw Error(std::string("json_lite: expected ") + what + ", got " + type_name(type_));
  }

  [[noreturn]] static void fail_int(const std::string& text, const char* what) {
    throw Error("json_lite: number " + text + " is not " + what);
  }

  // Digits from text[start] to the end, at most `limit`; anything but digits (a '.', an exponent) is an
  // error.
  static std::uint64_t parse_digits(const std::string& text, std::size_t start, std::uint64_t limit) {
    if (start >= text.size()) fail_int(text, "an integer");
    std::uint64_t value = 0;
    for (std::size_t i = start; i < text.size(); ++i) {
      const char c = text[i];
      if (c < '0' || c > '9') fail_int(text, "an integer");
      const std::uint64_t digit = static_cast<std::uint64_t>(c - '0');
      if (value > (limit - digit) / 10) fail_int(text, "in range");
      value = value * 10 + digit;
    }
    return value;
  }

  template <class T, class Convert>
  void flatten(std::vector<T>& out, Convert convert) const {
    if (type_ == Type::Array) {
      for (const auto& item : array_) item.flatten(out, convert);
    } else {
      out.push_back(convert(*this));
    }
  }

  Type type_ = Type::Null;
  bool bool_ = false;
  double number_ = 0.0;
  std::string text_;  // a string's value, or a number's source text
  std::vector<Value> array_;
  std::vector<std::pair<std::string, Value>> object_;
};

namespace detail {

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 512;  // a guard against stack exhaustion on malformed input

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("json_lite: " + what + " at byte " + std::to_string(pos_));
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  void skip_ws() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  bool consume_literal(const char* lit) {
    std::size_t n = 0;
    while (lit[n] != '\0') ++n;
    if (s_.compare(pos_, n, lit) != 0) return false;
    pos_ += n;
    return true;
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting too deep");
    if (at_end()) fail("unexpected end of input");
    const char c = s_[pos_];
    switch (c) {
      case '{':
        return parse_object(depth);
      case '[':
        return parse_array(depth);
      case '"':
        return Value::make_string(parse_string());
      case 't':
        if (consume_literal("true")) return Value::make_bool(true);
        break;
      case 'f':
        if (consume_literal("false")) return Value::make_bool(false);
        break;
      case 'n':
        if (consume_literal("null")) return Value::make_null();
        break;
      case 'N':
        if (consume_literal("NaN"))
          return Value::make_number(std::numeric_limits<double>::quiet_NaN(), "NaN");
        break;
      case 'I':
        if (consume_literal("Infinity")) {
          return Value::make_number(std::numeric_limits<double>::infinity(), "Infinity");
        }
        break;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
        break;
    }
    fail(std::string("unexpected character '") + c + "'");
  }

  Value parse_object(int depth) {
    ++pos_;  // '{'
    Value obj = Value::make_object();
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return obj;
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      skip_ws();
      if (peek() != ':') fail("expected ':'");
      ++pos_;
      skip_ws();
      obj.set(std::move(key), parse_value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return obj;
      }
      fail("expected ',' or '}'");
    }
  }

  Value parse_array(int depth) {
    ++pos_;  // '['
    Value arr = Value::make_array();
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return arr;
    }
    for (;;) {
      skip_ws();
      arr.push_back(parse_value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return arr;
      }
      fail("expected ',' or ']'");
    }
  }

  Value parse_number() {
    const std::size_t start = pos_;
    if (peek() == '-') {
      ++pos_;
      if (consume_literal("Infinity")) {
        return Value::make_number(-std::numeric_limits<double>::infinity(), "-Infinity");
      }
    }
    // RFC 8259 grammar: int = "0" / digit1-9 *digit; then optional fraction and exponent.
    if (peek() == '0') {
      ++pos_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') ++pos_;
    } else {
      fail("invalid number");
    }
    if (peek() == '.') {
      ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("invalid number: digits must follow '.'");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("invalid number: digits must follow the exponent");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    std::string raw = s_.substr(start, pos_ - start);
    // The classic locale, so a process that calls setlocale cannot turn '.' into a non-separator.
    std::istringstream in(raw);
    in.imbue(std::locale::classic());
    double d = 0.0;
    in >> d;
    if (in.fail()) {
      // Out-of-range magnitudes: libstdc++ sets failbit but stores +-max; use strtod's +-inf / 0 instead.
      errno = 0;
      d = std::strtod(raw.c_str(), nullptr);
    }
    return Value::make_number(d, std::move(raw));
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        fail("invalid \\u escape");
      }
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;  // UTF-8 passes through unchanged
        continue;
      }
      if (at_end()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = parse_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by an escaped low surrogate; together they are one code
            // point.
            if (!consume_literal("\\u")) fail("unpaired surrogate in \\u escape");
            const unsigned lo = parse_hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("invalid low surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired low surrogate in \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail(std::string("invalid escape '\\") + e + "'");
      }
    }
  }

  const std::string& s_;
  std::size_t pos_ = 0;
};

}  // namespace detail

inline Value parse(const std::string& text) { return detail::Parser(text).parse_document(); }

inline Value parse_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("json_lite: cannot open " + path);
  std::ostringstream buf;
  buf << in.rdbuf();
  try {
    return parse(buf.str());
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " in " + path);
  }
}

}  // namespace json_lite
