// analysis/infer_outputs.h: what decides whether an earlier infer run's outputs of a slide can be kept.
#include "analysis/infer_outputs.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/config.h"
#include "io/slide_list.h"
#include "tests/testing/testing.h"

namespace tessera::analysis {
namespace {

const core::Schema& schema() {
  static const core::Schema instance = [] {
    core::Schema s;
    io::declare_input_keys(s)
        .string("output", "infer", "Folder")
        .integer("infer.stride", 0, "Stride", 0, 65536)
        .integer("infer.threads", 0, "Threads", 0, 1024)
        .string("infer.distribute", "auto", "Distribution", {"auto", "slides", "tiles"});
    return s;
  }();
  return instance;
}

// infer.distribute auto: the slides that dwarf the rest are split, the rule applied again to the slides left, and all
// of them once fewer are left than ranks.
TEST(InferSlidesToSplit, TheSlidesThatDwarfTheRestAndAllOnceFewerAreLeftThanRanks) {
  EXPECT_EQ(slides_to_split({25, 25, 25, 25}, 2), 0u) << "alike: every slide whole";
  EXPECT_EQ(slides_to_split({50, 30, 20}, 2), 0u) << "half, not more: whole";
  EXPECT_EQ(slides_to_split({60, 30, 5, 5}, 2), 2u) << "the 30 is more than half of the 40 left";
  EXPECT_EQ(slides_to_split({60, 10, 10, 10, 10}, 2), 1u);
  EXPECT_EQ(slides_to_split({40, 20, 20, 20}, 3), 1u) << "40 of 100 > a third; then 20 of 60 is a third, not more";
  EXPECT_EQ(slides_to_split({70, 10, 10, 10}, 4), 4u) << "3 left on 4 ranks: all split, no rank without a slide";
  EXPECT_EQ(slides_to_split({10, 10, 10}, 4), 3u) << "fewer slides than ranks from the start";
  EXPECT_EQ(slides_to_split({0, 0}, 2), 0u) << "missing files: nothing to split by";
  EXPECT_EQ(slides_to_split({}, 2), 0u);
}

TEST(InferJobKey, TheSlidesTheFolderTheThreadsAndTheDistributionChangeNoSlidesOutputsButTheSettingsDo) {
  testing::TempDir dir;
  const std::string checkpoint = dir.file("checkpoint.h5");
  std::ofstream(checkpoint) << "weights";
  const auto key = [&](const std::string& yaml) {
    return infer_job_key(core::Config::parse(schema(), yaml, "job.yaml"), checkpoint);
  };
  const std::string base = key("input:\n  slides: [a.svs]\n");
  EXPECT_EQ(key("input:\n  slides: [a.svs, b.svs]\n"), base);
  EXPECT_EQ(key("input:\n  csv: d.csv\n  splits: [test]\n"), base);
  EXPECT_EQ(key("output: elsewhere\ninfer:\n  threads: 2\n"), base);
  EXPECT_EQ(key("infer:\n  distribute: slides\n"), base);
  EXPECT_EQ(key("infer:\n  distribute: tiles\n"), base);
  EXPECT_NE(key("infer:\n  stride: 48\n"), base);
  std::ofstream(checkpoint) << " retrained";
  EXPECT_NE(key("input:\n  slides: [a.svs]\n"), base) << "another checkpoint file";
}

}  // namespace
}  // namespace tessera::analysis
