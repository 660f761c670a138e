// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/files.hpp: opening files without blocking on what is not a file.
//
// fopen of a FIFO waits for the other end, and a read of a terminal or a device can wait forever: on one rank
// of a collective program that is a hang of every rank. So dpmlp reads and writes regular files only: a
// path that names anything else (a FIFO, a device, a socket, a directory) is refused with InputError before
// any blocking call, and a file to read is opened non-blocking and checked on its descriptor (no window
// between the check and the open).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "dpmlp/exceptions.hpp"

namespace dpmlp {
namespace detail {

inline const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace detail

// "" when `path` is a regular file (symbolic links followed) or does not exist; otherwise why it cannot be
// one dpmlp reads or replaces: "'<path>' is a FIFO (named pipe), not a regular file".
inline std::string regular_or_absent(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return {};  // absent (or unreachable: the open reports why)
  if (S_ISREG(st.st_mode)) return {};
  return "'" + path + "' is " + detail::file_kind(st.st_mode) + ", not a regular file";
}

// Throws InputError("<who>: '<path>' is a FIFO ...") unless `path` is a regular file or absent.
inline void require_regular_or_absent(const std::string& path, const std::string& who) {
  const std::string why = regular_or_absent(path);
  if (!why.empty()) throw InputError(who + why);
}

namespace detail {

// fopen(path, "rb") for a regular file only, never blocking: the descriptor is opened O_NONBLOCK (a FIFO's
// open returns at once), checked with fstat, and switched back to blocking reads. Null with errno set when
// the open fails; throws InputError("<who>: '<path>' is ...") when the path is not a regular file.
inline std::FILE* open_regular_for_reading(const std::string& path, const std::string& who) {
  require_regular_or_absent(path, who);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int code = errno;
    ::close(fd);
    errno = code;
    return nullptr;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(who + "'" + path + "' is " + file_kind(st.st_mode) + ", not a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int code = errno;
    ::close(fd);
    errno = code;
    return nullptr;
  }
  std::FILE* f = ::fdopen(fd, "rb");
  if (!f) {
    const int code = errno;
    ::close(fd);
    errno = code;
  }
  return f;
}

}  // namespace detail
}  // namespace dpmlp
