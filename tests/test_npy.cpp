// SPDX-License-Identifier: BSD-3-Clause
// NumPy .npy files (npy.hpp): models and arrays round trip bit for bit; every malformed file is refused with
// an InputError that names the file and what is wrong, and a refused import leaves the model unchanged.
//
// Two hidden cases talk to numpy through tests/check_npy_numpy.cmake (ctest npy_numpy_interop):
// [numpy-write] writes models, arrays and a manifest of their exact values into $DPMLP_NPY_DIR/from_cpp for
// tests/check_npy_numpy.py to numpy.load(); [numpy-read] reads back what that script wrote with numpy into
// $DPMLP_NPY_DIR/from_numpy, and checks its values (and its refusals) against the script's manifest.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <dpmlp/dpmlp.hpp>
#include <dpmlp/npy.hpp>

#include "check_util.hpp"

namespace npy_test {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at the end of the scope.
struct TempDir {
  std::string path;
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && base[0] ? base : "/tmp") + "/dpmlp_npy_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    REQUIRE(::mkdtemp(buf.data()) != nullptr);
    path = buf.data();
  }
  ~TempDir() { remove_tree(path); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
  static void remove_tree(const std::string& p) {
    if (DIR* d = ::opendir(p.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name == "." || name == "..") continue;
        const std::string child = p + "/" + name;
        struct stat st;
        if (::lstat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
          remove_tree(child);
        } else {
          std::remove(child.c_str());
        }
      }
      ::closedir(d);
    }
    ::rmdir(p.c_str());
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A hand-made npy file: version 1.0 preamble, the given header dictionary (padded to 64), then `data`.
std::string make_npy(const std::string& dict, const std::string& data, unsigned char major = 1) {
  std::string header = dict;
  const std::size_t pre = major == 1 ? 10 : 12;
  while ((pre + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  if (major != 1) out += std::string(2, '\0');
  return out + header + data;
}

template <class Scalar>
std::vector<Scalar> host_params(const dpmlp::Mlp<Scalar, Memory>& m) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.params());
  return std::vector<Scalar>(h.data(), h.data() + h.extent(0));
}

template <class Scalar>
bool same_bits(const std::vector<Scalar>& a, const std::vector<Scalar>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(Scalar)) == 0);
}

using dpmlp_test::refusal;

template <class Scalar>
dpmlp::Mlp<Scalar, Memory> random_model(std::vector<int> widths, dpmlp::Activation act, std::uint64_t seed) {
  dpmlp::Mlp<Scalar, Memory> m(std::move(widths), act);
  m.init_jax(dpmlp::random::PRNGKey(seed), Scalar(0.5));
  // Non-zero biases too, so a bias that lands in the wrong place shows.
  for (int l = 0; l < m.layers(); ++l) {
    auto b = m.bias(l);
    const Scalar step = Scalar(0.125) * Scalar(l + 1);
    Kokkos::parallel_for(
        "test_npy::bias", Kokkos::RangePolicy<Space>(0, static_cast<int>(b.extent(0))),
        KOKKOS_LAMBDA(const int j) { b(j) = step * Scalar(j + 1) - Scalar(0.3); });
  }
  Space().fence();
  return m;
}

}  // namespace npy_test

using namespace npy_test;

TEST_CASE("npy: a model round trips bit for bit, float and double, any depth", "[npy]") {
  TempDir dir;
  const std::vector<std::vector<int>> shapes = {{8, 16, 1}, {5, 12, 9, 2}, {3, 1}, {32, 32, 1}};
  for (const auto& widths : shapes) {
    INFO("widths of size " << widths.size());
    {
      auto m = random_model<float>(widths, dpmlp::Activation::relu, 3);
      const std::string d = dir / ("f32_" + std::to_string(widths.size()));
      dpmlp::save_npy_model(m, d);
      dpmlp::Mlp<float, Memory> back(widths);
      dpmlp::load_npy_model(back, d);
      CHECK(same_bits(host_params(m), host_params(back)));
      // One file per tensor, shaped (in, out) and (out,), '<f4', C order.
      for (int l = 0; l + 1 < static_cast<int>(widths.size()); ++l) {
        const auto hw = dpmlp::read_npy_header(d + "/w" + std::to_string(l) + ".npy");
        CHECK(hw.dtype == "<f4");
        CHECK_FALSE(hw.fortran_order);
        CHECK(hw.shape == std::vector<std::size_t>{std::size_t(widths[l]), std::size_t(widths[l + 1])});
        CHECK(hw.major == 1);
        CHECK(hw.minor == 0);
        CHECK(hw.data_offset % 64 == 0);
        const auto hb = dpmlp::read_npy_header(d + "/b" + std::to_string(l) + ".npy");
        CHECK(hb.shape == std::vector<std::size_t>{std::size_t(widths[l + 1])});
        // The weight file holds W_l exactly as the Mlp lays it out: (in, out) row-major.
        const auto w = dpmlp::load_npy<float>(d + "/w" + std::to_string(l) + ".npy");
        auto hw_model = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.weight(l));
        bool same = true;
        for (int i = 0; i < widths[l]; ++i)
          for (int j = 0; j < widths[l + 1]; ++j) same = same && w.data[i * widths[l + 1] + j] == hw_model(i, j);
        CHECK(same);
      }
    }
    {
      auto m = random_model<double>(widths, dpmlp::Activation::tanh, 4);
      const std::string d = dir / ("f64_" + std::to_string(widths.size()));
      dpmlp::save_npy_model(m, d);
      CHECK(dpmlp::read_npy_header(d + "/w0.npy").dtype == "<f8");
      dpmlp::Mlp<double, Memory> back(widths, dpmlp::Activation::tanh);
      dpmlp::load_npy_model(back, d);
      CHECK(same_bits(host_params(m), host_params(back)));
    }
  }
}

TEST_CASE("npy: general arrays round trip, any dtype and rank", "[npy]") {
  TempDir dir;
  {
    const std::vector<double> v = {1.5, -2.25, 1e-300, 3e300, -0.0, 0.1};
    dpmlp::save_npy(dir / "a.npy", v.data(), {2, 3});
    const auto a = dpmlp::load_npy<double>(dir / "a.npy");
    CHECK(a.shape == std::vector<std::size_t>{2, 3});
    CHECK(same_bits(a.data, v));
  }
  {
    std::vector<float> v(24);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * float(i) - 1.0f;
    dpmlp::save_npy(dir / "cube.npy", v, {2, 3, 4});
    std::vector<float> out(24);
    dpmlp::load_npy(dir / "cube.npy", out.data(), {2, 3, 4});
    CHECK(same_bits(out, v));
  }
  {
    const std::vector<std::int32_t> v = {-7, 0, 2147483647, -2147483647 - 1, 42};
    dpmlp::save_npy(dir / "i32.npy", v, {5});
    CHECK(dpmlp::read_npy_header(dir / "i32.npy").dtype == "<i4");
    CHECK(dpmlp::load_npy<std::int32_t>(dir / "i32.npy").data == v);
    const std::vector<std::int64_t> w = {std::int64_t(1) << 40, -3};
    dpmlp::save_npy(dir / "i64.npy", w, {2, 1});
    CHECK(dpmlp::load_npy<std::int64_t>(dir / "i64.npy").data == w);
    const std::vector<std::uint8_t> u = {0, 1, 255};
    dpmlp::save_npy(dir / "u8.npy", u, {3});
    CHECK(dpmlp::read_npy_header(dir / "u8.npy").dtype == "|u1");
    CHECK(dpmlp::load_npy<std::uint8_t>(dir / "u8.npy").data == u);
  }
  {  // a scalar (shape ()) and an empty array (shape (0, 3))
    const double x = 2.5;
    dpmlp::save_npy(dir / "scalar.npy", &x, {});
    const auto s = dpmlp::load_npy<double>(dir / "scalar.npy");
    CHECK(s.shape.empty());
    REQUIRE(s.data.size() == 1);
    CHECK(s.data[0] == 2.5);
    dpmlp::save_npy<float>(dir / "empty.npy", nullptr, {0, 3});
    const auto e = dpmlp::load_npy<float>(dir / "empty.npy");
    CHECK(e.shape == std::vector<std::size_t>{0, 3});
    CHECK(e.data.empty());
  }
  {  // the header, byte for byte, as numpy writes it
    const std::vector<float> v(12, 1.0f);
    dpmlp::save_npy(dir / "h.npy", v, {3, 4});
    const std::string bytes = read_bytes(dir / "h.npy");
    REQUIRE(bytes.size() == 128 + 48);
    CHECK(bytes.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
    CHECK(static_cast<unsigned char>(bytes[8]) + 256 * static_cast<unsigned char>(bytes[9]) == 118);
    CHECK(bytes.substr(10, 59) == "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }");
    CHECK(bytes[127] == '\n');
    CHECK(bytes.substr(69, 58) == std::string(58, ' '));
  }
  {  // the vector overload checks the count against the shape
    const std::vector<float> v(5);
    CHECK_THROWS_AS(dpmlp::save_npy(dir / "bad.npy", v, {2, 3}), dpmlp::InputError);
  }
}

TEST_CASE("npy: headers numpy may write are read: versions 2.0 and 3.0, other key order, no trailing comma",
          "[npy]") {
  TempDir dir;
  const float data[2] = {1.0f, -3.0f};
  const std::string raw(reinterpret_cast<const char*>(data), sizeof(data));
  write_bytes(dir / "v2.npy", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", raw, 2));
  write_bytes(dir / "v3.npy", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }", raw, 3));
  write_bytes(dir / "order.npy", make_npy("{\"shape\": (2, ), \"fortran_order\": False, \"descr\": \"<f4\"}", raw));
  for (const char* name : {"v2.npy", "v3.npy", "order.npy"}) {
    INFO(name);
    const auto a = dpmlp::load_npy<float>(dir / name);
    REQUIRE(a.data.size() == 2);
    CHECK(a.data[0] == 1.0f);
    CHECK(a.data[1] == -3.0f);
  }
  // (A Fortran-ordered 1-D array is also C-ordered, but numpy writes fortran_order False for it anyway; a
  // header saying True is refused whatever the rank: the malformed files' case below.)
}

TEST_CASE("npy: malformed files are refused with the file name and what is wrong", "[npy]") {
  TempDir dir;
  const float data[6] = {1, 2, 3, 4, 5, 6};
  const std::string raw(reinterpret_cast<const char*>(data), sizeof(data));
  const std::string good_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  struct Case {
    const char* name;
    std::string bytes;
    const char* phrase;
  };
  const std::vector<Case> cases = {
      {"fortran.npy", make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", raw), "Fortran order"},
      // 1-D: the same bytes either way, but a header saying Fortran order is refused whatever the rank.
      {"fortran1d.npy", make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (6,), }", raw), "Fortran order"},
      {"f8.npy", make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", raw), "dtype '<f8', expected '<f4'"},
      {"big.npy", make_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", raw), "dtype '>f4'"},
      {"magic.npy", "\x93NUMPX" + make_npy(good_dict, raw).substr(6), "bad magic"},
      {"text.npy", "hello, this is not an npy file at all", "bad magic"},
      {"empty_file.npy", "", "bad magic"},
      {"version.npy", std::string("\x93NUMPY\x04\x00", 8) + make_npy(good_dict, raw).substr(8),
       "unsupported npy format version 4.0"},
      {"short_header.npy", make_npy(good_dict, raw).substr(0, 40), "truncated"},
      {"short_data.npy", make_npy(good_dict, raw.substr(0, 20)), "truncated: shape (2, 3) of '<f4' needs 24 data bytes, the file has 20"},
      {"long_data.npy", make_npy(good_dict, raw + "xxxx"), "4 bytes after the data"},
      {"no_shape.npy", make_npy("{'descr': '<f4', 'fortran_order': False, }", raw), "no 'shape'"},
      {"bad_shape.npy", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", raw),
       "not a tuple of non-negative integers"},
      {"huge_shape.npy",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", raw), "overflows"},
      {"extra_key.npy", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", raw),
       "unexpected key 'x'"},
      {"not_dict.npy", make_npy("['descr', '<f4']", raw), "bad npy header"},
      {"structured.npy", make_npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", raw),
       "structured dtypes"},
      {"order_word.npy", make_npy("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", raw),
       "not True or False"},
  };
  for (const auto& c : cases) {
    const std::string path = dir / c.name;
    write_bytes(path, c.bytes);
    const std::string message = refusal([&] { dpmlp::load_npy<float>(path); });
    INFO(c.name << ": " << message);
    CHECK(message.find(path) != std::string::npos);
    CHECK(message.find(c.phrase) != std::string::npos);
  }
  // A missing file, and a shape other than the one asked for.
  const std::string missing = refusal([&] { dpmlp::load_npy<float>(dir / "nope.npy"); });
  CHECK(missing.find(dir / "nope.npy") != std::string::npos);
  CHECK(missing.find("No such file") != std::string::npos);
  write_bytes(dir / "good.npy", make_npy(good_dict, raw));
  float out[6];
  const std::string shape = refusal([&] { dpmlp::load_npy(dir / "good.npy", out, {3, 2}); });
  CHECK(shape.find("good.npy: shape (2, 3), expected (3, 2)") != std::string::npos);
  CHECK_NOTHROW(dpmlp::load_npy(dir / "good.npy", out, {2, 3}));
  CHECK(out[5] == 6.0f);
  const std::string type = refusal([&] { dpmlp::load_npy<std::int32_t>(dir / "good.npy"); });
  CHECK(type.find("dtype '<f4', expected '<i4'") != std::string::npos);
}

TEST_CASE("npy: a model import refuses files that do not fit, and leaves the model unchanged", "[npy]") {
  TempDir dir;
  auto saved = random_model<float>({6, 10, 2}, dpmlp::Activation::relu, 7);
  dpmlp::save_npy_model(saved, dir / "m");
  auto target = random_model<float>({6, 10, 2}, dpmlp::Activation::relu, 8);
  const auto before = host_params(target);

  SECTION("other widths: the wrong shape, named with the layer and the model's widths") {
    dpmlp::Mlp<float, Memory> other({6, 11, 2});
    const std::string m = refusal([&] { dpmlp::load_npy_model(other, dir / "m"); });
    INFO(m);
    CHECK(m.find("w0.npy: shape (6, 10), expected (6, 11)") != std::string::npos);
    CHECK(m.find("layer 0 of a model with widths {6, 11, 2}") != std::string::npos);
  }
  SECTION("a shallower model than the files: refused") {
    auto deep = random_model<float>({6, 10, 10, 2}, dpmlp::Activation::relu, 9);
    dpmlp::save_npy_model(deep, dir / "deep");
    dpmlp::Mlp<float, Memory> shallow({6, 10, 10});
    const std::string m = refusal([&] { dpmlp::load_npy_model(shallow, dir / "deep"); });
    INFO(m);
    CHECK(m.find("w2.npy exists, but the model has only 2 layers") != std::string::npos);
  }
  SECTION("double files into a float model: the wrong dtype") {
    auto d = random_model<double>({6, 10, 2}, dpmlp::Activation::relu, 7);
    dpmlp::save_npy_model(d, dir / "d");
    const std::string m = refusal([&] { dpmlp::load_npy_model(target, dir / "d"); });
    INFO(m);
    CHECK(m.find("w0.npy: dtype '<f8', expected '<f4'") != std::string::npos);
    CHECK(same_bits(host_params(target), before));
  }
  SECTION("a missing last file: refused, and the model keeps its parameters") {
    REQUIRE(std::remove((dir / "m/b1.npy").c_str()) == 0);
    const std::string m = refusal([&] { dpmlp::load_npy_model(target, dir / "m"); });
    INFO(m);
    CHECK(m.find("b1.npy: cannot open") != std::string::npos);
    CHECK(same_bits(host_params(target), before));
  }
  SECTION("a truncated file: refused, and the model keeps its parameters") {
    const std::string w1 = read_bytes(dir / "m/w1.npy");
    write_bytes(dir / "m/w1.npy", w1.substr(0, w1.size() - 3));
    const std::string m = refusal([&] { dpmlp::load_npy_model(target, dir / "m"); });
    INFO(m);
    CHECK(m.find("w1.npy: truncated") != std::string::npos);
    CHECK(same_bits(host_params(target), before));
  }
  SECTION("a corrupted magic string") {
    std::string w0 = read_bytes(dir / "m/w0.npy");
    w0[1] = 'X';
    write_bytes(dir / "m/w0.npy", w0);
    const std::string m = refusal([&] { dpmlp::load_npy_model(target, dir / "m"); });
    INFO(m);
    CHECK(m.find("w0.npy: not an npy file (bad magic") != std::string::npos);
    CHECK(same_bits(host_params(target), before));
  }
  SECTION("a directory that cannot be created") {
    write_bytes(dir / "plain_file", "x");
    const std::string m = refusal([&] { dpmlp::save_npy_model(saved, dir / "plain_file/sub"); });
    INFO(m);
    CHECK(m.find("plain_file") != std::string::npos);
  }
}

// load_npy(path, out, shape) reads the header and the data from one open of the file, and writes at most
// (product of shape) values into `out`. The buffers here are heap vectors of exactly that size, so the
// AddressSanitizer build (scripts/test.sh) stops on any write past them.
TEST_CASE("npy: a file longer than its shape, or replaced while it is read, never overruns the buffer", "[npy]") {
  TempDir dir;
  const std::string path = dir / "a.npy";
  const std::vector<float> small = {1, 2, 3, 4, 5, 6};
  std::vector<float> big(200 * 200);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) + 0.5f;

  SECTION("data longer than the header's shape: refused, the buffer unchanged") {
    const std::string raw(reinterpret_cast<const char*>(big.data()), big.size() * sizeof(float));
    write_bytes(path, make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", raw));
    std::vector<float> out(6, -1.0f);
    const std::string m = refusal([&] { dpmlp::load_npy(path, out.data(), {2, 3}); });
    INFO(m);
    CHECK(m.find(path + ": 159976 bytes after the data of shape (2, 3)") != std::string::npos);
    CHECK(out == std::vector<float>(6, -1.0f));
  }
  SECTION("a file of another shape: refused, the buffer unchanged") {
    dpmlp::save_npy(path, big, {200, 200});
    std::vector<float> out(6, -1.0f);
    const std::string m = refusal([&] { dpmlp::load_npy(path, out.data(), {2, 3}); });
    CHECK(m.find(path + ": shape (200, 200), expected (2, 3)") != std::string::npos);
    CHECK(out == std::vector<float>(6, -1.0f));
  }
  SECTION("save_npy replaces the file with one of another shape over and over while it is loaded") {
    // The reproducer: a (2, 3) file and a (200, 200) one renamed over the same path by save_npy, as fast
    // as it goes, while this thread loads the path into a 6-value buffer. A reader that checks the shape in
    // one open and reads the data in another copies the big file's 160,000 bytes into the 24-byte buffer.
    dpmlp::save_npy(path, small, {2, 3});
    std::atomic<bool> stop{false};
    std::atomic<long> replaced{0};
    std::thread writer([&] {
      while (!stop.load()) {
        dpmlp::save_npy(path, big, {200, 200});
        dpmlp::save_npy(path, small, {2, 3});
        replaced.fetch_add(2);
      }
    });
    int loaded = 0, refused_shape = 0, other = 0;
    std::string unexpected;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < until || loaded == 0 || refused_shape == 0) {
      std::vector<float> out(6, -1.0f);
      try {
        dpmlp::load_npy(path, out.data(), {2, 3});
        if (out == small) {
          ++loaded;
        } else {
          ++other;
          unexpected = "loaded values that are not the (2, 3) file's";
        }
      } catch (const dpmlp::InputError& e) {
        const std::string m = e.what();
        if (m.find("shape (200, 200), expected (2, 3)") != std::string::npos) {
          ++refused_shape;
          if (out != std::vector<float>(6, -1.0f)) {
            ++other;
            unexpected = "a refused load changed the buffer";
          }
        } else {
          ++other;
          unexpected = m;
        }
      }
      if (std::chrono::steady_clock::now() > until + std::chrono::seconds(20)) break;
    }
    stop = true;
    writer.join();
    INFO("loaded " << loaded << ", refused " << refused_shape << ", replaced " << replaced.load() << "; "
                   << unexpected);
    CHECK(other == 0);
    CHECK(loaded > 0);
    CHECK(refused_shape > 0);
  }
}

// ---- the numpy interop halves (hidden; run by tests/check_npy_numpy.cmake)

namespace npy_test {

std::string npy_dir() {
  const char* d = std::getenv("DPMLP_NPY_DIR");
  return d ? d : "";
}

std::string hex(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", v);
  return buf;
}

// One manifest line: "<file> <dtype> <ndim> <dims...> = <values...>" (floats in C99 hex, exact).
template <class T>
void manifest_line(std::ofstream& out, const std::string& file, const std::vector<std::size_t>& shape,
                   const std::vector<T>& values) {
  out << file << ' ' << dpmlp::npy_dtype<T>() << ' ' << shape.size();
  for (std::size_t d : shape) out << ' ' << d;
  out << " =";
  for (const T& v : values) {
    if (std::is_floating_point<T>::value) {
      out << ' ' << hex(static_cast<double>(v));
    } else {
      out << ' ' << static_cast<long long>(v);
    }
  }
  out << '\n';
}

template <class Scalar>
void export_model(std::ofstream& manifest, const std::string& root, const std::string& name,
                  const dpmlp::Mlp<Scalar, Memory>& m, std::int64_t rows) {
  dpmlp::save_npy_model(m, root + "/" + name);
  const auto p = host_params(m);
  for (int l = 0; l < m.layers(); ++l) {
    const std::size_t in = m.widths()[l], out = m.widths()[l + 1];
    manifest_line(manifest, name + "/w" + std::to_string(l) + ".npy", {in, out},
                  std::vector<Scalar>(p.begin() + m.weight_offset(l), p.begin() + m.bias_offset(l)));
    manifest_line(manifest, name + "/b" + std::to_string(l) + ".npy", {out},
                  std::vector<Scalar>(p.begin() + m.bias_offset(l), p.begin() + m.bias_offset(l) + out));
  }
  // Inputs and the model's predictions (the device-callable evaluator), for numpy to recompute.
  Kokkos::View<Scalar**, Kokkos::LayoutRight, Memory> x("x", rows, m.inputs()), y("y", rows, m.outputs());
  Kokkos::View<Scalar*, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>> xf(x.data(), x.size());
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(77), xf, 0);
  const auto eval = m.evaluator();
  Kokkos::parallel_for(
      "test_npy::predict", Kokkos::RangePolicy<Space>(0, static_cast<int>(rows)), KOKKOS_LAMBDA(const int r) {
        eval(Kokkos::subview(x, r, Kokkos::ALL), Kokkos::subview(y, r, Kokkos::ALL));
      });
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  dpmlp::save_npy(root + "/" + name + "_x.npy", hx.data(), {std::size_t(rows), std::size_t(m.inputs())});
  dpmlp::save_npy(root + "/" + name + "_pred.npy", hy.data(), {std::size_t(rows), std::size_t(m.outputs())});
  manifest << "forward " << name << ' ' << dpmlp::activation_name(m.activation()) << ' ' << m.layers() << ' '
           << name << "_x.npy " << name << "_pred.npy\n";
}

std::vector<std::string> split(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

template <class T>
std::vector<T> parse_values(const std::vector<std::string>& words) {
  std::vector<T> v;
  for (const auto& w : words) {
    if (std::is_floating_point<T>::value) {
      v.push_back(static_cast<T>(std::strtod(w.c_str(), nullptr)));
    } else {
      v.push_back(static_cast<T>(std::strtoll(w.c_str(), nullptr, 10)));
    }
  }
  return v;
}

// Loads `path` as T, and checks shape and values (status "ok"), or checks that it is refused with the phrase.
template <class T>
void check_numpy_file(const std::string& path, const std::vector<std::size_t>& shape, const std::string& status,
                      const std::vector<std::string>& values) {
  INFO(path << " (" << status << ")");
  if (status == "ok") {
    const auto a = dpmlp::load_npy<T>(path);
    CHECK(a.shape == shape);
    CHECK(same_bits(a.data, parse_values<T>(values)));
  } else {
    const std::string message = refusal([&] { dpmlp::load_npy<T>(path); });
    INFO(message);
    const std::string phrase = status == "refuse-fortran" ? "Fortran order" : "dtype";
    CHECK(message.find(path) != std::string::npos);
    CHECK(message.find(phrase) != std::string::npos);
  }
}

}  // namespace npy_test

TEST_CASE("npy: write files for numpy", "[.][numpy-write]") {
  const std::string root = npy_dir() + "/from_cpp";
  REQUIRE(!npy_dir().empty());
  TempDir::remove_tree(root);
  REQUIRE(::mkdir(root.c_str(), 0777) == 0);
  std::ofstream manifest(root + "/manifest.txt");
  manifest << "# written by tests/test_npy.cpp [numpy-write]; read by tests/check_npy_numpy.py\n";
  export_model(manifest, root, "model_f32", random_model<float>({8, 16, 3}, dpmlp::Activation::relu, 11), 50);
  export_model(manifest, root, "model_f64", random_model<double>({4, 6, 5, 2}, dpmlp::Activation::tanh, 12), 40);
  export_model(manifest, root, "model_lin", random_model<float>({3, 1}, dpmlp::Activation::identity, 13), 10);
  const std::vector<double> cube = {0.5, -1.25, 3.0, 1e-310, -7.0, 8.5, 1e300, 0.1, 0.2, 0.3, 0.4, 0.5,
                                    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  dpmlp::save_npy(root + "/cube.npy", cube, {2, 3, 4});
  manifest_line(manifest, "cube.npy", {2, 3, 4}, cube);
  const std::vector<double> scalar = {-2.5};
  dpmlp::save_npy(root + "/scalar.npy", scalar, {});
  manifest_line(manifest, "scalar.npy", {}, scalar);
  const std::vector<float> empty;
  dpmlp::save_npy(root + "/empty.npy", empty, {0, 4});
  manifest_line(manifest, "empty.npy", {0, 4}, empty);
  const std::vector<std::int32_t> i32 = {-5, 0, 2147483647, -2147483647 - 1};
  dpmlp::save_npy(root + "/i32.npy", i32, {4});
  manifest_line(manifest, "i32.npy", {4}, i32);
  const std::vector<std::int64_t> i64 = {std::int64_t(1) << 50, -1, 3};
  dpmlp::save_npy(root + "/i64.npy", i64, {3, 1});
  manifest_line(manifest, "i64.npy", {3, 1}, i64);
  const std::vector<std::uint8_t> u8 = {0, 128, 255};
  dpmlp::save_npy(root + "/u8.npy", u8, {3});
  manifest_line(manifest, "u8.npy", {3}, u8);
  manifest.close();
  CHECK(manifest.good());
}

TEST_CASE("npy: read files numpy wrote", "[.][numpy-read]") {
  const std::string root = npy_dir() + "/from_numpy";
  REQUIRE(!npy_dir().empty());
  std::ifstream manifest(root + "/manifest.txt");
  REQUIRE(manifest.good());
  std::string line;
  int files = 0, models = 0;
  while (std::getline(manifest, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto bar = line.find(" =");
    REQUIRE(bar != std::string::npos);
    const auto head = split(line.substr(0, bar));
    const auto values = split(line.substr(bar + 2));
    REQUIRE(head.size() >= 3);
    if (head[0] == "model") {
      // "model <dir> <activation> <n widths> <widths...> = <parameters in the Mlp layout>"
      const int n = std::stoi(head[3]);
      std::vector<int> widths;
      for (int i = 0; i < n; ++i) widths.push_back(std::stoi(head[4 + i]));
      dpmlp::Mlp<float, Memory> m(widths);
      dpmlp::load_npy_model(m, root + "/" + head[1]);
      CHECK(same_bits(host_params(m), parse_values<float>(values)));
      ++models;
      continue;
    }
    // "<file> <dtype to load as> <ndim> <dims...> <status> = <values...>"
    const std::string path = root + "/" + head[0], dtype = head[1];
    const std::size_t ndim = std::stoul(head[2]);
    REQUIRE(head.size() == 4 + ndim);
    std::vector<std::size_t> shape;
    for (std::size_t i = 0; i < ndim; ++i) shape.push_back(std::stoul(head[3 + i]));
    const std::string status = head[3 + ndim];
    if (dtype == "<f4") {
      check_numpy_file<float>(path, shape, status, values);
    } else if (dtype == "<f8") {
      check_numpy_file<double>(path, shape, status, values);
    } else if (dtype == "<i4") {
      check_numpy_file<std::int32_t>(path, shape, status, values);
    } else if (dtype == "<i8") {
      check_numpy_file<std::int64_t>(path, shape, status, values);
    } else if (dtype == "|u1") {
      check_numpy_file<std::uint8_t>(path, shape, status, values);
    } else {
      FAIL("manifest: unknown dtype " << dtype);
    }
    ++files;
  }
  CHECK(files >= 8);
  CHECK(models >= 1);
}
