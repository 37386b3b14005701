// core/hosts.h: the ranks-per-host line every job of several ranks logs, under 1, 2 and 4 ranks (and across the
// test hosts: the `network.mpi` test runs this program on 2 hosts).
#include <unistd.h>

#include <array>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "core/comm.h"
#include "core/hosts.h"

namespace tessera::core {
namespace {

TEST(RankRuns, ConsecutiveRanksBecomeRuns) {
  EXPECT_EQ(rank_runs({}), "");
  EXPECT_EQ(rank_runs({5}), "5");
  EXPECT_EQ(rank_runs({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(rank_runs({0, 2, 4, 5}), "0,2,4-5");
}

TEST(Hosts, EveryHostIsNamedWithItsRanks) {
  const Comm world = Comm::world();
  std::array<char, 256> name{};
  ASSERT_EQ(gethostname(name.data(), name.size() - 1), 0);
  const auto names = world.allgather_bytes(name.data());
  const HostMap map = describe_hosts(world);
  if (!world.is_root()) {
    EXPECT_EQ(map.hosts, 0);
    EXPECT_TRUE(map.text.empty());
    return;
  }
  const std::set<std::string> distinct(names.begin(), names.end());
  EXPECT_EQ(map.hosts, static_cast<int>(distinct.size()));
  // One "host: rank(s) ..." part per host, rank 0's host first.
  EXPECT_EQ(map.text.rfind(names[0] + ": rank", 0), 0u) << map.text;
  std::size_t parts = 1;
  for (std::size_t at = map.text.find("; "); at != std::string::npos; at = map.text.find("; ", at + 2)) ++parts;
  EXPECT_EQ(parts, distinct.size()) << map.text;
  for (const auto& host : distinct) EXPECT_NE(map.text.find(host + ": rank"), std::string::npos) << map.text;
  if (distinct.size() == 1) {
    const int last = world.size() - 1;
    EXPECT_EQ(map.text, last == 0 ? names[0] + ": rank 0" : names[0] + ": ranks 0-" + std::to_string(last));
  }
}

}  // namespace
}  // namespace tessera::core
