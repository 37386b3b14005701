// A world of one rank without MPI (Comm::alone(), what `tessera tile` started on its own runs on), and how a process
// tells whether a launcher started it. This program never initializes MPI, so a stray MPI call here ends it (Open MPI
// aborts a call made before MPI_Init) rather than succeeding as it would under mpirun.
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/comm.h"
#include "core/error.h"
#include "core/progress.h"

namespace tessera::core {
namespace {

TEST(CommAlone, IsAWorldOfOneRankWithoutMpiCalls) {
  const Comm alone = Comm::alone();
  EXPECT_TRUE(alone.is_alone());
  EXPECT_EQ(alone.rank(), 0);
  EXPECT_EQ(alone.size(), 1);
  EXPECT_TRUE(alone.is_root());
  alone.barrier();
  alone.poll();
  std::vector<double> values{1.5, -2.0};
  alone.allreduce(values.data(), values.size(), ReduceOp::sum);
  EXPECT_EQ(values, (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(alone.allreduce_value<std::int64_t>(7, ReduceOp::max), 7);
  std::string text = "kept";
  alone.broadcast(text, 0);
  EXPECT_EQ(text, "kept");
  EXPECT_EQ(alone.gather_bytes("mine", 0), std::vector<std::string>{"mine"});
  EXPECT_EQ(alone.allgather_bytes("mine"), std::vector<std::string>{"mine"});
  std::vector<float> sum{3.0f};
  MPI_Request request = alone.iallreduce_sum(sum.data(), sum.size());
  EXPECT_TRUE(Comm::test(request));
  Comm::wait(request);
  EXPECT_EQ(sum[0], 3.0f);
  EXPECT_TRUE(alone.split_node().is_alone());
  EXPECT_EQ(alone.split(2, 0).size(), 1);
  EXPECT_EQ(alone.split(MPI_UNDEFINED, 0).size(), 0);
  EXPECT_FALSE(ProgressThread(alone).running());
}

TEST(CommAlone, RefusesOtherRootsAndItsMpiHandle) {
  const Comm alone = Comm::alone();
  std::string text = "kept";
  EXPECT_THROW(alone.broadcast(text, 1), InternalError);
  std::int64_t value = 0;
  EXPECT_THROW(alone.broadcast(&value, sizeof value, -1), InternalError);
  EXPECT_THROW(alone.gather_bytes("mine", 1), InternalError);
  EXPECT_THROW(static_cast<void>(alone.handle()), InternalError);
}

TEST(CommAlone, IsTheWorldOfASessionWithoutMpi) {
  int argc = 1;
  char name[] = "tessera";
  char* args[] = {name, nullptr};
  char** argv = args;
  const MpiSession session(&argc, &argv, false);
  EXPECT_TRUE(MpiSession::alone());
  EXPECT_FALSE(MpiSession::active());
  EXPECT_TRUE(Comm::world().is_alone());
}

TEST(WindowOnAlone, IsLocalMemory) {
  const Comm alone = Comm::alone();
  Window window(alone, 4 * sizeof(std::int64_t), sizeof(std::int64_t));
  const auto* memory = static_cast<const std::int64_t*>(window.local());
  EXPECT_EQ(std::vector<std::int64_t>(memory, memory + 4), std::vector<std::int64_t>(4, 0));  // zeroed
  window.lock_all();
  const std::int64_t two[] = {5, 6};
  window.put(two, sizeof two, 0, 1);  // at elements 1 and 2
  window.accumulate_sum(two, 2, 0, 2);
  EXPECT_EQ(window.fetch_add(10, 0, 0), 0);
  EXPECT_EQ(window.fetch_add(1, 0, 0), 10);
  std::int64_t back[4] = {};
  window.get(back, sizeof back, 0, 0);
  window.unlock_all();
  EXPECT_EQ(std::vector<std::int64_t>(back, back + 4), (std::vector<std::int64_t>{11, 5, 11, 6}));

  Window shared(alone, 3, 1, Window::Kind::shared);
  std::size_t bytes = 0;
  EXPECT_EQ(shared.shared_pointer(0, &bytes), shared.local());
  EXPECT_EQ(bytes, 3u);
  const float half[] = {0.5f};
  Window floats(alone, sizeof(float), sizeof(float));
  floats.accumulate_sum(half, 1, 0, 0);
  floats.accumulate_sum(half, 1, 0, 0);
  EXPECT_EQ(*static_cast<const float*>(floats.local()), 1.0f);

  Progress progress(alone, 5, {.label = "alone", .force_terminal = 0});
  progress.advance(2);
  progress.advance(3);
  EXPECT_EQ(progress.finish(), 5);
}

TEST(WindowOnAlone, RefusesWhatLiesOutsideIt) {
  const Comm alone = Comm::alone();
  Window window(alone, 4 * sizeof(std::int64_t), sizeof(std::int64_t));
  const std::int64_t two[] = {5, 6};
  std::int64_t back[4] = {};
  EXPECT_THROW(window.put(two, sizeof two, 0, 3), InternalError);  // past the end
  EXPECT_THROW(window.get(back, 8, 1, 0), InternalError);          // there is no rank 1
  // offset * 8 wraps to 0: the offset itself lies past the window.
  const std::size_t wraps = std::numeric_limits<std::size_t>::max() / sizeof(std::int64_t) + 1;
  EXPECT_THROW(window.get(back, 8, 0, wraps), InternalError);
  EXPECT_THROW(window.accumulate_sum(two, 1, 0, wraps), InternalError);
  EXPECT_THROW(window.fetch_add(1, 0, wraps), InternalError);
  EXPECT_THROW(window.lock(1, false), InternalError);
  EXPECT_THROW(window.unlock(1), InternalError);
  EXPECT_THROW(window.flush(1), InternalError);
  EXPECT_THROW(static_cast<void>(window.handle()), InternalError);
  window.lock(0, true);
  window.flush(0);
  window.unlock(0);
  EXPECT_EQ(std::vector<std::int64_t>(static_cast<const std::int64_t*>(window.local()),
                                      static_cast<const std::int64_t*>(window.local()) + 4),
            std::vector<std::int64_t>(4, 0));  // nothing written by the refused calls
}

TEST(WindowOnAlone, ZeroBytesTakeNothing) {
  const Comm alone = Comm::alone();
  Window empty(alone, 0, sizeof(float));
  EXPECT_EQ(empty.local(), nullptr);
  const float none[1] = {1.0f};
  empty.accumulate_sum(none, 0, 0, 0);
  empty.put(none, 0, 0, 0);
  float back[1] = {2.0f};
  empty.get(back, 0, 0, 0);
  EXPECT_EQ(back[0], 2.0f);
  EXPECT_THROW(empty.accumulate_sum(none, 1, 0, 0), InternalError);
}

// What a Slurm batch script's own process has (srun adds SLURM_STEP_ID for each task).
const std::vector<const char*> batch_variables{"SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NODELIST", "SLURM_LOCALID"};

// Starts each test with none of the launcher's or the batch script's variables set, and puts the environment back
// as it was (the tests may run inside a Slurm job or under mpirun).
class Launcher : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto* list : {&launcher_variables(), &batch_variables}) {
      for (const char* name : *list) {
        if (const char* value = std::getenv(name)) saved_[name] = value;
        ::unsetenv(name);
      }
    }
  }
  void TearDown() override {
    for (const auto* list : {&launcher_variables(), &batch_variables}) {
      for (const char* name : *list) ::unsetenv(name);
    }
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST_F(Launcher, AnyOfItsVariablesMarksAProcessStartedByOne) {
  EXPECT_FALSE(started_by_launcher());
  for (const char* name : launcher_variables()) {
    ::setenv(name, "0", 1);
    EXPECT_TRUE(started_by_launcher()) << name;
    ::unsetenv(name);
  }
  EXPECT_FALSE(started_by_launcher());
}

TEST_F(Launcher, ASlurmBatchScriptWithoutSrunIsNotOne) {
  for (const char* name : batch_variables) ::setenv(name, "0", 1);
  EXPECT_FALSE(started_by_launcher());
  ::setenv("SLURM_STEP_ID", "0", 1);  // the same process as an srun task
  EXPECT_TRUE(started_by_launcher());
}

}  // namespace
}  // namespace tessera::core
