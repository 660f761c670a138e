// SPDX-License-Identifier: BSD-3-Clause
// kernel_trace: where a CUDA program's GPU time goes, kernel by kernel, without Nsight. A CUPTI injection
// library: the CUDA driver loads it into any program run with
//
//   CUDA_INJECTION64_PATH=/path/to/libdpmlp_kernel_trace.so DPMLP_TRACE_OUT=trace ./workload_bench ...
//
// and at exit each process that ran kernels writes trace.<pid>.json: every kernel's name (demangled), count
// and total, min, median and max duration; the span from the first kernel's start to the last one's end, the
// time at least one kernel ran (busy) and the sum of the durations (sum > busy where kernels overlapped);
// with DPMLP_TRACE_TIMELINE=N also the last N kernels (start relative to the first of them, duration, stream,
// grid and block size, shared memory). Kernels launched in CUDA graphs are recorded too.
//
// Only the processes that ran kernels write (MPI's helper processes load the library but launch none). The
// records are CUPTI's concurrent-kernel activity, which adds a little time to each launch: use the trace for
// where time goes, and the benchmark's own timing for how much.
#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "json_string.hpp"

namespace {

struct Kernel {
  std::string name;
  std::uint64_t start, end;
  std::uint32_t stream;
  std::uint64_t grid;
  std::uint32_t block, shared;
};

std::mutex mutex;
std::vector<Kernel> kernels;
bool reported = false;

std::string demangled(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : name;
  std::free(d);
  return s;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *size = std::size_t(1) << 20;
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel9*>(record);
    kernels.push_back({demangled(k->name), k->start, k->end, k->streamId,
                       std::uint64_t(k->gridX) * k->gridY * k->gridZ, std::uint32_t(k->blockX * k->blockY * k->blockZ),
                       std::uint32_t(k->dynamicSharedMemory + k->staticSharedMemory)});
  }
  std::free(buffer);
}

void report() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(mutex);
  const char* prefix = std::getenv("DPMLP_TRACE_OUT");
  if (reported || kernels.empty() || prefix == nullptr) return;
  reported = true;
  std::sort(kernels.begin(), kernels.end(), [](const Kernel& a, const Kernel& b) { return a.start < b.start; });

  // busy: the union of the kernels' intervals.
  double busy = 0, sum = 0;
  std::uint64_t covered = 0, last = 0;
  std::map<std::string, std::vector<double>> by_name;  // durations, us
  for (const Kernel& k : kernels) {
    const double us = (k.end - k.start) * 1e-3;
    sum += us;
    by_name[k.name].push_back(us);
    const std::uint64_t from = std::max(k.start, covered);
    if (k.end > from) busy += (k.end - from) * 1e-3;
    covered = std::max(covered, k.end);
    last = std::max(last, k.end);
  }
  struct Row {
    std::string name;
    std::vector<double> us;
    double total;
  };
  std::vector<Row> rows;
  for (auto& [name, us] : by_name) {
    std::sort(us.begin(), us.end());
    double total = 0;
    for (const double u : us) total += u;
    rows.push_back({name, us, total});
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.total > b.total; });

  const std::string path = std::string(prefix) + "." + std::to_string(getpid()) + ".json";
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(f, "{\"kernels\": %zu, \"span_ms\": %.4f, \"busy_ms\": %.4f, \"sum_ms\": %.4f,\n \"by_name\": [",
               kernels.size(), (last - kernels.front().start) * 1e-6, busy * 1e-3, sum * 1e-3);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f, "%s\n  {\"total_ms\": %.4f, \"count\": %zu, \"min_us\": %.2f, \"median_us\": %.2f, \"max_us\": %.2f, "
                    "\"name\": %s}",
                 i ? "," : "", r.total * 1e-3, r.us.size(), r.us.front(), r.us[r.us.size() / 2], r.us.back(),
                 json_string(r.name).c_str());
  }
  std::fprintf(f, "]");
  const char* timeline = std::getenv("DPMLP_TRACE_TIMELINE");
  const long n = timeline != nullptr ? std::atol(timeline) : 0;
  if (n > 0) {
    const std::size_t from = kernels.size() > std::size_t(n) ? kernels.size() - std::size_t(n) : 0;
    const std::uint64_t t0 = kernels[from].start;
    std::fprintf(f, ",\n \"timeline\": [");
    for (std::size_t i = from; i < kernels.size(); ++i) {
      const Kernel& k = kernels[i];
      std::fprintf(f, "%s\n  {\"start_us\": %.2f, \"us\": %.2f, \"stream\": %u, \"grid\": %llu, \"block\": %u, "
                      "\"shared\": %u, \"name\": %s}",
                   i > from ? "," : "", (k.start - t0) * 1e-3, (k.end - k.start) * 1e-3, k.stream,
                   static_cast<unsigned long long>(k.grid), k.block, k.shared, json_string(k.name).c_str());
    }
    std::fprintf(f, "]");
  }
  std::fprintf(f, "}\n");
  std::fclose(f);
}

// The driver may destroy a context before exit (cudaDeviceReset): its records are taken first.
void CUPTIAPI on_resource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void*) {
  if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  }
}

}  // namespace

// Called by the CUDA driver, which loads this library from CUDA_INJECTION64_PATH at cuInit.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  CUpti_SubscriberHandle subscriber;
  if (cuptiSubscribe(&subscriber, reinterpret_cast<CUpti_CallbackFunc>(on_resource), nullptr) == CUPTI_SUCCESS) {
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
  }
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI refused kernel activity tracing; no trace\n");
    return 0;
  }
  std::atexit(report);
  return 1;
}
