// The MPI facade under 1, 2 and 4 ranks (CTest runs this program with mpirun; it also runs on its own as a
// singleton). Every test is collective: all ranks run the same tests in the same order, and a test never
// returns early on one rank before a collective call (checks are EXPECTs after the communication).
#include "core/comm.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/progress.h"

namespace tessera::core {
namespace {

// Packs int64 values into bytes for allgather_bytes.
std::string pack(const std::vector<std::int64_t>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(std::int64_t));
}

std::vector<std::int64_t> unpack(const std::string& bytes) {
  std::vector<std::int64_t> values(bytes.size() / sizeof(std::int64_t));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(std::int64_t));
  return values;
}

// ------------------------------------------------------------------------------------------- collectives

TEST(Comm, WorldRankAndSize) {
  auto world = Comm::world();
  EXPECT_TRUE(MpiSession::active());
  EXPECT_GE(world.rank(), 0);
  EXPECT_LT(world.rank(), world.size());
  EXPECT_EQ(world.is_root(), world.rank() == 0);
  EXPECT_EQ(world.handle(), MPI_COMM_WORLD);
  EXPECT_EQ(world.allreduce_value<std::int64_t>(1, ReduceOp::sum), world.size());
  world.barrier();
}

TEST(Comm, AllreduceFloatSumMaxMin) {
  auto world = Comm::world();
  const int r = world.rank();
  const int n = world.size();
  constexpr std::size_t count = 7;
  // Halves and small integers are exact in float, so the sums are exact whatever the reduction order.
  auto values = [&] {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>(r) + 0.5f * static_cast<float>(i);
    return v;
  };
  auto sum = values(), max = values(), min = values();
  world.allreduce(sum.data(), count, ReduceOp::sum);
  world.allreduce(max.data(), count, ReduceOp::max);
  world.allreduce(min.data(), count, ReduceOp::min);
  for (std::size_t i = 0; i < count; ++i) {
    const float half_i = 0.5f * static_cast<float>(i);
    EXPECT_EQ(sum[i], static_cast<float>(n * (n - 1) / 2) + static_cast<float>(n) * half_i) << i;
    EXPECT_EQ(max[i], static_cast<float>(n - 1) + half_i) << i;
    EXPECT_EQ(min[i], half_i) << i;
  }
}

TEST(Comm, AllreduceDoubleSumMaxMin) {
  auto world = Comm::world();
  const int r = world.rank();
  const int n = world.size();
  // Rank-dependent signs so max and min are not just the last and first rank.
  const double mine = (r % 2 == 0 ? 1.0 : -1.0) * 0.25 * (r + 1);
  std::vector<double> sum(3, mine), max(3, mine), min(3, mine);
  world.allreduce(sum.data(), sum.size(), ReduceOp::sum);
  world.allreduce(max.data(), max.size(), ReduceOp::max);
  world.allreduce(min.data(), min.size(), ReduceOp::min);
  double expected_sum = 0;
  double expected_max = -1e300;
  double expected_min = 1e300;
  for (int k = 0; k < n; ++k) {
    const double v = (k % 2 == 0 ? 1.0 : -1.0) * 0.25 * (k + 1);
    expected_sum += v;
    expected_max = std::max(expected_max, v);
    expected_min = std::min(expected_min, v);
  }
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(sum[i], expected_sum);
    EXPECT_EQ(max[i], expected_max);
    EXPECT_EQ(min[i], expected_min);
  }
}

TEST(Comm, AllreduceInt64SumMaxMinBeyond32Bits) {
  auto world = Comm::world();
  const std::int64_t r = world.rank();
  const std::int64_t n = world.size();
  constexpr std::int64_t big = std::int64_t{1} << 40;
  std::vector<std::int64_t> sum{big * (r + 1), -r}, max = sum, min = sum;
  world.allreduce(sum.data(), sum.size(), ReduceOp::sum);
  world.allreduce(max.data(), max.size(), ReduceOp::max);
  world.allreduce(min.data(), min.size(), ReduceOp::min);
  EXPECT_EQ(sum[0], big * n * (n + 1) / 2);
  EXPECT_EQ(sum[1], -n * (n - 1) / 2);
  EXPECT_EQ(max[0], big * n);
  EXPECT_EQ(max[1], 0);
  EXPECT_EQ(min[0], big);
  EXPECT_EQ(min[1], -(n - 1));
}

// Large allreduces go in 4 MB pieces (core/comm.cpp): every element of a 10.5 MB buffer (two whole pieces and a
// partial one), doubles and floats, gets every rank's value, and nothing beyond the count is touched.
TEST(Comm, AllreduceInPiecesCoversEveryElement) {
  auto world = Comm::world();
  const int r = world.rank();
  const int n = world.size();
  const std::size_t floats = (std::size_t{21} << 20) / 8;  // 10.5 MB
  std::vector<float> f(floats + 1);
  for (std::size_t i = 0; i < floats; ++i) f[i] = static_cast<float>(i % 1024) + static_cast<float>(r);
  f[floats] = -7.0f;  // a guard after the reduced range
  world.allreduce(f.data(), floats, ReduceOp::sum);
  const float rank_sum = static_cast<float>(n * (n - 1) / 2);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < floats; ++i)
    wrong += f[i] != static_cast<float>(n) * static_cast<float>(i % 1024) + rank_sum;
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(f[floats], -7.0f);

  std::vector<double> d(floats / 2 + 3, static_cast<double>(r));
  world.allreduce(d.data(), d.size(), ReduceOp::max);
  EXPECT_EQ(std::count(d.begin(), d.end(), static_cast<double>(n - 1)), static_cast<std::ptrdiff_t>(d.size()));
}

TEST(Comm, AllreduceValueAndEmpty) {
  auto world = Comm::world();
  EXPECT_EQ(world.allreduce_value(static_cast<double>(world.rank()), ReduceOp::max), world.size() - 1.0);
  EXPECT_EQ(world.allreduce_value(static_cast<float>(world.rank() + 1), ReduceOp::min), 1.0f);
  world.allreduce(static_cast<float*>(nullptr), 0, ReduceOp::sum);  // nothing to do, must not fail
}

TEST(Comm, IallreduceSumOverlapsAndCompletes) {
  auto world = Comm::world();
  const int n = world.size();
  std::vector<float> data(1000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 17) + static_cast<float>(world.rank());
  MPI_Request request = world.iallreduce_sum(data.data(), data.size());
  double busy = 0;  // "compute" while the reduction is in flight
  for (int i = 0; i < 1000; ++i) busy += i * 0.5;
  EXPECT_GT(busy, 0);
  Comm::wait(request);
  EXPECT_EQ(request, MPI_REQUEST_NULL);
  for (std::size_t i = 0; i < data.size(); ++i) {
    ASSERT_EQ(data[i], static_cast<float>(n * static_cast<int>(i % 17) + n * (n - 1) / 2)) << i;
  }
}

TEST(Comm, BroadcastStringFromLastRank) {
  auto world = Comm::world();
  const int root = world.size() - 1;
  const std::string sent = std::string("from the last rank\0with a NUL", 29) + std::to_string(root);
  std::string text = world.rank() == root ? sent : "something else entirely, and longer than the message";
  world.broadcast(text, root);
  EXPECT_EQ(text, sent);

  std::string empty = world.rank() == root ? "" : "not empty";
  world.broadcast(empty, root);
  EXPECT_EQ(empty, "");
}

TEST(Comm, BroadcastVectorFromNonZeroRoot) {
  auto world = Comm::world();
  const int root = world.size() > 1 ? 1 : 0;
  std::vector<std::int64_t> expected(1000);
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<std::int64_t>(i * i) - 7;
  std::vector<std::int64_t> values = world.rank() == root ? expected : std::vector<std::int64_t>{1, 2, 3};
  world.broadcast(values, root);
  EXPECT_EQ(values, expected);

  std::vector<float> none = world.rank() == root ? std::vector<float>{} : std::vector<float>(5, 1.0f);
  world.broadcast(none, root);
  EXPECT_TRUE(none.empty());

  double raw = world.rank() == root ? 2.75 : 0.0;
  world.broadcast(&raw, sizeof raw, root);
  EXPECT_EQ(raw, 2.75);
}

// Rank r contributes r*3 bytes ("" on rank 0) with NULs inside, so sizes differ and one is empty.
std::string contribution(int rank) {
  std::string s;
  for (int i = 0; i < rank * 3; ++i) s += static_cast<char>(i % 3 == 1 ? '\0' : 'a' + rank);
  return s;
}

TEST(Comm, GatherBytesVariableSizesToLastRank) {
  auto world = Comm::world();
  const int root = world.size() - 1;
  auto gathered = world.gather_bytes(contribution(world.rank()), root);
  if (world.rank() == root) {
    ASSERT_EQ(gathered.size(), static_cast<std::size_t>(world.size()));
    for (int r = 0; r < world.size(); ++r) EXPECT_EQ(gathered[static_cast<std::size_t>(r)], contribution(r)) << r;
    EXPECT_TRUE(gathered[0].empty());
  } else {
    EXPECT_TRUE(gathered.empty());
  }
}

TEST(Comm, AllgatherBytesVariableSizes) {
  auto world = Comm::world();
  auto gathered = world.allgather_bytes(contribution(world.rank()));
  ASSERT_EQ(gathered.size(), static_cast<std::size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) EXPECT_EQ(gathered[static_cast<std::size_t>(r)], contribution(r)) << r;

  auto all_empty = world.allgather_bytes("");
  ASSERT_EQ(all_empty.size(), static_cast<std::size_t>(world.size()));
  for (const auto& s : all_empty) EXPECT_TRUE(s.empty());
}

// ------------------------------------------------------------------------------------------- splitting

TEST(CommSplit, SplitNodeCoversEveryRankOnce) {
  auto world = Comm::world();
  auto node = world.split_node();
  ASSERT_NE(node.handle(), MPI_COMM_NULL);
  EXPECT_GE(node.size(), 1);
  EXPECT_LE(node.size(), world.size());
  // Each node's rank 0 reports its size: the sizes add up to the world.
  const std::int64_t reported = node.is_root() ? node.size() : 0;
  EXPECT_EQ(world.allreduce_value(reported, ReduceOp::sum), world.size());
  // Keyed by world rank: node ranks follow world ranks.
  auto members = node.allgather_bytes(pack({world.rank()}));
  std::vector<std::int64_t> world_ranks;
  for (const auto& m : members) world_ranks.push_back(unpack(m).at(0));
  EXPECT_TRUE(std::is_sorted(world_ranks.begin(), world_ranks.end()));
  EXPECT_EQ(world_ranks.at(static_cast<std::size_t>(node.rank())), world.rank());
}

TEST(CommSplit, SplitByParityWithReversedKey) {
  auto world = Comm::world();
  const int r = world.rank();
  const int n = world.size();
  auto part = world.split(r % 2, -r);
  int same_parity = 0;
  int higher_same_parity = 0;
  for (int k = 0; k < n; ++k) {
    if (k % 2 != r % 2) continue;
    ++same_parity;
    if (k > r) ++higher_same_parity;
  }
  EXPECT_EQ(part.size(), same_parity);
  EXPECT_EQ(part.rank(), higher_same_parity);  // key -rank: the highest world rank comes first
  EXPECT_EQ(part.allreduce_value<std::int64_t>(r, ReduceOp::max), n - 1 - ((n - 1) % 2 != r % 2 ? 1 : 0));
}

TEST(CommSplit, UndefinedColorGivesEmptyComm) {
  auto world = Comm::world();
  auto part = world.split(world.rank() == 0 ? MPI_UNDEFINED : 0, world.rank());
  if (world.rank() == 0) {
    EXPECT_EQ(part.handle(), MPI_COMM_NULL);
    EXPECT_EQ(part.size(), 0);
  } else {
    EXPECT_EQ(part.size(), world.size() - 1);
    EXPECT_EQ(part.rank(), world.rank() - 1);
  }
}

TEST(CommSplit, MoveTransfersOwnership) {
  auto world = Comm::world();
  Comm a = world.split(0, world.rank());
  const MPI_Comm handle = a.handle();
  Comm b(std::move(a));
  EXPECT_EQ(a.handle(), MPI_COMM_NULL);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(b.handle(), handle);
  EXPECT_EQ(b.size(), world.size());
  Comm c = world.split(1, -world.rank());
  c = std::move(b);  // frees c's own communicator, takes b's
  EXPECT_EQ(c.handle(), handle);
  EXPECT_EQ(c.rank(), world.rank());
  EXPECT_EQ(c.allreduce_value<std::int64_t>(1, ReduceOp::sum), world.size());
}

// ------------------------------------------------------------------------------------------- windows

TEST(Window, PutAndGetWithFences) {
  auto world = Comm::world();
  const int r = world.rank();
  const int n = world.size();
  // Slot k of rank t's window receives k*100 + t from rank k.
  Window window(world, static_cast<std::size_t>(n) * sizeof(std::int64_t), sizeof(std::int64_t));
  EXPECT_EQ(window.local_bytes(), n * sizeof(std::int64_t));
  window.fence();
  for (int t = 0; t < n; ++t) {
    const std::int64_t value = std::int64_t{r} * 100 + t;
    window.put(&value, sizeof value, t, static_cast<std::size_t>(r));
  }
  window.fence();
  const auto* local = static_cast<const std::int64_t*>(window.local());
  for (int k = 0; k < n; ++k) EXPECT_EQ(local[k], std::int64_t{k} * 100 + r) << k;

  // Read the whole window of the next rank.
  const int next = (r + 1) % n;
  std::vector<std::int64_t> copy(static_cast<std::size_t>(n), -1);
  window.get(copy.data(), copy.size() * sizeof(std::int64_t), next, 0);
  window.fence();
  for (int k = 0; k < n; ++k) EXPECT_EQ(copy[static_cast<std::size_t>(k)], std::int64_t{k} * 100 + next) << k;
}

TEST(Window, AccumulateFloatAndInt64UnderSharedLocks) {
  auto world = Comm::world();
  const int r = world.rank();
  const int n = world.size();
  constexpr std::size_t count = 5;
  // Bytes 0..19: floats; bytes 24..63: int64 (disp_unit 1, offsets in bytes).
  constexpr std::size_t int_offset = 24;
  Window window(world, int_offset + count * sizeof(std::int64_t), 1);
  window.lock(r, true);
  std::memset(window.local(), 0, window.local_bytes());
  window.unlock(r);
  world.barrier();

  std::vector<float> floats(count);
  std::vector<std::int64_t> ints(count);
  for (std::size_t i = 0; i < count; ++i) {
    floats[i] = static_cast<float>(r + 1) * 0.5f;
    ints[i] = (std::int64_t{r} + 1) << 33;
  }
  for (int t = 0; t < n; ++t) {
    window.lock(t, false);
    window.accumulate_sum(floats.data(), count, t, 0);
    window.accumulate_sum(ints.data(), count, t, int_offset);
    window.unlock(t);
  }
  world.barrier();

  std::vector<float> got_floats(count);
  std::vector<std::int64_t> got_ints(count);
  window.lock(r, false);
  window.get(got_floats.data(), count * sizeof(float), r, 0);
  window.get(got_ints.data(), count * sizeof(std::int64_t), r, int_offset);
  window.unlock(r);
  for (std::size_t i = 0; i < count; ++i) {
    EXPECT_EQ(got_floats[i], 0.5f * static_cast<float>(n * (n + 1) / 2)) << i;
    EXPECT_EQ(got_ints[i], (std::int64_t{n} * (n + 1) / 2) << 33) << i;
  }
  world.barrier();  // nobody frees the window while another rank still reads
}

TEST(Window, FetchAddGivesDistinctPreviousValues) {
  auto world = Comm::world();
  constexpr int per_rank = 50;
  Window window(world, sizeof(std::int64_t), sizeof(std::int64_t));
  window.lock(world.rank(), true);
  *static_cast<std::int64_t*>(window.local()) = 0;
  window.unlock(world.rank());
  world.barrier();

  std::vector<std::int64_t> previous;
  for (int i = 0; i < per_rank; ++i) {
    window.lock(0, false);
    previous.push_back(window.fetch_add(1, 0, 0));
    window.unlock(0);
  }
  world.barrier();
  window.lock(0, false);
  const std::int64_t final_value = window.fetch_add(0, 0, 0);
  window.unlock(0);
  EXPECT_EQ(final_value, std::int64_t{per_rank} * world.size());

  // Every ticket 0..N*size-1 was handed out exactly once.
  std::vector<std::int64_t> all;
  for (const auto& bytes : world.allgather_bytes(pack(previous))) {
    auto part = unpack(bytes);
    all.insert(all.end(), part.begin(), part.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<std::int64_t> expected(all.size());
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(all.size(), static_cast<std::size_t>(per_rank * world.size()));
  EXPECT_EQ(all, expected);
}

TEST(Window, ZeroByteWindows) {
  auto world = Comm::world();
  {
    Window empty(world, 0, 1);
    EXPECT_EQ(empty.local_bytes(), 0u);
    EXPECT_EQ(empty.local(), nullptr);
    empty.fence();
    empty.put(nullptr, 0, 0, 0);  // a zero-byte transfer is a no-op
    empty.fence();
  }
  // Only rank 0 exposes memory; everyone adds into it.
  Window counter(world, world.is_root() ? sizeof(std::int64_t) : 0, sizeof(std::int64_t));
  if (world.is_root()) {
    counter.lock(0, true);
    *static_cast<std::int64_t*>(counter.local()) = 0;
    counter.unlock(0);
  }
  world.barrier();
  const std::int64_t mine = world.rank() + 1;
  counter.lock(0, false);
  counter.accumulate_sum(&mine, 1, 0, 0);
  counter.unlock(0);
  world.barrier();
  std::int64_t total = 0;
  if (world.is_root()) {
    counter.lock(0, false);
    counter.get(&total, sizeof total, 0, 0);
    counter.unlock(0);
  }
  world.broadcast(&total, sizeof total, 0);
  EXPECT_EQ(total, std::int64_t{world.size()} * (world.size() + 1) / 2);
}

// Rank 0 makes no MPI call while its ProgressThread lives, yet every other rank's fetch-and-add on its window
// completes. Under osc/pt2pt (the test mpi.comm.progress-pt2pt; Open MPI's transport over TCP) only the thread's
// polls serve them: without it rank 0 would wait for the counter forever (the test's CTest timeout ends it).
// Elsewhere (osc/sm) they land without rank 0's MPI.
TEST(ProgressThread, ServesOneSidedRequestsWhileTheRankMakesNoMpiCall) {
  auto world = Comm::world();
  Window counter(world, world.is_root() ? sizeof(std::int64_t) : 0, sizeof(std::int64_t));
  if (world.is_root()) {
    counter.lock(0, true);
    *static_cast<std::int64_t*>(counter.local()) = 0;
    counter.unlock(0);
  }
  world.barrier();
  if (world.is_root()) {
    const ProgressThread serving(world);
    EXPECT_TRUE(serving.running());
    const std::atomic_ref<std::int64_t> value(*static_cast<std::int64_t*>(counter.local()));
    while (value.load() < world.size() - 1) std::this_thread::yield();  // a failing run hangs: the CTest timeout
    EXPECT_EQ(value.load(), world.size() - 1);
  } else {
    counter.lock_all();
    EXPECT_LT(counter.fetch_add(1, 0, 0), world.size() - 1);
    counter.unlock_all();
  }
  world.barrier();
}

TEST(Window, SharedPointerOnTheNodeCommunicator) {
  auto world = Comm::world();
  auto node = world.split_node();
  const int r = node.rank();
  // Segments of different sizes: rank r holds r+1 int64 values, all equal to 1000*r + index.
  const std::size_t mine = static_cast<std::size_t>(r + 1);
  Window window(node, mine * sizeof(std::int64_t), sizeof(std::int64_t), Window::Kind::shared);
  window.lock_all();
  auto* local = static_cast<std::int64_t*>(window.local());
  for (std::size_t i = 0; i < mine; ++i) local[i] = 1000 * std::int64_t{r} + static_cast<std::int64_t>(i);
  window.sync();
  node.barrier();
  window.sync();
  for (int k = 0; k < node.size(); ++k) {
    std::size_t bytes = 0;
    const auto* segment = static_cast<const std::int64_t*>(window.shared_pointer(k, &bytes));
    ASSERT_NE(segment, nullptr);
    ASSERT_EQ(bytes, static_cast<std::size_t>(k + 1) * sizeof(std::int64_t));
    for (int i = 0; i <= k; ++i) EXPECT_EQ(segment[i], 1000 * std::int64_t{k} + i) << k << " " << i;
  }
  EXPECT_EQ(window.shared_pointer(r), window.local());
  window.unlock_all();
  node.barrier();
}

TEST(Window, SharedPointerNeedsASharedWindow) {
  auto world = Comm::world();
  Window window(world, 8, 1);
  EXPECT_THROW(window.shared_pointer(0), InternalError);
}

// ------------------------------------------------------------------------------------------- errors

TEST(CommErrors, InvalidBroadcastRootBecomesInternalError) {
  auto world = Comm::world();
  std::string text = "x";
  try {
    world.broadcast(text, world.size());  // every rank sees the bad root locally: nobody blocks
    ADD_FAILURE() << "no exception";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MPI_Bcast"), std::string::npos) << what;
    EXPECT_NE(what.find("core/comm.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("MPI_ERR_ROOT"), std::string::npos) << what;
    EXPECT_EQ(e.context("rank"), std::to_string(world.rank())) << what;
    EXPECT_EQ(e.kind(), ErrorKind::internal);
  }
  world.barrier();
}

TEST(CommErrors, CheckMacroNamesCallFileLineAndRank) {
  auto world = Comm::world();
  int size = 0;
  try {
    TESSERA_MPI_CHECK(MPI_Comm_size(MPI_COMM_NULL, &size));
    ADD_FAILURE() << "no exception";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("rank " + std::to_string(world.rank()) + ": MPI_Comm_size(MPI_COMM_NULL, &size) failed (", 0),
              0u)
        << what;
    EXPECT_NE(what.find("test_comm.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("MPI_ERR_COMM"), std::string::npos) << what;
  }
}

TEST(CommErrors, InvalidWindowTargetBecomesInternalError) {
  auto world = Comm::world();
  Window window(world, 8, 8);
  EXPECT_THROW(window.lock(world.size(), false), InternalError);  // windows have their own error handler
  world.barrier();
}

// ------------------------------------------------------------------------------------------- progress

// Runs with logging off: the non-terminal final line would only clutter the test output.
class MpiProgress : public ::testing::Test {
 protected:
  void SetUp() override {
    level_ = spdlog::get_level();
    spdlog::set_level(spdlog::level::off);
  }
  void TearDown() override { spdlog::set_level(level_); }
  spdlog::level::level_enum level_ = spdlog::level::info;
};

ProgressOptions quiet_options() {
  ProgressOptions options;
  options.label = "test";
  options.unit = "tiles";
  options.force_terminal = 0;
  return options;
}

TEST_F(MpiProgress, JobWideTotalIsTheSumOfAllAdvances) {
  auto world = Comm::world();
  const std::int64_t n = world.size();
  const std::int64_t r = world.rank();
  // Rank r advances 10*(r+1) times by one, then once by r.
  const std::int64_t total = 10 * n * (n + 1) / 2 + n * (n - 1) / 2;
  Progress progress(world, total, quiet_options());
  for (std::int64_t i = 0; i < 10 * (r + 1); ++i) progress.advance();
  progress.advance(r);
  EXPECT_EQ(progress.finish(), total);
  EXPECT_EQ(progress.finish(), total);  // a second finish returns the same count
  progress.advance(5);                  // ignored after finish
  EXPECT_EQ(progress.finish(), total);
}

TEST_F(MpiProgress, PublishesWhileRunningAndInSequence) {
  auto world = Comm::world();
  // Unknown total, and an advance after the publish interval so that counts also travel mid-run.
  {
    Progress first(world, 0, quiet_options());
    first.advance(3);
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    first.advance(4);
    EXPECT_EQ(first.finish(), 7 * world.size());
  }
  // Two live objects, created and destroyed in the same order on every rank.
  Progress a(world, 0, quiet_options());
  Progress b(world, 0, quiet_options());
  a.advance(world.rank());
  b.advance(2);
  EXPECT_EQ(b.finish(), 2 * world.size());
  EXPECT_EQ(a.finish(), std::int64_t{world.size()} * (world.size() - 1) / 2);
}

}  // namespace
}  // namespace tessera::core
