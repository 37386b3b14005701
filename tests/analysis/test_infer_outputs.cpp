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
