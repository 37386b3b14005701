// The detections file: the one Detection type, its writer (infer) and reader (evaluate).
#include "analysis/detections.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/testing/testing.h"

namespace tessera::analysis {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ReadDetections, PlainRowsOrHeaderAndClearErrors) {
  testing::TempDir dir;
  std::ofstream(dir.file("plain.csv")) << "0.9,1000,2000\n0.25, 12.5 ,7\n\n";
  const auto plain = read_detections(dir.file("plain.csv"));
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[0].p, 0.9);
  EXPECT_EQ(plain[0].x, 1000);
  EXPECT_EQ(plain[1].x, 12.5);
  EXPECT_EQ(plain[1].y, 7);
  std::ofstream(dir.file("header.csv")) << "X,Y,probability\r\n10,20,0.5\r\n";
  const auto header = read_detections(dir.file("header.csv"));
  ASSERT_EQ(header.size(), 1u);
  EXPECT_EQ(header[0].p, 0.5);
  EXPECT_EQ(header[0].x, 10);
  EXPECT_EQ(header[0].y, 20);
  std::ofstream(dir.file("empty.csv")) << "";
  EXPECT_TRUE(read_detections(dir.file("empty.csv")).empty());

  const auto message = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.file(name)) << text;
    try {
      read_detections(dir.file(name));
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.file(), dir.file(name));
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("short.csv", "0.5,1,2\n0.4,3\n").find("line 2"), std::string::npos);
  EXPECT_NE(message("text.csv", "0.5,1,2\n0.4,abc,2\n").find("line 2"), std::string::npos);
  EXPECT_NE(message("range.csv", "1.5,1,2\n").find("outside [0, 1]"), std::string::npos);
  EXPECT_NE(message("nan.csv", "nan,1,2\n").find("line 1"), std::string::npos);
  EXPECT_NE(message("names.csv", "a,b,c\n").find("header"), std::string::npos);
  EXPECT_THROW(read_detections(dir.file("missing.csv")), core::FileNotFoundError);
}

TEST(WriteDetections, WritesWhatTheReaderReadsBack) {
  testing::TempDir dir;
  const std::vector<Detection> written = {{0.987654321, 1024, 2048}, {0.5, 0, 7}, {0.0001, 33, 44}};
  write_detections_csv(dir.file("d.csv"), written);
  EXPECT_EQ(read_text(dir.file("d.csv")), "0.987654,1024,2048\n0.500000,0,7\n0.000100,33,44\n");
  const auto read = read_detections(dir.file("d.csv"));
  ASSERT_EQ(read.size(), written.size());
  for (std::size_t i = 0; i < read.size(); ++i) {
    EXPECT_NEAR(read[i].p, written[i].p, 5e-7);
    EXPECT_EQ(read[i].x, written[i].x);
    EXPECT_EQ(read[i].y, written[i].y);
  }
  write_detections_csv(dir.file("none.csv"), {});
  EXPECT_TRUE(read_detections(dir.file("none.csv")).empty());
}

}  // namespace
}  // namespace tessera::analysis
