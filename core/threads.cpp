#include "core/threads.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace tessera::core {

int local_rank_count() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* value = std::getenv(name)) {
      const int n = std::atoi(value);
      if (n > 0) return n;
    }
  }
  return 1;
}

int usable_cores() {
  const int node = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  int mine = node;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) mine = std::max(1, CPU_COUNT(&set));
  // Bound ranks see their own cores; unbound ones see the whole node and share it.
  if (mine >= node) mine = std::max(1, mine / local_rank_count());
  return mine;
}

void run_on_threads(int threads, const std::function<void(int thread)>& work) {
  const int n = std::max(1, threads);
  std::vector<std::exception_ptr> crashed(static_cast<std::size_t>(n));
  const auto run = [&](int thread) {
    try {
      work(thread);
    } catch (...) {
      crashed[static_cast<std::size_t>(thread)] = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  helpers.reserve(static_cast<std::size_t>(n - 1));
  for (int thread = 1; thread < n; ++thread) {
    try {
      helpers.emplace_back(run, thread);
    } catch (const std::system_error&) {
      break;  // no more threads to be had (a process limit): the ones started share the work
    }
  }
  run(0);
  for (auto& helper : helpers) helper.join();
  for (const auto& e : crashed) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace tessera::core
