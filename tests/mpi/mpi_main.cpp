// main() for GoogleTest programs that CTest runs under mpirun: one MPI session for all tests, gtest's output
// from rank 0 only (other ranks print their failures, prefixed with the rank), and the same exit status on every
// rank (a failure on any rank fails the job). Every test in such a program is collective: all ranks run the same
// tests in the same order, and a test never returns early on one rank before a collective call.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "core/comm.h"
#include "core/error.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::printf("[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                result.line_number(), result.message());
    std::fflush(stdout);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::printf("[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    std::fflush(stdout);
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera::core;
  try {
    MpiSession session(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    int failed = 0;
    {
      auto world = Comm::world();
      if (!world.is_root()) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new RankFailurePrinter(world.rank()));
      }
      const int result = RUN_ALL_TESTS();
      failed = static_cast<int>(world.allreduce_value<std::int64_t>(result != 0 ? 1 : 0, ReduceOp::max));
      if (world.is_root() && failed && result == 0) {
        std::printf("[  FAILED  ] on other ranks: see the [rank N] lines\n");
        std::fflush(stdout);
      }
    }
    session.finalize();
    return failed;
  } catch (const std::exception& e) {
    abort_job(std::string("test program failed: ") + e.what(), exit_internal);
  }
}
