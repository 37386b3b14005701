// Progress line formatting and logging set-up; single process, no MPI (this file is part of tessera_io_tests,
// whose main does not initialize MPI, so it never creates a Progress: the MPI side is in test_comm.cpp).
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"

namespace tessera::core {
namespace {

TEST(ProgressRender, BarRateAndEta) {
  // 1250 of 5000 in 4 s: 312.5/s, 3750 left -> 12 s; a quarter of 30 cells is 7 '=' then '>'.
  EXPECT_EQ(render_progress_line("tile", "tiles", 5000, 1250, 4.0, true),
            "tile [=======>                      ]  1250/5000 tiles  312.5 tiles/s  ETA 00:12");
}

TEST(ProgressRender, CountIsRightAlignedToTheTotal) {
  EXPECT_EQ(render_progress_line("tile", "tiles", 5000, 12, 2.0, true),
            "tile [>                             ]    12/5000 tiles  6.0 tiles/s  ETA 13:51");
}

TEST(ProgressRender, FullBarAndFinalLineShowsElapsed) {
  EXPECT_EQ(render_progress_line("tile", "tiles", 200, 200, 65.0, true, true),
            "tile [==============================]  200/200 tiles  3.1 tiles/s  elapsed 01:05");
  // Done but not final: nothing left, so the ETA is zero.
  EXPECT_EQ(render_progress_line("tile", "tiles", 200, 200, 65.0, true),
            "tile [==============================]  200/200 tiles  3.1 tiles/s  ETA 00:00");
}

TEST(ProgressRender, MoreThanTheTotalClampsTheBar) {
  EXPECT_EQ(render_progress_line("x", "items", 10, 15, 1.0, true),
            "x [==============================]  15/10 items  15.0 items/s  ETA 00:00");
}

TEST(ProgressRender, NoBarShowsPercentage) {
  EXPECT_EQ(render_progress_line("infer", "slides", 8, 3, 30.0, false),
            "infer 3/8 slides (37.5%)  0.1 slides/s  ETA 00:50");
}

TEST(ProgressRender, UnknownTotalHasNoBarAndNoEta) {
  EXPECT_EQ(render_progress_line("scan", "tiles", 0, 1234, 2.0, true), "scan 1234 tiles  617.0 tiles/s");
  EXPECT_EQ(render_progress_line("scan", "tiles", 0, 1234, 2.0, false), "scan 1234 tiles  617.0 tiles/s");
  EXPECT_EQ(render_progress_line("scan", "tiles", 0, 1234, 2.0, false, true),
            "scan 1234 tiles  617.0 tiles/s  elapsed 00:02");
}

TEST(ProgressRender, NothingDoneYetHasUnknownEta) {
  EXPECT_EQ(render_progress_line("tile", "tiles", 100, 0, 0.0, false),
            "tile 0/100 tiles (0.0%)  0.0 tiles/s  ETA --:--");
  EXPECT_EQ(render_progress_line("tile", "tiles", 100, 0, 3.0, true),
            "tile [>                             ]    0/100 tiles  0.0 tiles/s  ETA --:--");
}

TEST(ProgressRender, LongDurationsShowHours) {
  // 10 of 1000 in 100 s: 0.1/s, 990 left -> 9900 s = 2:45:00.
  EXPECT_EQ(render_progress_line("train", "steps", 1000, 10, 100.0, false),
            "train 10/1000 steps (1.0%)  0.1 steps/s  ETA 2:45:00");
}

TEST(ProgressRender, EmptyLabelHasNoLeadingSpace) {
  EXPECT_EQ(render_progress_line("", "items", 0, 5, 1.0, false), "5 items  5.0 items/s");
}

// ------------------------------------------------------------------------------------------- logging

class Logging : public ::testing::Test {
 protected:
  void TearDown() override { init_logging("info", 0, 1); }
};

TEST_F(Logging, AcceptsEveryDocumentedLevel) {
  const std::pair<const char*, spdlog::level::level_enum> cases[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug}, {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"error", spdlog::level::err},   {"off", spdlog::level::off},
  };
  for (const auto& [name, level] : cases) {
    EXPECT_NO_THROW(init_logging(name, 0, 1)) << name;
    EXPECT_EQ(spdlog::default_logger()->level(), level) << name;
  }
}

TEST_F(Logging, RejectsUnknownLevelListingTheValidOnes) {
  init_logging("warn", 0, 1);
  for (const char* bad : {"verbose", "INFO", "warning", ""}) {
    try {
      init_logging(bad, 0, 1);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("trace, debug, info, warn, error, off"), std::string::npos) << what;
      EXPECT_EQ(e.kind(), ErrorKind::usage);
    }
  }
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::warn);  // a bad name changes nothing
}

TEST_F(Logging, RankPrefixOnlyWithSeveralRanks) {
  init_logging("info", 2, 4);
  ::testing::internal::CaptureStderr();
  spdlog::info("hello");
  spdlog::debug("hidden at info level");
  spdlog::default_logger()->flush();
  std::string several = ::testing::internal::GetCapturedStderr();

  init_logging("info", 0, 1);
  ::testing::internal::CaptureStderr();
  spdlog::warn("alone");
  spdlog::default_logger()->flush();
  std::string single = ::testing::internal::GetCapturedStderr();

  EXPECT_NE(several.find("] [info] [rank 2/4] hello\n"), std::string::npos) << several;
  EXPECT_EQ(several.find("hidden"), std::string::npos) << several;
  EXPECT_EQ(several.front(), '[') << several;
  EXPECT_NE(single.find("] [warning] alone\n"), std::string::npos) << single;
  EXPECT_EQ(single.find("rank"), std::string::npos) << single;
}

}  // namespace
}  // namespace tessera::core
