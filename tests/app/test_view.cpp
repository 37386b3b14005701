// `tessera view` as a user runs it: --list prints the index (what each slide shows, the errors of those that cannot
// be shown) and exits, so these need no server; the server itself is tested in tests/viewer and in a browser.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;
using testing::contains;
using testing::run;

TEST(View, RealSlidesAloneAreListedAndTheCorruptOnesWithTheirErrors) {
  const fs::path real = testing::shared_data_dir() / "real-slides";
  if (!fs::exists(real / "cmu-1-small-region.svs")) {
    GTEST_SKIP() << "no real data at " << real << " (../shared/data is absent)";
  }
  const auto r =
      run("view --list '" + real.string() + "/*.svs' '" + real.string() + "/*.tiff' '" + real.string() + "/*.ndpi'");
  EXPECT_EQ(r.code, 3) << r.out << r.err;  // some slides cannot be shown
  EXPECT_TRUE(contains(r.out, "7 slides")) << r.out;
  EXPECT_TRUE(contains(r.out, "cmu-1-small-region       2220x2967 px, slide only")) << r.out;
  EXPECT_TRUE(contains(r.out, "fluorescence-dapi        3968x4864 px, slide only")) << r.out;
  EXPECT_TRUE(contains(r.out, "Bogus marker length")) << r.out;
  EXPECT_TRUE(contains(r.out, "Unsupported TIFF compression: 52479")) << r.out;
  EXPECT_TRUE(contains(r.out, "broken.svs': unsupported slide format")) << r.out;
}

TEST(View, AFolderWithoutInferOutputsIsOneErrorNamingIt) {
  const testing::TempDir tmp;
  const auto r = run("view --list '" + tmp.path().string() + "'");
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(contains(r.err, tmp.path().string())) << r.err;
  EXPECT_TRUE(contains(r.err, "no tessera infer outputs")) << r.err;
}

TEST(View, BadFlagsAreUsageErrors) {
  EXPECT_EQ(run("view --port 70000 somewhere").code, 2);
  EXPECT_EQ(run("view --cache-mb 1 somewhere").code, 2);
  EXPECT_EQ(run("view").code, 2);
}

}  // namespace
}  // namespace tessera
