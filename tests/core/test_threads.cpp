#include "core/threads.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tessera::core {
namespace {

TEST(RunOnThreads, EveryItemIsDoneOnceAndEveryThreadTakesPart) {
  constexpr int kItems = 1000;
  std::vector<std::atomic<int>> done(kItems);
  std::vector<std::atomic<int>> calls(4);
  std::atomic<int> next{0};
  run_on_threads(4, [&](int thread) {
    ++calls[static_cast<std::size_t>(thread)];
    for (int i = next++; i < kItems; i = next++) ++done[static_cast<std::size_t>(i)];
  });
  for (const auto& d : done) EXPECT_EQ(d.load(), 1);
  for (const auto& c : calls) EXPECT_EQ(c.load(), 1) << "work(thread) once for each of threads 0 .. 3";
  int alone = 0;
  run_on_threads(0, [&](int thread) { alone += thread + 1; });  // fewer than 1 thread: the caller's alone
  EXPECT_EQ(alone, 1);
}

TEST(RunOnThreads, TheLowestThreadsExceptionIsRethrownAfterEveryThreadEnded) {
  std::atomic<int> ended{0};
  try {
    run_on_threads(3, [&](int thread) {
      ++ended;
      if (thread >= 1) throw std::runtime_error("thread " + std::to_string(thread));
    });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "thread 1");
  }
  EXPECT_EQ(ended.load(), 3);
}

TEST(UsableCores, AtLeastOneAndSharedByTheUnboundRanksOfANode) {
  const int alone = usable_cores();
  EXPECT_GE(alone, 1);
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const bool bound = CPU_COUNT(&set) < static_cast<int>(std::thread::hardware_concurrency());
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1024", 1);
  EXPECT_EQ(local_rank_count(), 1024);
  // 1024 unbound ranks on this node share its cores; a bound process keeps the cores it was given.
  EXPECT_EQ(usable_cores(), bound ? CPU_COUNT(&set) : 1);
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  EXPECT_EQ(usable_cores(), alone);
}

}  // namespace
}  // namespace tessera::core
