// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/npy.hpp: NumPy .npy files. A model's parameters as one file per tensor, and a general array pair.
//
//   dpmlp::save_npy_model(model, "weights/");   // weights/w0.npy, b0.npy, w1.npy, b1.npy, ...
//   dpmlp::load_npy_model(model, "weights/");   // the same files back into a model with the same widths
//   dpmlp::save_npy("a.npy", data, {rows, cols});          // any float/double/integer buffer, C order
//   auto a = dpmlp::load_npy<float>("a.npy");              // a.shape, a.data (std::vector<float>)
//
// In Python:  W = [np.load(f"weights/w{l}.npy") for l in range(L)]; b = [np.load(f"weights/b{l}.npy") ...]
//             y = relu(x @ W[0] + b[0]) @ W[1] + b[1]          (jax/flax Dense kernels have this layout too)
//
// What is written: format version 1.0, the dtype of the model's scalar, little-endian ('<f4' for float,
// '<f8' for double), C order (fortran_order False). Layer l's weight is shaped (in, out) = (widths[l],
// widths[l+1]), row-major, exactly the Mlp's own layout (mlp.hpp: x @ W); its bias is shaped (out,). Each
// file goes to `path.tmp.<pid>` first and is renamed over `path`, so a reader never sees half a file.
//
// What is read: format versions 1.0, 2.0 and 3.0 (as numpy.save writes them), with exactly the expected
// dtype (no conversion: a '<f8' file does not load into a float model), C order, and the expected shape.
// Anything else is refused with dpmlp::InputError naming the file and what is wrong: a missing or
// unreadable file, a bad magic string, an unsupported version, a header that is not a valid npy
// dictionary, the wrong dtype, Fortran order, the wrong shape, a file shorter or longer than its header
// says. load_npy_model reads and checks every file before it touches the model, so a refused import leaves
// the model as it was; it also refuses a directory that holds more layers than the model has.
//
// Host-side code. Models in device memory are copied through a host mirror (one copy of the parameter
// buffer each way). Parameters are replicated over the ranks of a trainer, so in an MPI program rank 0 alone
// saves; for loading, every rank may read the files, or rank 0 reads them before the trainer is built (the
// trainer broadcasts rank 0's parameters at start, TrainerOptions::broadcast_initial_params). None of these
// functions is collective: wrap them in dpmlp::all_or_none(comm, ...) (errors.hpp) when a failure on one rank
// must stop all of them.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "dpmlp/errors.hpp"
#include "dpmlp/files.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/mlp.hpp"

namespace dpmlp {

// The npy dtype string of T, in little-endian byte order ("<f4", "<f8", "<i4", "|u1", ...).
template <class T>
const char* npy_dtype() {
  static_assert(std::is_arithmetic<T>::value && !std::is_same<T, bool>::value && !std::is_same<T, long double>::value,
                "dpmlp::npy_dtype: T must be a float, double or integer type");
  if (std::is_floating_point<T>::value) return sizeof(T) == 4 ? "<f4" : "<f8";
  if (std::is_signed<T>::value) {
    switch (sizeof(T)) {
      case 1: return "|i1";
      case 2: return "<i2";
      case 4: return "<i4";
      default: return "<i8";
    }
  }
  switch (sizeof(T)) {
    case 1: return "|u1";
    case 2: return "<u2";
    case 4: return "<u4";
    default: return "<u8";
  }
}

// What an npy header says.
struct NpyHeader {
  int major = 1, minor = 0;         // format version
  std::string dtype;                // the 'descr' string, e.g. "<f4"
  bool fortran_order = false;
  std::vector<std::size_t> shape;   // () for a scalar
  std::size_t data_offset = 0;      // where the data starts in the file
  std::size_t count() const {
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    return n;
  }
};

// An array read from an npy file: its shape and its values, in C order.
template <class T>
struct NpyArray {
  std::vector<std::size_t> shape;
  std::vector<T> data;
};

// "(3, 4)", "(3,)", "()": a shape as Python writes a tuple.
inline std::string npy_shape_string(const std::vector<std::size_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

namespace detail {
namespace npy {

inline constexpr char magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

inline bool host_is_little_endian() {
  const std::uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

inline std::string errno_text(int code) { return std::strerror(code); }

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// The header dictionary numpy writes: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }, padded
// with spaces and ended with '\n' so that the data starts at a multiple of 64 bytes (numpy >= 1.17 does the
// same; older readers only need 16).
inline std::string make_header(const char* dtype, const std::vector<std::size_t>& shape) {
  std::string dict = std::string("{'descr': '") + dtype + "', 'fortran_order': False, 'shape': " +
                     npy_shape_string(shape) + ", }";
  const std::size_t preamble = 10;  // magic (6) + version (2) + header length (2)
  std::size_t total = preamble + dict.size() + 1;
  total = (total + 63) / 64 * 64;
  dict.append(total - preamble - dict.size() - 1, ' ');
  dict += '\n';
  return dict;
}

// A small parser for the header's Python literal: a dict of str keys to str, bool or tuple-of-int values.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& where) : s_(text), where_(where) {}

  void parse(NpyHeader& h) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_space();
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') {
        ++i_;
        break;
      }
      const std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"') fail("'descr' is not a string (structured dtypes are not supported)");
        h.dtype = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = parse_bool();
        have_order = true;
      } else if (key == "shape") {
        h.shape = parse_shape();
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "' in the header");
      }
      skip_space();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      skip_space();
      expect('}');
      break;
    }
    skip_space();
    if (i_ != s_.size()) fail("text after the header dictionary");
    if (!have_descr) fail("the header has no 'descr'");
    if (!have_order) fail("the header has no 'fortran_order'");
    if (!have_shape) fail("the header has no 'shape'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(where_ + ": bad npy header: " + what + " (header: \"" + printable() + "\")");
  }
  std::string printable() const {
    std::string out;
    for (char c : s_.substr(0, 200)) out += (c >= 32 && c < 127) ? c : '?';
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out;
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "' at offset " + std::to_string(i_));
    ++i_;
  }
  std::string parse_string() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string at offset " + std::to_string(i_));
    ++i_;
    const std::size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\') fail("escapes in strings are not supported");
      ++i_;
    }
    if (i_ >= s_.size()) fail("unterminated string");
    return s_.substr(start, i_++ - start);
  }
  bool parse_bool() {
    if (s_.compare(i_, 4, "True") == 0) {
      i_ += 4;
      return true;
    }
    if (s_.compare(i_, 5, "False") == 0) {
      i_ += 5;
      return false;
    }
    fail("'fortran_order' is not True or False");
    return false;
  }
  std::vector<std::size_t> parse_shape() {
    std::vector<std::size_t> shape;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') {
        ++i_;
        break;
      }
      if (peek() < '0' || peek() > '9') fail("'shape' is not a tuple of non-negative integers");
      std::size_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        const std::size_t digit = static_cast<std::size_t>(peek() - '0');
        if (v > (std::numeric_limits<std::size_t>::max() - digit) / 10) fail("a dimension in 'shape' is too large");
        v = v * 10 + digit;
        ++i_;
      }
      if (peek() == 'L') ++i_;  // Python 2's long literal
      shape.push_back(v);
      skip_space();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      skip_space();
      expect(')');
      break;
    }
    return shape;
  }

  const std::string& s_;
  std::string where_;
  std::size_t i_ = 0;
};

// Little-endian file order <-> host order (the same swap both ways; nothing to do on little-endian hosts).
template <class T>
void to_little_endian(T* data, std::size_t n) {
  if constexpr (sizeof(T) > 1) {
    if (host_is_little_endian()) return;
    for (std::size_t i = 0; i < n; ++i) {
      unsigned char* b = reinterpret_cast<unsigned char*>(data + i);
      std::reverse(b, b + sizeof(T));
    }
  } else {
    (void)data;
    (void)n;
  }
}

inline std::uint64_t file_size(std::FILE* f) {
  struct stat st;
  if (::fstat(::fileno(f), &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_size);
}

inline std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// mkdir -p.
inline void make_directories(const std::string& dir, const std::string& who) {
  std::string partial;
  std::size_t pos = 0;
  while (pos <= dir.size()) {
    const std::size_t next = dir.find('/', pos);
    partial = dir.substr(0, next == std::string::npos ? dir.size() : next);
    if (!partial.empty() && ::mkdir(partial.c_str(), 0777) != 0 && errno != EEXIST) {
      const int code = errno;
      throw InputError(who + ": cannot create directory '" + partial + "': " + errno_text(code));
    }
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw InputError(who + ": '" + dir + "' is not a directory");
  }
}

inline bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace npy
}  // namespace detail

namespace detail {
namespace npy {

inline File open_for_reading(const std::string& path) {
  // A FIFO or a device is refused before anything could block on it.
  File f(open_regular_for_reading(path, ""));
  if (!f) {
    const int code = errno;
    throw InputError(path + ": cannot open: " + errno_text(code));
  }
  return f;
}

// Reads and checks the header from an open file (magic, version, dictionary, and that the file is at least
// as long as its header); `size` is the file's length, from the same handle. Everything a reader checks
// and reads afterwards must come from this same handle: a second open of `path` may find another file (a
// writer renames its new file over the path at any moment, save_npy included).
inline NpyHeader read_header(std::FILE* f, const std::string& path, std::uint64_t& size) {
  size = file_size(f);
  unsigned char pre[12] = {};
  const std::size_t got = std::fread(pre, 1, sizeof(pre), f);
  if (got < 10 || std::memcmp(pre, magic, sizeof(magic)) != 0) {
    if (got >= 6 && std::memcmp(pre, magic, sizeof(magic)) == 0) {
      throw InputError(path + ": truncated: " + std::to_string(size) + " bytes, shorter than the npy preamble");
    }
    throw InputError(path + ": not an npy file (bad magic string; expected \"\\x93NUMPY\")");
  }
  NpyHeader h;
  h.major = pre[6];
  h.minor = pre[7];
  std::size_t header_len = 0, preamble = 0;
  if (h.major == 1 && h.minor == 0) {
    header_len = static_cast<std::size_t>(pre[8]) | static_cast<std::size_t>(pre[9]) << 8;
    preamble = 10;
  } else if ((h.major == 2 || h.major == 3) && h.minor == 0) {
    if (got < 12) throw InputError(path + ": truncated: shorter than the npy preamble");
    header_len = static_cast<std::size_t>(pre[8]) | static_cast<std::size_t>(pre[9]) << 8 |
                 static_cast<std::size_t>(pre[10]) << 16 | static_cast<std::size_t>(pre[11]) << 24;
    preamble = 12;
  } else {
    throw InputError(path + ": unsupported npy format version " + std::to_string(h.major) + "." +
                     std::to_string(h.minor) + " (1.0, 2.0 and 3.0 are read)");
  }
  if (static_cast<std::uint64_t>(preamble) + header_len > size) {
    throw InputError(path + ": truncated: the header says " + std::to_string(header_len) + " header bytes, the file has " +
                     std::to_string(size) + " bytes in all");
  }
  std::string text(header_len, '\0');
  if (std::fseek(f, static_cast<long>(preamble), SEEK_SET) != 0 ||
      std::fread(&text[0], 1, header_len, f) != header_len) {
    throw InputError(path + ": cannot read the npy header");
  }
  HeaderParser(text, path).parse(h);
  h.data_offset = preamble + header_len;
  // The element count, with overflow caught (a corrupted shape must not turn into a huge allocation).
  std::size_t count = 1;
  for (std::size_t d : h.shape) {
    if (d != 0 && count > std::numeric_limits<std::size_t>::max() / d) {
      throw InputError(path + ": bad npy header: shape " + npy_shape_string(h.shape) + " overflows");
    }
    count *= d;
  }
  return h;
}

// The checks of a header against the type read into: the dtype and C order.
template <class T>
void check_layout(const NpyHeader& h, const std::string& path) {
  if (h.dtype != npy_dtype<T>()) {
    throw InputError(path + ": dtype '" + h.dtype + "', expected '" + npy_dtype<T>() + "'");
  }
  if (h.fortran_order) {
    throw InputError(path + ": Fortran order (fortran_order True); expected C order (save it from numpy with "
                            "np.save(path, np.ascontiguousarray(a)))");
  }
}

// The data's length against the header's shape: exactly h.count() values of T after the header.
template <class T>
void check_length(const NpyHeader& h, const std::string& path, std::uint64_t size) {
  const std::size_t count = h.count();
  const std::uint64_t have = size - h.data_offset;  // read_header checked data_offset <= size
  const std::uint64_t want = static_cast<std::uint64_t>(count) * sizeof(T);
  if (count != 0 && want / count != sizeof(T)) {
    throw InputError(path + ": bad npy header: shape " + npy_shape_string(h.shape) + " overflows");
  }
  if (have < want) {
    throw InputError(path + ": truncated: shape " + npy_shape_string(h.shape) + " of '" + h.dtype + "' needs " +
                     std::to_string(want) + " data bytes, the file has " + std::to_string(have));
  }
  if (have > want) {
    throw InputError(path + ": " + std::to_string(have - want) + " bytes after the data of shape " +
                     npy_shape_string(h.shape) + " (the file is longer than its header says)");
  }
}

// Reads the data that `h` describes from `f` (the handle `h` was read from; check_length passed) into `out`,
// which holds `capacity` values. At most `capacity` values are ever written, whatever the file holds.
template <class T>
void read_data(std::FILE* f, const std::string& path, const NpyHeader& h, T* out, std::size_t capacity) {
  const std::size_t count = h.count();
  if (count > capacity) {
    throw InputError(path + ": shape " + npy_shape_string(h.shape) + " holds " + std::to_string(count) +
                     " values, more than the " + std::to_string(capacity) + " the buffer holds");
  }
  if (count > 0) {
    if (std::fseek(f, static_cast<long>(h.data_offset), SEEK_SET) != 0 || std::fread(out, sizeof(T), count, f) != count) {
      throw InputError(path + ": cannot read the data");
    }
    to_little_endian(out, count);
  }
  // The file may have grown since its length was taken (a writer appending to this very file): what lies
  // beyond the data is refused, and never read into the buffer.
  if (std::fgetc(f) != EOF) {
    throw InputError(path + ": bytes after the data of shape " + npy_shape_string(h.shape) +
                     " (the file is longer than its header says)");
  }
}

}  // namespace npy
}  // namespace detail

// Reads and checks the header of an npy file (magic, version, dictionary, and that the file is as long as
// the header says).
inline NpyHeader read_npy_header(const std::string& path) {
  using namespace detail::npy;
  const File f = open_for_reading(path);
  std::uint64_t size = 0;
  return read_header(f.get(), path, size);
}

// Writes `data` (count = product of shape, C order) as an npy file (format 1.0, little-endian). A shape of {}
// is a scalar (one value).
template <class T>
void save_npy(const std::string& path, const T* data, const std::vector<std::size_t>& shape) {
  using namespace detail::npy;
  const std::string header = make_header(npy_dtype<T>(), shape);
  if (header.size() > 65535) throw InputError(path + ": the npy header would exceed 65535 bytes (too many dimensions)");
  std::size_t count = 1;
  for (std::size_t d : shape) count *= d;
  if (count > 0 && data == nullptr) throw InputError(path + ": save_npy was given no data");
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  // What the rename would replace, and the temporary file, must be regular files (or absent).
  require_regular_or_absent(path, "");
  require_regular_or_absent(tmp, "");
  {
    File f(std::fopen(tmp.c_str(), "wb"));
    if (!f) {
      const int code = errno;
      throw InputError(path + ": cannot create '" + tmp + "': " + errno_text(code));
    }
    unsigned char pre[10];
    std::memcpy(pre, magic, sizeof(magic));
    pre[6] = 1;
    pre[7] = 0;
    pre[8] = static_cast<unsigned char>(header.size() & 0xff);
    pre[9] = static_cast<unsigned char>(header.size() >> 8);
    bool ok = std::fwrite(pre, 1, sizeof(pre), f.get()) == sizeof(pre) &&
              std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
    if (ok && count > 0) {
      if (host_is_little_endian() || sizeof(T) == 1) {
        ok = std::fwrite(data, sizeof(T), count, f.get()) == count;
      } else {
        std::vector<T> le(data, data + count);
        to_little_endian(le.data(), count);
        ok = std::fwrite(le.data(), sizeof(T), count, f.get()) == count;
      }
    }
    ok = std::fflush(f.get()) == 0 && ok;
    const int code = errno;
    if (!ok) {
      f.reset();
      std::remove(tmp.c_str());
      throw InputError(path + ": write failed: " + errno_text(code));
    }
    if (std::fclose(f.release()) != 0) {
      const int close_code = errno;
      std::remove(tmp.c_str());
      throw InputError(path + ": write failed: " + errno_text(close_code));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int code = errno;
    std::remove(tmp.c_str());
    throw InputError(path + ": cannot rename '" + tmp + "' to it: " + errno_text(code));
  }
}

template <class T>
void save_npy(const std::string& path, const std::vector<T>& data, const std::vector<std::size_t>& shape) {
  std::size_t count = 1;
  for (std::size_t d : shape) count *= d;
  if (count != data.size()) {
    throw InputError(path + ": save_npy: shape " + npy_shape_string(shape) + " holds " + std::to_string(count) +
                     " values, the vector has " + std::to_string(data.size()));
  }
  save_npy(path, data.data(), shape);
}

// Reads an npy file of dtype npy_dtype<T>() in C order, any shape. One open: the header and the data come
// from the same file, even if another is renamed over `path` meanwhile.
template <class T>
NpyArray<T> load_npy(const std::string& path) {
  using namespace detail::npy;
  const File f = open_for_reading(path);
  std::uint64_t size = 0;
  const NpyHeader h = read_header(f.get(), path, size);
  check_layout<T>(h, path);
  check_length<T>(h, path, size);  // before the allocation: a shape the file cannot fill sizes no buffer
  NpyArray<T> a;
  a.shape = h.shape;
  a.data.resize(h.count());
  read_data(f.get(), path, h, a.data.data(), a.data.size());
  return a;
}

// Reads an npy file of dtype npy_dtype<T>() and exactly `shape` into `out`, a buffer of (product of shape)
// values. One open, as load_npy(path): the shape that is checked is the shape of the data that is read, and
// `out` is written only once the whole file has been read and checked, never beyond its size.
template <class T>
void load_npy(const std::string& path, T* out, const std::vector<std::size_t>& shape) {
  using namespace detail::npy;
  std::size_t capacity = 1;
  for (std::size_t d : shape) {
    if (d != 0 && capacity > std::numeric_limits<std::size_t>::max() / d) {
      throw InputError(path + ": the expected shape " + npy_shape_string(shape) + " overflows");
    }
    capacity *= d;
  }
  const File f = open_for_reading(path);
  std::uint64_t size = 0;
  const NpyHeader h = read_header(f.get(), path, size);
  if (h.shape != shape) {
    throw InputError(path + ": shape " + npy_shape_string(h.shape) + ", expected " + npy_shape_string(shape));
  }
  check_layout<T>(h, path);
  check_length<T>(h, path, size);
  // Staged, so a failure part way leaves `out` as it was; sized by the caller's shape, not by the file.
  std::vector<T> staged(capacity);
  read_data(f.get(), path, h, staged.data(), staged.size());
  if (capacity > 0) std::memcpy(out, staged.data(), capacity * sizeof(T));
}

// ---- models

// The file names of layer l: "w<l>.npy", "b<l>.npy".
inline std::string npy_weight_name(int l) { return "w" + std::to_string(l) + ".npy"; }
inline std::string npy_bias_name(int l) { return "b" + std::to_string(l) + ".npy"; }

// Writes the model's parameters into `dir` (created if missing): w<l>.npy shaped (widths[l], widths[l+1])
// and b<l>.npy shaped (widths[l+1],) for every layer l, in the model's scalar type. Host-side; a model in
// device memory is copied to the host once.
template <class Scalar, class MemorySpace>
void save_npy_model(const Mlp<Scalar, MemorySpace>& model, const std::string& dir) {
  using namespace detail::npy;
  make_directories(dir, "dpmlp::save_npy_model");
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  const auto& w = model.widths();
  for (int l = 0; l < model.layers(); ++l) {
    const std::size_t in = static_cast<std::size_t>(w[l]), out = static_cast<std::size_t>(w[l + 1]);
    save_npy(join(dir, npy_weight_name(l)), host.data() + model.weight_offset(l), {in, out});
    save_npy(join(dir, npy_bias_name(l)), host.data() + model.bias_offset(l), {out});
  }
}

// Reads w<l>.npy and b<l>.npy from `dir` into a model with the widths they were saved from (the activation
// is not in the files: it is the model's). Every file is read and checked before the model changes.
template <class Scalar, class MemorySpace>
void load_npy_model(Mlp<Scalar, MemorySpace>& model, const std::string& dir) {
  using namespace detail::npy;
  const auto& w = model.widths();
  std::string widths_text = "{";
  for (std::size_t i = 0; i < w.size(); ++i) widths_text += (i ? ", " : "") + std::to_string(w[i]);
  widths_text += "}";
  auto context = [&](int l) { return " (layer " + std::to_string(l) + " of a model with widths " + widths_text + ")"; };
  // The parameters, staged on the host; the model is written only once everything has been read.
  Kokkos::View<Scalar*, Kokkos::HostSpace> staged("dpmlp::load_npy_model", model.num_params());
  for (int l = 0; l < model.layers(); ++l) {
    const std::size_t in = static_cast<std::size_t>(w[l]), out = static_cast<std::size_t>(w[l + 1]);
    const std::string wp = join(dir, npy_weight_name(l)), bp = join(dir, npy_bias_name(l));
    try {
      load_npy(wp, staged.data() + model.weight_offset(l), {in, out});
      load_npy(bp, staged.data() + model.bias_offset(l), {out});
    } catch (const InputError& e) {
      throw InputError(std::string("dpmlp::load_npy_model: ") + e.what() + context(l));
    }
  }
  const int L = model.layers();
  for (const std::string& extra : {npy_weight_name(L), npy_bias_name(L)}) {
    if (file_exists(join(dir, extra))) {
      throw InputError("dpmlp::load_npy_model: " + join(dir, extra) + " exists, but the model has only " +
                       std::to_string(L) + " layers (widths " + widths_text + "); the files are of a deeper model");
    }
  }
  Kokkos::deep_copy(model.params(), staged);
  compat::fence("dpmlp::load_npy_model");
}

}  // namespace dpmlp
