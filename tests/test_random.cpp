// SPDX-License-Identifier: BSD-3-Clause
// Tests for dpmlp/random.hpp against JAX 0.11 (threefry2x32, jax_threefry_partitionable=True).
// Reference data: DPMLP_REFERENCE_DIR (jax_prng_vectors.json, seed_raw.f32, seed_y.f32, seed_reference.json).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "dpmlp/random.hpp"
#include "json_lite.hpp"
#include "check_util.hpp"

#ifndef DPMLP_REFERENCE_DIR
#error "DPMLP_REFERENCE_DIR must name the reference data folder (a string literal)"
#endif

namespace {

namespace rnd = dpmlp::random;
using rnd::Key;

std::string reference_path(const std::string& name) { return std::string(DPMLP_REFERENCE_DIR) + "/" + name; }

const json_lite::Value& prng_vectors() {
  static const json_lite::Value v = json_lite::parse_file(reference_path("jax_prng_vectors.json"));
  return v;
}

Key key_from_json(const json_lite::Value& v) {
  REQUIRE(v.size() == 2);
  return Key{v[0].as_u32(), v[1].as_u32()};
}

// Little-endian float32 file, as numpy's tofile writes on x86 and aarch64.
std::vector<float> read_f32(const std::string& name) {
  std::ifstream in(reference_path(name), std::ios::binary | std::ios::ate);
  REQUIRE(in.good());
  const std::streamsize bytes = in.tellg();
  REQUIRE(bytes % 4 == 0);
  std::vector<unsigned char> buf(static_cast<std::size_t>(bytes));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(buf.data()), bytes);
  REQUIRE(in.good());
  std::vector<float> out(buf.size() / 4);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::uint32_t u = std::uint32_t(buf[4 * i]) | std::uint32_t(buf[4 * i + 1]) << 8 |
                            std::uint32_t(buf[4 * i + 2]) << 16 | std::uint32_t(buf[4 * i + 3]) << 24;
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

// Distance in units in the last place: the number of float32 values between a and b, counting across zero
// (+0 and -0 are the same point).
std::int64_t ulp_distance(float a, float b) {
  auto ordered = [](float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? -static_cast<std::int64_t>(u & 0x7FFFFFFFu) : static_cast<std::int64_t>(u);
  };
  const std::int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

struct Deviation {
  double max_abs = 0.0;
  std::int64_t max_ulp = 0;
  std::size_t differing = 0;  // elements that are not bit-identical
  std::size_t count = 0;
  void add(float got, float want) {
    max_abs = dpmlp_test::nan_max(max_abs, std::fabs(static_cast<double>(got) - static_cast<double>(want)));
    const std::int64_t u = ulp_distance(got, want);
    max_ulp = std::max(max_ulp, u);
    differing += (u != 0);
    ++count;
  }
  std::string str() const {
    std::ostringstream os;
    os << "max |diff| " << std::setprecision(3) << max_abs << ", max ulp " << max_ulp << ", " << differing
       << " of " << count << " not bit-identical";
    return os.str();
  }
};

const char* const kSeeds[] = {"seed0", "seed1", "seed42"};
const std::uint64_t kSeedValues[] = {0, 1, 42};

}  // namespace

TEST_CASE("json_lite reads every JSON construct", "[json_lite]") {
  const auto v = json_lite::parse(R"( {"a": [1, -2.5e3, 0, 4294967295, 18446744073709551615],
      "s": "q\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "t": true, "f": false, "n": null, "o": {"x": {}, "y": []},
      "nan": NaN, "inf": -Infinity, "dup": 1, "dup": 2} )");
  REQUIRE(v.is_object());
  CHECK(v.keys() == std::vector<std::string>{"a", "s", "t", "f", "n", "o", "nan", "inf", "dup"});
  const auto& a = v["a"];
  REQUIRE(a.size() == 5);
  CHECK(a[0].as_int() == 1);
  CHECK(a[1].as_double() == -2500.0);
  CHECK(a[1].raw() == "-2.5e3");
  CHECK(a[2].as_u32() == 0u);
  CHECK(a[3].as_u32() == 4294967295u);
  CHECK(a[4].as_u64() == 18446744073709551615ull);
  CHECK_THROWS_AS(a[4].as_u32(), json_lite::Error);
  CHECK_THROWS_AS(a[1].as_i64(), json_lite::Error);
  CHECK_THROWS_AS(a[1].as_u64(), json_lite::Error);
  CHECK(v["s"].as_string() == "q\"\\/\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80");
  CHECK(v["t"].as_bool());
  CHECK_FALSE(v["f"].as_bool());
  CHECK(v["n"].is_null());
  CHECK(v["o"]["x"].is_object());
  CHECK(v["o"]["y"].size() == 0);
  CHECK(std::isnan(v["nan"].as_double()));
  CHECK(v["inf"].as_double() == -std::numeric_limits<double>::infinity());
  CHECK(v["dup"].as_int() == 2);
  CHECK_FALSE(v.contains("missing"));
  CHECK_THROWS_AS(v["missing"], json_lite::Error);
  CHECK(json_lite::parse("[[1, 2], [3]]").flat_u32() == std::vector<std::uint32_t>{1, 2, 3});
  CHECK(json_lite::parse("-9223372036854775808").as_i64() == std::numeric_limits<std::int64_t>::min());
  for (const char* bad :
       {"", "[1,]", "{\"a\" 1}", "01", "1.", "-", "\"\\x\"", "[1] 2", "tru", "\"\\ud800\""}) {
    INFO(bad);
    CHECK_THROWS_AS(json_lite::parse(bad), json_lite::Error);
  }
}

TEST_CASE("threefry2x32 matches the Random123 known-answer vectors", "[random]") {
  // Random123's kat_vectors for threefry2x32_20, which jax's random_test.py also checks.
  struct Kat {
    Key key;
    std::uint32_t x0, x1, y0, y1;
  };
  const Kat kats[] = {
      {{0x00000000u, 0x00000000u}, 0x00000000u, 0x00000000u, 0x6b200159u, 0x99ba4efeu},
      {{0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu, 0x1cb996fcu, 0xbb002be7u},
      {{0x13198a2eu, 0x03707344u}, 0x243f6a88u, 0x85a308d3u, 0xc4923a9cu, 0x483df7a0u},
  };
  for (const auto& k : kats) {
    std::uint32_t y0 = 0, y1 = 0;
    rnd::threefry2x32(k.key, k.x0, k.x1, y0, y1);
    CHECK(y0 == k.y0);
    CHECK(y1 == k.y1);
  }
}

TEST_CASE("PRNGKey packs the seed like jax.random.PRNGKey", "[random]") {
  for (int s = 0; s < 3; ++s) {
    INFO(kSeeds[s]);
    CHECK(rnd::PRNGKey(kSeedValues[s]) == key_from_json(prng_vectors()[kSeeds[s]]["key"]));
  }
  CHECK(rnd::PRNGKey(0x0000000100000002ull) == Key{1u, 2u});
  CHECK(rnd::PRNGKey(0xFFFFFFFFull) == Key{0u, 0xFFFFFFFFu});
}

TEST_CASE("split, fold_in and bits match JAX exactly", "[random]") {
  const auto& ref = prng_vectors();
  REQUIRE(ref["threefry_partitionable"].as_bool());
  for (int s = 0; s < 3; ++s) {
    INFO(kSeeds[s]);
    const auto& r = ref[kSeeds[s]];
    const Key key = rnd::PRNGKey(kSeedValues[s]);

    for (const char* name : {"split", "split3"}) {
      INFO(name);
      const auto& want = r[name];
      const std::vector<Key> got = rnd::split(key, static_cast<int>(want.size()));
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i] == key_from_json(want[i]));
      }
    }

    CHECK(rnd::fold_in(key, 7u) == key_from_json(r["fold_in_7"]));

    for (const char* name : {"bits_u32_10", "bits_u32_2x3"}) {
      INFO(name);
      const std::vector<std::uint32_t> want = r[name].flat_u32();
      for (std::size_t i = 0; i < want.size(); ++i) CHECK(rnd::bits(key, i) == want[i]);
    }
  }
}

TEST_CASE("uniform and normal match JAX within 2 ulp", "[random]") {
  const auto& ref = prng_vectors();
  Deviation uni, nor;
  for (int s = 0; s < 3; ++s) {
    INFO(kSeeds[s]);
    const auto& r = ref[kSeeds[s]];
    const Key key = rnd::PRNGKey(kSeedValues[s]);

    const std::vector<float> u = r["uniform_10"].flat_floats();
    for (std::size_t i = 0; i < u.size(); ++i) {
      const float got = rnd::uniform(key, i);
      INFO("uniform " << i << ": " << got << " vs " << u[i]);
      CHECK(ulp_distance(got, u[i]) <= 2);
      CHECK(got >= 0.0f);
      CHECK(got < 1.0f);
      uni.add(got, u[i]);
    }
    for (const char* name : {"normal_10", "normal_4x3"}) {
      const std::vector<float> n = r[name].flat_floats();
      for (std::size_t i = 0; i < n.size(); ++i) {
        const float got = rnd::normal(key, i);
        INFO(name << " " << i << ": " << got << " vs " << n[i]);
        CHECK(ulp_distance(got, n[i]) <= 2);
        nor.add(got, n[i]);
      }
    }
  }
  WARN("uniform vs jax_prng_vectors.json: " << uni.str());
  WARN("normal vs jax_prng_vectors.json: " << nor.str());
}

TEST_CASE("uniform with bounds follows lax.max(minval, floats * (maxval - minval) + minval)", "[random]") {
  const Key key = rnd::PRNGKey(42);
  for (std::uint64_t i = 0; i < 1000; ++i) {
    const float u = rnd::uniform(key, i, -3.0f, 5.0f);
    // From the raw bits, independently of uniform()'s float steps: floats = top 23 bits / 2^23 (exact), and
    // -3 + 8 floats is exact in float32 too (a multiple of 2^-20 of magnitude below 5: 23 significant bits).
    const double floats = double(rnd::bits(key, i) >> 9) / 8388608.0;
    CHECK(u == float(-3.0 + 8.0 * floats));
    CHECK(u >= -3.0f);
    CHECK(u < 5.0f);
  }
}

TEST_CASE("erfinv handles the edges like XLA", "[random]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(rnd::erfinv(1.0f) == inf);
  CHECK(rnd::erfinv(-1.0f) == -inf);
  CHECK(rnd::erfinv(0.0f) == 0.0f);
  CHECK(std::isnan(rnd::erfinv(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(rnd::erfinv(1.5f)));
  for (float x : {1e-6f, 0.1f, 0.5f, 0.9f, 0.999f, 0.9999999f}) {
    INFO(x);
    CHECK(rnd::erfinv(-x) == -rnd::erfinv(x));
    // Close to the true inverse: erf(erfinv(x)) == x to float32 accuracy away from |x| -> 1.
    CHECK(std::erf(static_cast<double>(rnd::erfinv(x))) == Approx(x).epsilon(1e-5));
  }
  // The extreme draws of normal(): u = nextafter(-1, 0) and u = 1 - 3 * 2^-24 stay finite.
  CHECK(std::isfinite(rnd::erfinv(-0x1.fffffep-1f)));
  CHECK(std::isfinite(rnd::erfinv(1.0f - 3 * 0x1p-24f)));
}

TEST_CASE("seed draw: normal(split(PRNGKey(0))) matches seed_raw.f32 and seed_y.f32", "[random][seed]") {
  const std::vector<Key> keys = rnd::split(rnd::PRNGKey(0), 2);
  const std::vector<float> raw = read_f32("seed_raw.f32");
  const std::vector<float> y = read_f32("seed_y.f32");
  REQUIRE(raw.size() == 320000);
  REQUIRE(y.size() == 20000);

  struct Case {
    const char* name;
    Key key;
    const std::vector<float>* want;
  };
  for (const Case& c : {Case{"seed_raw.f32", keys[0], &raw}, Case{"seed_y.f32", keys[1], &y}}) {
    Kokkos::View<float*, Kokkos::HostSpace> out("seed draw", c.want->size());
    const Kokkos::DefaultHostExecutionSpace space;
    rnd::normal(space, c.key, out, 0);
    space.fence();
    Deviation dev;
    for (std::size_t i = 0; i < c.want->size(); ++i) dev.add(out(i), (*c.want)[i]);
    WARN(c.name << " (GPU-generated by jax) vs normal(): " << dev.str());
    CHECK(dev.max_abs <= 1e-6);
  }
}

TEST_CASE("seed draw on the default execution space matches seed_raw.f32", "[random][seed]") {
  // In a CUDA build this runs the device code path (sqrt.approx.f32, __fmul_rn/__fadd_rn, CUDA's log1pf),
  // which must reproduce the H200-generated reference bit for bit (checked below).
  const Key k1 = rnd::split(rnd::PRNGKey(0), std::uint64_t(0));
  const std::vector<float> raw = read_f32("seed_raw.f32");
  Kokkos::View<float*> out("seed draw (default space)", raw.size());
  const Kokkos::DefaultExecutionSpace space;
  rnd::normal(space, k1, out, 0);
  space.fence();
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  Deviation dev;
  for (std::size_t i = 0; i < raw.size(); ++i) dev.add(host(i), raw[i]);
  WARN("seed_raw.f32 vs normal() on " << Kokkos::DefaultExecutionSpace::name() << ": " << dev.str());
  CHECK(dev.max_abs <= 1e-6);
#if defined(KOKKOS_ENABLE_CUDA)
  // The reference was drawn by JAX on an H200: CUDA's path gives its bits exactly. Host code need not (JAX's
  // own CPU draws differ from its GPU's by up to 7.2e-7), hence only the tolerance above there.
  if (std::is_same<Kokkos::DefaultExecutionSpace, Kokkos::Cuda>::value) CHECK(dev.differing == 0);
#endif
}

TEST_CASE("init_params: w1, w2 match seed_reference.json", "[random][seed]") {
  const auto ref = json_lite::parse_file(reference_path("seed_reference.json"));
  const auto& init = ref["init_params"];
  const std::vector<float> w1 = init["w1"].flat_floats();
  const std::vector<float> w2 = init["w2"].flat_floats();
  REQUIRE(w1.size() == 32 * 32);
  REQUIRE(w2.size() == 32);
  for (float b : init["b1"].flat_floats()) CHECK(b == 0.0f);
  for (float b : init["b2"].flat_floats()) CHECK(b == 0.0f);

  const std::vector<Key> keys = rnd::split(rnd::PRNGKey(1), 2);
  Deviation dev;
  for (std::size_t i = 0; i < w1.size(); ++i) {
    const float got =
        rnd::normal(keys[0], i) * 0.1f;  // jax: normal(k1, (32, 32)) * 0.1, weak-typed -> float32
    INFO("w1[" << i << "]: " << got << " vs " << w1[i]);
    CHECK((ulp_distance(got, w1[i]) <= 2 || std::fabs(got - w1[i]) <= 1e-7f));
    dev.add(got, w1[i]);
  }
  for (std::size_t i = 0; i < w2.size(); ++i) {
    const float got = rnd::normal(keys[1], i) * 0.1f;
    INFO("w2[" << i << "]: " << got << " vs " << w2[i]);
    CHECK((ulp_distance(got, w2[i]) <= 2 || std::fabs(got - w2[i]) <= 1e-7f));
    dev.add(got, w2[i]);
  }
  WARN("init_params w1, w2 vs normal() * 0.1f: " << dev.str());
}

TEST_CASE("range draws are partitionable: a range equals the same slice of the full draw", "[random]") {
  const Key key = rnd::split(rnd::PRNGKey(42), std::uint64_t(1));
  const std::size_t n = 4099;
  const Kokkos::DefaultHostExecutionSpace space;

  Kokkos::View<float*, Kokkos::HostSpace> full_n("full normal", n), full_u("full uniform", n);
  Kokkos::View<std::uint32_t*, Kokkos::HostSpace> full_b("full bits", n);
  rnd::normal(space, key, full_n, 0);
  rnd::uniform(space, key, full_u, 0);
  rnd::bits(space, key, full_b, 0);
  space.fence();
  for (std::size_t i = 0; i < n; i += 97) {
    CHECK(full_n(i) == rnd::normal(key, i));
    CHECK(full_u(i) == rnd::uniform(key, i));
    CHECK(full_b(i) == rnd::bits(key, i));
  }

  // Uneven shards, as ranks with different row counts would cut them, plus an empty one.
  const std::size_t cuts[] = {0, 1, 1, 1000, 2047, 4098, n};
  for (std::size_t c = 0; c + 1 < sizeof(cuts) / sizeof(cuts[0]); ++c) {
    const std::size_t a = cuts[c], b = cuts[c + 1];
    INFO("range [" << a << ", " << b << ")");
    Kokkos::View<float*, Kokkos::HostSpace> part_n("part normal", b - a), part_u("part uniform", b - a);
    Kokkos::View<std::uint32_t*, Kokkos::HostSpace> part_b("part bits", b - a);
    rnd::normal(space, key, part_n, a);
    rnd::uniform(space, key, part_u, a);
    rnd::bits(space, key, part_b, a);
    space.fence();
    bool same = true;
    for (std::size_t j = 0; j < b - a; ++j) {
      same = same && part_n(j) == full_n(a + j) && part_u(j) == full_u(a + j) && part_b(j) == full_b(a + j);
    }
    CHECK(same);
  }

  // Indices past 2^32 use the high counter word.
  const std::uint64_t big = (std::uint64_t(1) << 32) + 5;
  Kokkos::View<float*, Kokkos::HostSpace> high("high", 3);
  rnd::normal(space, key, high, big);
  space.fence();
  for (std::uint64_t j = 0; j < 3; ++j) CHECK(high(j) == rnd::normal(key, big + j));
  CHECK(rnd::bits(key, big) != rnd::bits(key, 5));
}

TEST_CASE("range draw into a double view equals the float values widened", "[random]") {
  const Key key = rnd::PRNGKey(7);
  const std::size_t n = 777;
  const std::uint64_t first = 12345;
  const Kokkos::DefaultHostExecutionSpace space;
  Kokkos::View<double*, Kokkos::HostSpace> dn("double normal", n), du("double uniform", n);
  Kokkos::View<float*, Kokkos::HostSpace> fn("float normal", n);
  rnd::normal(space, key, dn, first);
  rnd::normal(space, key, fn, first);
  rnd::uniform(space, key, du, first, -2.0f, 2.0f);
  space.fence();
  for (std::size_t j = 0; j < n; ++j) {
    CHECK(dn(j) == static_cast<double>(fn(j)));
    CHECK(dn(j) == static_cast<double>(rnd::normal(key, first + j)));
    CHECK(du(j) == static_cast<double>(rnd::uniform(key, first + j, -2.0f, 2.0f)));
  }
}
