// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/checkpoint.hpp: saving and resuming a DataParallelTrainer (parameters, optimizer state, step count).
//
//   dpmlp::save_checkpoint(trainer, "run.ckpt");   // collective; rank 0 writes
//   ...
//   dpmlp::load_checkpoint(trainer, "run.ckpt");   // collective; rank 0 reads, every rank gets the state
//
// A resumed run takes the same steps, bit for bit, as a run that was never interrupted (the update of step t
// depends only on the parameters, the optimizer state and t, and all three are restored exactly). With the
// reproducible reduction the bits do not depend on the rank count either, so a checkpoint written at 8 ranks
// resumes at 1 (tests/test_checkpoint_mpi.cpp checks both).
//
// Why rank 0 alone touches the file: the parameters and the optimizer state are replicated, so one copy is
// the whole checkpoint, and the file then needs to exist only on rank 0's file system (a node-local /tmp
// works). Every outcome goes through agree(): a failure on rank 0 (unwritable path, bad file) throws the
// same InputError on every rank, and nothing waits forever.
//
// File format, version 1. All integers and scalars little-endian, no padding, in this order:
//   offset  size        field
//   0       8           magic "DPMLPCK1"
//   8       4   u32     format version (1)
//   12      4   u32     scalar type: 4 = float32, 8 = float64 (the size in bytes of one value)
//   16      4   u32     n = number of widths (layers + 1)
//   20      4n  i32[n]  widths {inputs, hidden..., outputs}
//   ..      4   u32     hidden activation: 0 = relu, 1 = tanh, 2 = identity
//   ..      4   u32     m = length of the optimizer's name
//   ..      m           optimizer name, no terminator ("sgd", "adam")
//   ..      8   u64     S = optimizer state length, in values
//   ..      8   u64     P = number of parameters, in values
//   ..      8   i64     steps done
//   ..      P * scalar  parameters (the Mlp's one contiguous buffer, in its layout, mlp.hpp)
//   ..      S * scalar  optimizer state (the optimizer's one buffer, optim.hpp)
//   ..      8   u64     FNV-1a 64 (dpmlp::fnv1a64) of every byte above
// The optimizer's hyperparameters (learning rate, momentum, betas), the data and the TrainerOptions are not
// in the file: they belong to the code that resumes, which may change them on purpose.
//
// Writing is atomic: rank 0 writes `path.tmp.<pid>`, flushes and fsyncs it, renames it over `path` and fsyncs
// the directory, so `path` is always either the previous checkpoint or the new one, never a partial file.
// A checkpoint that replaces another keeps the old file's permission bits (a 0600 checkpoint stays 0600; the
// temporary file gets them before any byte is written). A writer killed before its rename leaves its
// `path.tmp.<pid>`; the next save to `path` removes every regular file named `path.tmp.<pid>` whose <pid> is
// no running process on this host, and nothing else. (Processes on other hosts are not visible: two jobs on
// different hosts writing one checkpoint path on a shared file system are not supported.)
//
// Reading checks, in this order: the magic, the version and the scalar type (they decide how the rest is
// read), each header field's range as it is read (a width in [0, INT32_MAX], the name length at most
// max_name_length, the step count in [0, max_steps_done]: trainer_options.hpp; no value is cast or computed
// with before its check), the length against the header's sizes (truncated or too long), the checksum, and
// only then whether the checkpoint fits the trainer (widths, activation, optimizer, state size). So a damaged
// header reads as "corrupted", not as a misleading "wrong widths". Nothing in the trainer changes unless the
// whole file validates, and the file is only read.
#pragma once

#include <mpi.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "dpmlp/digest.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/files.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/mlp.hpp"
#include "dpmlp/trainer_options.hpp"

namespace dpmlp {

namespace checkpoint_format {
inline constexpr char magic[8] = {'D', 'P', 'M', 'L', 'P', 'C', 'K', '1'};
inline constexpr std::uint32_t version = 1;
inline constexpr std::uint32_t float32 = 4, float64 = 8;
// The longest optimizer name a reader accepts (the library's are "sgd" and "adam").
inline constexpr std::uint64_t max_name_length = 255;
}  // namespace checkpoint_format

namespace detail {
namespace ckpt {

inline bool host_is_little_endian() {
  const std::uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// The activation's code in the file: fixed here, not the enum's value, so reordering the enum cannot
// silently change the meaning of old files.
inline std::uint32_t activation_code(Activation a) {
  switch (a) {
    case Activation::relu: return 0;
    case Activation::tanh: return 1;
    case Activation::identity: return 2;
  }
  return 0xffffffffu;
}

inline std::string activation_text(std::uint32_t code) {
  switch (code) {
    case 0: return "relu";
    case 1: return "tanh";
    case 2: return "identity";
  }
  return "unknown (code " + std::to_string(code) + ")";
}

inline std::string scalar_text(std::uint32_t code) {
  if (code == checkpoint_format::float32) return "float32";
  if (code == checkpoint_format::float64) return "float64";
  return "unknown (code " + std::to_string(code) + ")";
}

template <class Int>
std::string join_widths(const std::vector<Int>& widths) {
  std::string s;
  for (std::size_t i = 0; i < widths.size(); ++i) s += (i ? "-" : "") + std::to_string(widths[i]);
  return s;
}

inline std::string errno_text(int code) { return std::strerror(code); }

// The header, in file order (everything before the parameters).
struct Header {
  std::uint32_t version = checkpoint_format::version;
  std::uint32_t scalar = 0;
  std::vector<std::int32_t> widths;
  std::uint32_t activation = 0;
  std::string optimizer;
  std::uint64_t state_size = 0, num_params = 0;
  std::int64_t steps = 0;
};

inline void put_le(std::vector<unsigned char>& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>(value >> (8 * i)));
}

inline std::uint64_t get_le(const unsigned char* p, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return value;
}

inline std::vector<unsigned char> encode(const Header& h) {
  std::vector<unsigned char> out(checkpoint_format::magic, checkpoint_format::magic + 8);
  put_le(out, h.version, 4);
  put_le(out, h.scalar, 4);
  put_le(out, h.widths.size(), 4);
  for (std::int32_t w : h.widths) put_le(out, static_cast<std::uint32_t>(w), 4);
  put_le(out, h.activation, 4);
  put_le(out, h.optimizer.size(), 4);
  out.insert(out.end(), h.optimizer.begin(), h.optimizer.end());
  put_le(out, h.state_size, 8);
  put_le(out, h.num_params, 8);
  put_le(out, static_cast<std::uint64_t>(h.steps), 8);
  return out;
}

// Reverses the bytes of each `size`-byte value in place (big-endian hosts only; none that dpmlp targets).
inline void swap_each(unsigned char* p, std::size_t count, std::size_t size) {
  for (std::size_t i = 0; i < count; ++i) std::reverse(p + i * size, p + (i + 1) * size);
}

// A temporary file that removes itself unless kept, so a failed save leaves nothing behind.
class TempFile {
 public:
  explicit TempFile(std::string name) : name_(std::move(name)) {
    file_ = std::fopen(name_.c_str(), "wb");
    open_errno_ = file_ ? 0 : errno;
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (file_) std::fclose(file_);
    if (!kept_) std::remove(name_.c_str());
  }
  std::FILE* get() const { return file_; }
  const std::string& name() const { return name_; }
  int open_errno() const { return open_errno_; }
  // Closes the file; returns 0 or the errno of the failure (a late write error can surface here).
  int close() {
    std::FILE* f = file_;
    file_ = nullptr;
    return std::fclose(f) == 0 ? 0 : errno;
  }
  void keep() { kept_ = true; }

 private:
  std::string name_;
  std::FILE* file_ = nullptr;
  int open_errno_ = 0;
  bool kept_ = false;
};

// Writes bytes and folds them into the running checksum, which covers exactly the bytes in the file.
class HashedWriter {
 public:
  HashedWriter(std::FILE* f, const std::string& name) : file_(f), name_(name) {}
  void write(const void* data, std::size_t bytes) {
    if (bytes == 0) return;
    hash_ = fnv1a64(data, bytes, hash_);
    if (std::fwrite(data, 1, bytes, file_) != bytes) {
      const int code = errno;
      throw InputError("dpmlp::save_checkpoint: writing '" + name_ + "' failed: " + errno_text(code));
    }
  }
  // Values of `size` bytes each, little-endian in the file whatever the host.
  void write_values(const void* data, std::size_t count, std::size_t size) {
    if (host_is_little_endian()) {
      write(data, count * size);
      return;
    }
    std::vector<unsigned char> chunk;
    const auto* p = static_cast<const unsigned char*>(data);
    const std::size_t per_chunk = std::size_t(1) << 16;
    for (std::size_t first = 0; first < count; first += per_chunk) {
      const std::size_t n = std::min(per_chunk, count - first);
      chunk.assign(p + first * size, p + (first + n) * size);
      swap_each(chunk.data(), n, size);
      write(chunk.data(), chunk.size());
    }
  }
  std::uint64_t hash() const { return hash_; }

 private:
  std::FILE* file_;
  std::string name_;
  std::uint64_t hash_ = 0xcbf29ce484222325ull;  // fnv1a64's offset basis: the hash of no bytes
};

// Reads bytes within a file of known length, folding them into the running checksum.
class HashedReader {
 public:
  HashedReader(std::FILE* f, std::uint64_t size, std::string what)
      : file_(f), size_(size), what_(std::move(what)) {}
  std::uint64_t position() const { return position_; }
  std::uint64_t remaining() const { return size_ - position_; }
  std::uint64_t hash() const { return hash_; }

  // `data` may be null: the bytes are then only checksummed.
  void read(void* data, std::uint64_t bytes, const char* field, bool hashed = true) {
    if (bytes > remaining()) {
      throw InputError(what_ + " is truncated: it is " + std::to_string(size_) +
                       " bytes and ends inside the " + field);
    }
    std::vector<unsigned char> scratch;
    auto* out = static_cast<unsigned char*>(data);
    std::uint64_t done = 0;
    while (done < bytes) {
      const std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(bytes - done, std::uint64_t(1) << 20));
      unsigned char* dst = out ? out + done : nullptr;
      if (!dst) {
        scratch.resize(n);
        dst = scratch.data();
      }
      if (std::fread(dst, 1, n, file_) != n) {
        const std::string why = std::ferror(file_) ? errno_text(errno) : "unexpected end of file";
        throw InputError(what_ + ": reading failed (" + why + ")");
      }
      if (hashed) hash_ = fnv1a64(dst, n, hash_);
      done += n;
    }
    position_ += bytes;
  }
  std::uint64_t le(int bytes, const char* field) {
    unsigned char b[8] = {0};
    read(b, static_cast<std::uint64_t>(bytes), field);
    return get_le(b, bytes);
  }

 private:
  std::FILE* file_;
  std::uint64_t size_;
  std::string what_;
  std::uint64_t position_ = 0;
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
};

template <class Trainer>
Header header_of(const Trainer& t) {
  using Scalar = typename Trainer::scalar_type;
  static_assert(std::is_same<Scalar, float>::value || std::is_same<Scalar, double>::value,
                "dpmlp checkpoints hold float32 or float64 parameters");
  Header h;
  h.scalar = sizeof(Scalar) == 4 ? checkpoint_format::float32 : checkpoint_format::float64;
  h.widths.assign(t.model().widths().begin(), t.model().widths().end());
  h.activation = activation_code(t.model().activation());
  h.optimizer = Trainer::optimizer_type::name();
  h.state_size = t.optimizer_state().extent(0);
  h.num_params = t.model().num_params();
  h.steps = t.steps_done();
  return h;
}

// The directory that holds `path`, for the fsync that makes the rename durable.
inline std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The file name part of `path` (after the last '/').
inline std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The temporary file name of a writer with process id `pid`.
inline std::string temporary_name(const std::string& path, long long pid) {
  return path + ".tmp." + std::to_string(pid);
}

// Removes what killed writers of `path` left: regular files named exactly `<base>.tmp.<pid>` in path's
// directory, <pid> a decimal process id other than this process's, for which no process exists (kill(pid, 0)
// fails with ESRCH; a process of another user answers EPERM and its file is kept). Nothing else is touched:
// not other checkpoints' files, not names with anything after the pid, not links or directories. Best effort:
// a file that cannot be removed stays, and the save goes on.
inline void remove_stale_temporaries(const std::string& path) {
  const std::string base = base_name(path);
  if (base.empty()) return;
  const std::string prefix = base + ".tmp.";
  const std::string dir = directory_of(path);
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  const long long me = static_cast<long long>(::getpid());
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    // A canonical decimal pid_t: digits only, no leading zero, at most 10 digits and in the int range.
    if (digits.size() > 10 || digits[0] == '0' ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    const long long pid = std::stoll(digits);
    if (pid > INT_MAX || pid == me) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    const std::string file = dir == "/" ? "/" + name : dir + "/" + name;
    struct stat st;
    if (::lstat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    ::unlink(file.c_str());
  }
  ::closedir(d);
}

// Rank 0's part of save_checkpoint. Throws InputError with the reason.
template <class Trainer>
void write_file(const Trainer& t, const std::string& path) {
  using Scalar = typename Trainer::scalar_type;
  const std::string who = "dpmlp::save_checkpoint: ";
  if (path.empty()) throw InputError(who + "the path is empty");
  const Header h = header_of(t);
  // Host copies (deep_copy waits for the device); on host spaces these are the trainer's own Views.
  const auto params = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), t.model().params());
  const auto state = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), t.optimizer_state());

  // What the rename would replace, and the temporary file, must be regular files (or absent): a FIFO there
  // would block the open, or be replaced without a word.
  require_regular_or_absent(path, who);
  remove_stale_temporaries(path);
  const std::string tmp_name = temporary_name(path, static_cast<long long>(::getpid()));
  require_regular_or_absent(tmp_name, who);
  TempFile tmp(tmp_name);
  if (!tmp.get()) {
    throw InputError(who + "cannot create '" + tmp.name() + "': " + errno_text(tmp.open_errno()));
  }
  // A checkpoint that replaces another keeps its permission bits (the new file would otherwise get the
  // umask's, 0644 for 0600), set before any byte is written so the data is never more readable than before.
  struct stat old;
  if (::stat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode)) {
    if (::fchmod(::fileno(tmp.get()), old.st_mode & 07777) != 0) {
      const int code = errno;
      throw InputError(who + "cannot give '" + tmp.name() + "' the permissions of '" + path + "': " +
                       errno_text(code));
    }
  }
  HashedWriter out(tmp.get(), tmp.name());
  const std::vector<unsigned char> head = encode(h);
  out.write(head.data(), head.size());
  out.write_values(params.data(), h.num_params, sizeof(Scalar));
  out.write_values(state.data(), h.state_size, sizeof(Scalar));
  std::vector<unsigned char> sum;
  put_le(sum, out.hash(), 8);
  out.write(sum.data(), sum.size());

  // fflush moves the bytes to the kernel, fsync to the disk: without it a crash after the rename could leave
  // `path` naming an empty or partial file.
  if (std::fflush(tmp.get()) != 0) {
    const int code = errno;
    throw InputError(who + "writing '" + tmp.name() + "' failed: " + errno_text(code));
  }
  if (::fsync(::fileno(tmp.get())) != 0) {
    const int code = errno;
    throw InputError(who + "fsync of '" + tmp.name() + "' failed: " + errno_text(code));
  }
  if (const int code = tmp.close()) {
    throw InputError(who + "closing '" + tmp.name() + "' failed: " + errno_text(code));
  }
  if (std::rename(tmp.name().c_str(), path.c_str()) != 0) {
    const int code = errno;
    throw InputError(who + "cannot rename '" + tmp.name() + "' to '" + path + "': " + errno_text(code));
  }
  tmp.keep();
  // The rename is durable once the directory entry is on disk. Some file systems cannot fsync a directory
  // (EINVAL, ENOTSUP); there the rename is as durable as they make it.
  const std::string dir = directory_of(path);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) {
    const int code = errno;
    throw InputError(who + "wrote '" + path +
                     "' but cannot open its directory to sync it: " + errno_text(code));
  }
  const int synced = ::fsync(fd);
  const int code = synced == 0 ? 0 : errno;
  ::close(fd);
  if (code != 0 && code != EINVAL && code != ENOTSUP) {
    throw InputError(who + "wrote '" + path + "' but the fsync of its directory failed: " + errno_text(code));
  }
}

// Rank 0's part of load_checkpoint: reads and validates the whole file into the host buffers (which must
// hold the trainer's num_params and state size). Returns the step count. Throws InputError with the reason.
template <class Trainer, class HostView>
std::int64_t read_file(const Trainer& t, const std::string& path, const HostView& params,
                       const HostView& state) {
  using Scalar = typename Trainer::scalar_type;
  const std::string what = "dpmlp::load_checkpoint: '" + path + "'";
  // A FIFO or a device is refused before anything could block on it.
  std::FILE* f = open_regular_for_reading(path, "dpmlp::load_checkpoint: ");
  if (!f) {
    const int code = errno;
    throw InputError(what + ": cannot open: " + errno_text(code));
  }
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  struct stat st;
  if (::fstat(::fileno(f), &st) != 0) {
    const int code = errno;
    throw InputError(what + ": cannot stat: " + errno_text(code));
  }
  if (S_ISDIR(st.st_mode)) throw InputError(what + ": is a directory, not a checkpoint file");
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  HashedReader in(f, size, what);

  const Header mine = header_of(t);
  // Magic, version, scalar type: they decide how the rest of the file is read, so they come first.
  char magic[8] = {0};
  if (size < sizeof magic) {
    throw InputError(what + " is not a dpmlp checkpoint (" + std::to_string(size) + " bytes, too short)");
  }
  in.read(magic, sizeof magic, "magic");
  if (std::memcmp(magic, checkpoint_format::magic, sizeof magic) != 0) {
    throw InputError(what + " is not a dpmlp checkpoint (bad magic; expected \"DPMLPCK1\")");
  }
  Header h;
  h.version = static_cast<std::uint32_t>(in.le(4, "version"));
  if (h.version != checkpoint_format::version) {
    throw InputError(what + " has format version " + std::to_string(h.version) +
                     "; this dpmlp reads version " + std::to_string(checkpoint_format::version));
  }
  h.scalar = static_cast<std::uint32_t>(in.le(4, "scalar type"));
  if (h.scalar != mine.scalar) {
    throw InputError(what + " holds " + scalar_text(h.scalar) + " values; the trainer's model is " +
                     scalar_text(mine.scalar));
  }
  const std::uint64_t n_widths = in.le(4, "number of widths");
  if (n_widths > in.remaining() / 4) {
    throw InputError(what + " is truncated: it is " + std::to_string(size) +
                     " bytes and ends inside the widths");
  }
  // Every field is range-checked as it is read, before it is cast or computed with: a flipped bit anywhere
  // in the header must end in an InputError naming the field, never in an overflow.
  auto out_of_range = [&](const std::string& field, std::uint64_t value, std::uint64_t limit) {
    return InputError(what + " is corrupted: the " + field + " is " + std::to_string(value) + ", not in [0, " +
                      std::to_string(limit) + "]");
  };
  for (std::uint64_t i = 0; i < n_widths; ++i) {
    const std::uint64_t width = in.le(4, "widths");
    const auto max_width = static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max());
    if (width > max_width) throw out_of_range("width " + std::to_string(i), width, max_width);
    h.widths.push_back(static_cast<std::int32_t>(width));
  }
  h.activation = static_cast<std::uint32_t>(in.le(4, "activation"));
  const std::uint64_t name_length = in.le(4, "optimizer name");
  if (name_length > checkpoint_format::max_name_length) {
    throw out_of_range("optimizer name length", name_length, checkpoint_format::max_name_length);
  }
  if (name_length > in.remaining()) {
    throw InputError(what + " is truncated: it is " + std::to_string(size) +
                     " bytes and ends inside the optimizer name");
  }
  h.optimizer.resize(static_cast<std::size_t>(name_length));
  in.read(&h.optimizer[0], name_length, "optimizer name");
  h.state_size = in.le(8, "optimizer state length");
  h.num_params = in.le(8, "number of parameters");
  const std::uint64_t steps = in.le(8, "step count");
  // The bound keeps every later step number (steps + the steps of a run) far from overflowing int64.
  const auto max_steps = static_cast<std::uint64_t>(max_steps_done);
  if (steps > max_steps) throw out_of_range("step count", steps, max_steps);
  h.steps = static_cast<std::int64_t>(steps);

  // The length the header promises, checked without overflow: num_params and state_size are any u64, so
  // they are compared with what the rest of the file can hold before they are added or multiplied.
  const std::uint64_t value_bytes = sizeof(Scalar);
  const std::uint64_t room = in.remaining() / value_bytes;
  if (h.num_params > room || h.state_size > room - h.num_params ||
      (h.num_params + h.state_size) * value_bytes + 8 > in.remaining()) {
    // The promised length, position + (P + S) * value_bytes + 8, where it fits in 64 bits.
    const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
    const std::uint64_t fixed = in.position() + 8;  // at most the file's size + 8
    const bool fits = h.num_params <= max - h.state_size &&
                      h.num_params + h.state_size <= (max - fixed) / value_bytes;
    const std::string promised =
        fits ? std::to_string(fixed + (h.num_params + h.state_size) * value_bytes)
             : "more than " + std::to_string(max) + " (" + std::to_string(h.num_params) + " parameters and " +
                   std::to_string(h.state_size) + " optimizer state values)";
    throw InputError(what + " is truncated: it is " + std::to_string(size) + " bytes, its header says " + promised);
  }
  const std::uint64_t expected = in.position() + (h.num_params + h.state_size) * value_bytes + 8;
  if (size > expected) {
    throw InputError(what + " is corrupted: it is " + std::to_string(size) + " bytes, its header says " +
                     std::to_string(expected));
  }
  // Read straight into the buffers when they fit; otherwise only checksum (the file is refused below).
  const bool fits = h.num_params == mine.num_params && h.state_size == mine.state_size;
  in.read(fits ? static_cast<void*>(params.data()) : nullptr, h.num_params * value_bytes, "parameters");
  in.read(fits ? static_cast<void*>(state.data()) : nullptr, h.state_size * value_bytes, "optimizer state");
  const std::uint64_t computed = in.hash();
  const std::uint64_t stored = in.le(8, "checksum");
  if (stored != computed) {
    throw InputError(what + " is corrupted: checksum mismatch (stored " + hex16(stored) + ", computed " +
                     hex16(computed) + ")");
  }

  // The file is intact; does it fit this trainer?
  if (h.widths != mine.widths) {
    throw InputError(what + ": checkpoint is for widths " + join_widths(h.widths) + ", model is " +
                     join_widths(mine.widths));
  }
  if (h.activation != mine.activation) {
    throw InputError(what + ": checkpoint is for hidden activation " + activation_text(h.activation) +
                     ", model uses " + activation_text(mine.activation));
  }
  if (h.optimizer != mine.optimizer) {
    throw InputError(what + ": checkpoint is for optimizer " + h.optimizer + ", the trainer uses " +
                     mine.optimizer);
  }
  if (h.state_size != mine.state_size) {
    throw InputError(what + ": checkpoint has an optimizer state of " + std::to_string(h.state_size) +
                     " values, the trainer's " + mine.optimizer + " has " + std::to_string(mine.state_size) +
                     " (e.g. momentum on in one, off in the other)");
  }
  if (h.num_params != mine.num_params) {  // implied by the widths; a guard against a hand-edited header
    throw InputError(what + " is corrupted: " + std::to_string(h.num_params) + " parameters for widths " +
                     join_widths(h.widths));
  }
  if (!host_is_little_endian()) {
    swap_each(reinterpret_cast<unsigned char*>(params.data()), h.num_params, sizeof(Scalar));
    swap_each(reinterpret_cast<unsigned char*>(state.data()), h.state_size, sizeof(Scalar));
  }
  return h.steps;
}

// MPI_Bcast of a host View's bytes, any number of them (MPI counts are int). An abandoned request keeps the
// View (comm/timed.hpp).
template <class HostView>
void broadcast_bytes(const HostView& data, int root, MPI_Comm comm) {
  auto* p = reinterpret_cast<unsigned char*>(data.data());
  const std::size_t bytes = data.span() * sizeof(typename HostView::value_type);
  const std::size_t chunk = std::size_t(1) << 30;
  for (std::size_t first = 0; first < bytes; first += chunk) {
    const int n = static_cast<int>(std::min(chunk, bytes - first));
    detail::timed(
        comm, "MPI_Bcast (dpmlp::load_checkpoint: the values)",
        [&](MPI_Request* r) { return MPI_Ibcast(p + first, n, MPI_BYTE, root, comm, r); }, data);
  }
}

}  // namespace ckpt
}  // namespace detail

// Collective over t.communicator(). Rank 0 writes the checkpoint to `path` atomically; every rank returns,
// or every rank throws the same InputError with rank 0's reason (the path cannot be created, the disk is
// full, ...).
template <class Trainer>
void save_checkpoint(const Trainer& t, const std::string& path) {
  const MPI_Comm comm = t.communicator().mpi_comm();
  int rank = 0;
  detail::check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  std::string problem;
  if (rank == 0) {
    try {
      detail::ckpt::write_file(t, path);
    } catch (const std::exception& e) {
      problem = e.what();
      if (problem.empty()) problem = "dpmlp::save_checkpoint: unknown error";
    }
  }
  agree<InputError>(comm, problem);
}

// Collective over t.communicator(). Rank 0 reads and validates `path`; then every rank either gets its
// parameters, optimizer state and step count from it, or throws the same InputError with no change to the
// trainer. The trainer must have been built as the saved one was (widths, activation, scalar type, optimizer
// type with the same state size); its data, options and the optimizer's hyperparameters are its own.
template <class Trainer>
void load_checkpoint(Trainer& t, const std::string& path) {
  using Scalar = typename Trainer::scalar_type;
  using HostView = Kokkos::View<Scalar*, Kokkos::HostSpace>;
  const MPI_Comm comm = t.communicator().mpi_comm();
  int rank = 0;
  detail::check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  const std::uint64_t num_params = t.model().num_params();
  const std::uint64_t state_size = t.optimizer_state().extent(0);
  // Fresh host buffers, never mirrors: on a host space a mirror is the trainer's own View, and the trainer
  // must not change before the whole file has validated.
  const HostView params(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::checkpoint::params"),
                        num_params);
  const HostView state(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::checkpoint::state"),
                       state_size);
  std::int64_t steps = 0;
  std::string problem;
  if (rank == 0) {
    try {
      steps = detail::ckpt::read_file(t, path, params, state);
    } catch (const std::exception& e) {
      problem = e.what();
      if (problem.empty()) problem = "dpmlp::load_checkpoint: unknown error";
    }
  }
  agree<InputError>(comm, problem);

  // Rank 0 validated against its own trainer; the broadcasts below also need every other rank's trainer to
  // have the same sizes (or the MPI_Bcast counts would not match).
  std::uint64_t shape[3] = {num_params, state_size, static_cast<std::uint64_t>(steps)};
  timed_bcast(shape, 3, MPI_UINT64_T, 0, comm, "MPI_Bcast (dpmlp::load_checkpoint: the sizes)");
  std::string mismatch;
  if (shape[0] != num_params || shape[1] != state_size) {
    mismatch = "dpmlp::load_checkpoint: this rank's trainer has " + std::to_string(num_params) +
               " parameters and " + std::to_string(state_size) + " optimizer state values, rank 0's has " +
               std::to_string(shape[0]) + " and " + std::to_string(shape[1]);
  }
  agree<InputError>(comm, mismatch);
  detail::ckpt::broadcast_bytes(params, 0, comm);
  detail::ckpt::broadcast_bytes(state, 0, comm);
  // Into the trainer's own Views, never replacing them: whatever holds their pointers (the model's other
  // copies, a captured CUDA graph step) sees the loaded values. deep_copy without a space argument waits for
  // the copy, so the host buffers may go when this returns.
  Kokkos::deep_copy(t.model().params(), params);
  Kokkos::deep_copy(t.optimizer_state(), state);
  t.set_steps_done(static_cast<std::int64_t>(shape[2]));
}

// The FNV-1a 64 digest of this rank's parameter bytes (local, not collective): equal digests on every rank
// mean the replicas agree; equal digests across runs mean bitwise-equal parameters.
template <class Trainer>
std::uint64_t params_digest(const Trainer& t) {
  return digest(t.model().params());
}

}  // namespace dpmlp
