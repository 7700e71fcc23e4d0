// Benchmark entry point: Google Benchmark's flags plus
//   --threads=N      size of the kernel thread pool (default: one per hardware
//                    thread), so per-core efficiency can be seen apart from scaling;
//   --huge_pages=0|1 back KV pools and weights with transparent huge pages (default 1).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "bench/ceilings.h"
#include "bench/huge_buffer.h"

int main(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      baton::bench::set_bench_threads(std::atoi(argv[i] + 10));
    } else if (std::strncmp(argv[i], "--huge_pages=", 13) == 0) {
      baton::bench::HugeBuffer::use_huge_pages() = std::atoi(argv[i] + 13) != 0;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("pool_threads", std::to_string(baton::bench::bench_pool().size()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
