// SPDX-License-Identifier: BSD-3-Clause
// The inter-node transport path on one machine: 2 ranks with OpenMPI told to use TCP only
// (OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lo, set by its ctest registration),
// so every message between the ranks goes through TCP sockets over loopback, as between nodes, and none
// through shared memory. Training over that path gives bitwise the one-rank parameters.
//
// It also checks that the transport really is TCP, from outside MPI (Linux /proc): the OpenMPI components
// left loaded after selection are the ob1 PML and the tcp BTL, not vader/sm (nor the ucx or cm PMLs, which
// ignore the BTL list); no shared-memory segment (vader_segment / sm_segment) is mapped; and after training
// each rank holds an established TCP connection whose far end is a socket of the other rank.
//
// Named without the _mpi suffix so that tests/CMakeLists.txt does not also register it at 1, 2 and 3 ranks
// with the default transports; its registration (2 ranks, the environment above) is explicit there.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "trainer_test_util.hpp"

using namespace dpmlp_test;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool is_open_mpi() {
#if defined(OPEN_MPI) && OPEN_MPI
  return true;
#else
  return false;
#endif
}

// The inodes of this process's sockets (/proc/self/fd/* -> "socket:[inode]").
std::set<unsigned long> socket_inodes() {
  std::set<unsigned long> inodes;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return inodes;
  while (dirent* e = ::readdir(d)) {
    char target[256] = {0};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    unsigned long inode = 0;
    if (n > 0 && std::sscanf(target, "socket:[%lu]", &inode) == 1) inodes.insert(inode);
  }
  ::closedir(d);
  return inodes;
}

struct TcpSocket {
  unsigned local_port = 0, remote_port = 0;
  bool established = false;
};

// This process's TCP sockets (IPv4 and IPv6), from /proc/net/tcp{,6}.
std::vector<TcpSocket> my_tcp_sockets() {
  const auto mine = socket_inodes();
  std::vector<TcpSocket> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the column titles
    while (std::getline(in, line)) {
      std::istringstream s(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout;
      unsigned long inode = 0;
      if (!(s >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
      if (mine.count(inode) == 0) continue;
      TcpSocket t;
      t.local_port = static_cast<unsigned>(std::stoul(local.substr(local.find(':') + 1), nullptr, 16));
      t.remote_port = static_cast<unsigned>(std::stoul(remote.substr(remote.find(':') + 1), nullptr, 16));
      t.established = state == "01";
      out.push_back(t);
    }
  }
  return out;
}

// Whether an OpenMPI shared-memory BTL segment is mapped into this process.
bool shared_memory_segment_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("vader_segment") != std::string::npos || line.find("/sm_segment") != std::string::npos) {
      return true;
    }
  }
  return false;
}

// The OpenMPI components (mca_<framework>_<name>.so) mapped into this process. OpenMPI closes (dlcloses) the
// components it did not select, so after MPI_Init these are the PML and BTLs in use. Empty when OpenMPI was
// built with its components linked in.
std::set<std::string> mapped_components() {
  std::set<std::string> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto p = line.find("/mca_");
    if (p == std::string::npos) continue;
    std::string name = line.substr(p + 1);
    if (name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0) name.resize(name.size() - 3);
    out.insert(name);
  }
  return out;
}

}  // namespace

TEST_CASE("over TCP only: bitwise the one-rank parameters", "[trainer][tcp]") {
  INFO("ranks " << size() << ", OMPI_MCA_pml=" << env("OMPI_MCA_pml") << ", OMPI_MCA_btl=" << env("OMPI_MCA_btl"));
  for (std::int64_t rows : {1001, 64}) {
    Problem p;
    p.rows = rows;
    dpmlp::TrainerOptions opt;
    opt.block_rows = 16;
    const Trained multi = train(MPI_COMM_WORLD, p, 8, opt);
    const Trained single = train_alone(p, 8, opt);
    INFO("rows " << rows);
    CHECK(multi.params.size() == single.params.size());
    CHECK(std::memcmp(multi.params.data(), single.params.data(), multi.params.size() * sizeof(float)) == 0);
    CHECK(multi.result.last_loss == single.result.last_loss);
    CHECK(multi.result.last_loss < multi.result.first_loss);
  }
  {  // deeper, tanh, Adam
    Problem p;
    p.rows = 523;
    p.widths = {5, 12, 9, 2};
    p.activation = dpmlp::Activation::tanh;
    dpmlp::TrainerOptions opt;
    opt.block_rows = 32;
    const auto multi = train<dpmlp::MpiCommunicator, dpmlp::Adam>(MPI_COMM_WORLD, p, 6, opt, dpmlp::Adam(0.01));
    const auto single = train_alone<dpmlp::MpiCommunicator, dpmlp::Adam>(p, 6, opt, dpmlp::Adam(0.01));
    CHECK(max_abs_diff(multi.params, single.params) == 0.0);
  }
  {  // the fast reduction (one allreduce) over the same path
    Problem p;
    p.rows = 1000;
    dpmlp::TrainerOptions opt;
    opt.reduction = dpmlp::Reduction::fast;
    opt.block_rows = 16;
    CHECK(max_abs_diff(train(MPI_COMM_WORLD, p, 8, opt).params, train_alone(p, 8, opt).params) < 1e-6);
  }
}

TEST_CASE("the transport is TCP: no shared-memory segment, a TCP connection between the ranks", "[tcp]") {
  if (!is_open_mpi()) {
    WARN("not OpenMPI: the transport checks are OpenMPI-specific; skipped");
    return;
  }
  const auto components = mapped_components();
  std::string listed;
  for (const auto& c : components) listed += c + " ";
  INFO("OMPI_MCA_pml=" << env("OMPI_MCA_pml") << ", OMPI_MCA_btl=" << env("OMPI_MCA_btl")
                       << "; OpenMPI components mapped: " << listed);
  if (components.empty()) {
    // Components linked in: only the configuration can be checked.
    WARN("no mca_*.so mapped (a static OpenMPI); checking the environment only");
    CHECK(env("OMPI_MCA_btl") == "tcp,self");
    CHECK(env("OMPI_MCA_pml") == "ob1");
  } else {
    // The ob1 PML (the one that sends through BTLs; ucx and cm would bring their own transports, shared
    // memory included), the TCP BTL, and neither shared-memory BTL (vader, sm).
    CHECK(components.count("mca_pml_ob1") == 1);
    CHECK(components.count("mca_pml_ucx") == 0);
    CHECK(components.count("mca_pml_cm") == 0);
    CHECK(components.count("mca_btl_tcp") == 1);
    CHECK(components.count("mca_btl_vader") == 0);
    CHECK(components.count("mca_btl_sm") == 0);
  }
  if (size() < 2) {
    WARN("one rank: nothing to connect; registered at 2 ranks");
    return;
  }
  // A message between every pair of ranks, so the (lazily opened) connections exist.
  for (int shift = 1; shift < size(); ++shift) {
    int out = rank(), in = -1;
    MPI_Sendrecv(&out, 1, MPI_INT, (rank() + shift) % size(), 0, &in, 1, MPI_INT, (rank() - shift + size()) % size(),
                 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }

  CHECK_FALSE(shared_memory_segment_mapped());

  // Each rank's TCP sockets; a connection to rank q shows as an established socket whose remote port is
  // one of q's local ports (q's listening socket, or q's end of a connection q opened).
  const auto socks = my_tcp_sockets();
  std::vector<int> local_ports;
  for (const auto& s : socks) local_ports.push_back(static_cast<int>(s.local_port));
  int count = static_cast<int>(local_ports.size());
  std::vector<int> counts(static_cast<std::size_t>(size())), displs(static_cast<std::size_t>(size()));
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < size(); ++r) {
    displs[r] = total;
    total += counts[r];
  }
  std::vector<int> every(static_cast<std::size_t>(total > 0 ? total : 1));
  MPI_Allgatherv(local_ports.data(), count, MPI_INT, every.data(), counts.data(), displs.data(), MPI_INT,
                 MPI_COMM_WORLD);
  for (int q = 0; q < size(); ++q) {
    if (q == rank()) continue;
    const std::set<int> theirs(every.begin() + displs[q], every.begin() + displs[q] + counts[q]);
    bool connected = false;
    for (const auto& s : socks) connected = connected || (s.established && theirs.count(int(s.remote_port)) > 0);
    INFO("rank " << rank() << " -> rank " << q << ": " << socks.size() << " TCP sockets here, " << theirs.size()
                 << " local ports there");
    CHECK(connected);
  }
}
