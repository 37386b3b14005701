// core/output_dir.h in one process: the lock excludes a second holder (flock locks belong to open file descriptions,
// so two acquisitions in one process exclude each other as two jobs do), names the holder, is free again once
// released; unusable output paths are usage errors naming the path.
#include "core/output_dir.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/testing/testing.h"

namespace tessera::core {
namespace {

namespace fs = std::filesystem;

std::string usage_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.message();
  }
  return "(no UsageError)";
}

TEST(OutputLock, ASecondHolderIsRefusedNamingTheFirstUntilItLetsGo) {
  testing::TempDir dir;
  const std::string out = dir.file("out");
  {
    const OutputLock first = OutputLock::acquire(out, "tile");
    EXPECT_TRUE(first.held());
    EXPECT_TRUE(fs::exists(out + "/" + output_lock_name)) << "the folder is created";
    const std::string message = usage_error_of([&] { OutputLock::acquire(out, "infer"); });
    EXPECT_EQ(message.rfind("output folder '" + out + "' is in use by another Tessera job (tessera tile, pid " +
                                std::to_string(::getpid()) + " on host ",
                            0),
              0u)
        << message;
    EXPECT_NE(message.find("): wait for it to end or write elsewhere"), std::string::npos) << message;
    // The refused attempt leaves the holder's record as it was.
    std::ifstream in(out + "/" + output_lock_name);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.rfind("tessera tile, pid ", 0), 0u) << text;
  }
  const OutputLock again = OutputLock::acquire(out, "infer");
  EXPECT_TRUE(again.held());
}

TEST(OutputLock, AMovedLockStaysHeld) {
  testing::TempDir dir;
  OutputLock moved;
  {
    OutputLock first = OutputLock::acquire(dir.file("out"), "tile");
    moved = std::move(first);
  }
  EXPECT_TRUE(moved.held());
  EXPECT_NE(usage_error_of([&] { OutputLock::acquire(dir.file("out"), "tile"); }).find("is in use"), std::string::npos);
}

TEST(OutputFolder, AFileInThePathIsAUsageErrorNamingIt) {
  testing::TempDir dir;
  const std::string file = dir.file("file");
  std::ofstream(file) << "x";
  EXPECT_EQ(usage_error_of([&] { prepare_output_folder(file); }),
            "output folder '" + file + "' is a file, not a folder");
  EXPECT_EQ(usage_error_of([&] { prepare_output_folder(file + "/sub"); }),
            "output folder '" + file + "/sub': a part of the path is a file, not a folder");
  EXPECT_EQ(usage_error_of([&] { prepare_output_file(dir.path().string()); }),
            "output file '" + dir.path().string() + "' is a folder, not a file");
  EXPECT_EQ(usage_error_of([&] { prepare_output_file(file + "/p.csv"); }),
            "cannot write the output file '" + file + "/p.csv': output folder '" + file + "' is a file, not a folder");
  EXPECT_EQ(usage_error_of([&] { prepare_output_folder(""); }),
            "the output folder is empty (give --out or the job's 'output' key)");
}

TEST(OutputFolder, MissingFoldersAreCreated) {
  testing::TempDir dir;
  prepare_output_folder(dir.file("a/b/c"));
  EXPECT_TRUE(fs::is_directory(dir.file("a/b/c")));
  prepare_output_file(dir.file("d/e/p.csv"));
  EXPECT_TRUE(fs::is_directory(dir.file("d/e")));
  EXPECT_FALSE(fs::exists(dir.file("d/e/p.csv")));
}

}  // namespace
}  // namespace tessera::core
