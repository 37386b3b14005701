// Atomic publishing (core/atomic_file.h): a reader sees the old file or the new one; failures leave nothing behind.
#include "core/atomic_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/testing/testing.h"

namespace tessera::core {
namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int files_in(const std::string& folder) {
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(folder)) ++files;
  return files;
}

TEST(AtomicFile, WriteReplacesAndLeavesNoTemporary) {
  testing::TempDir dir;
  write_file_atomic(dir.file("a.txt"), "first");
  write_file_atomic(dir.file("a.txt"), "second");
  EXPECT_EQ(read_text(dir.file("a.txt")), "second");
  write_file_atomic(dir.file("empty.txt"), "");
  EXPECT_EQ(read_text(dir.file("empty.txt")), "");
  EXPECT_EQ(files_in(dir.path().string()), 2);
}

TEST(AtomicFile, AWriteIntoAMissingFolderIsAnInternalErrorNamingTheFile) {
  testing::TempDir dir;
  try {
    write_file_atomic(dir.file("missing/a.txt"), "x");
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("missing/a.txt")), std::string::npos) << e.what();
  }
  EXPECT_EQ(files_in(dir.path().string()), 0);
}

TEST(AtomicFile, AWriterThatFailsLeavesTheOldFileAndNoTemporary) {
  testing::TempDir dir;
  write_file_atomic(dir.file("a.txt"), "old");
  EXPECT_THROW(write_atomic(dir.file("a.txt"),
                            [](const std::string& temporary) {
                              std::ofstream(temporary) << "half";
                              throw std::runtime_error("the library failed");
                            }),
               std::runtime_error);
  EXPECT_EQ(read_text(dir.file("a.txt")), "old");
  EXPECT_EQ(files_in(dir.path().string()), 1);
}

TEST(AtomicFile, AWriterWritesUnderTheTemporaryNameAndIsPublished) {
  testing::TempDir dir;
  std::string seen;
  write_atomic(dir.file("b.bin"), [&](const std::string& temporary) {
    seen = temporary;
    EXPECT_FALSE(fs::exists(dir.file("b.bin")));
    std::ofstream(temporary) << "new";
  });
  EXPECT_EQ(seen, temporary_name(dir.file("b.bin")));
  EXPECT_EQ(read_text(dir.file("b.bin")), "new");
  EXPECT_EQ(files_in(dir.path().string()), 1);
}

TEST(AtomicFile, AWriterThatWritesNothingIsAnInternalError) {
  testing::TempDir dir;
  EXPECT_THROW(write_atomic(dir.file("c.bin"), [](const std::string&) {}), InternalError);
  EXPECT_EQ(files_in(dir.path().string()), 0);
}

// A file put piece by piece is their concatenation, published only at the end; pieces past the write buffer (1 MiB)
// reach the temporary file while the old file stays as it was, and a writer that throws then leaves only the old.
TEST(AtomicFile, AStreamIsTheConcatenationOfItsPiecesAndFailsWithoutLeftovers) {
  testing::TempDir dir;
  write_file_atomic(dir.file("s.txt"), "old");
  std::string expected;
  const auto put_pieces = [&](const Put& put) {
    for (int i = 0; i < 3000; ++i) {
      const std::string piece = std::to_string(i) + std::string(1000, static_cast<char>('a' + i % 26)) + "\n";
      put(piece);
      expected += piece;
    }
  };
  EXPECT_THROW(write_atomic_stream(dir.file("s.txt"),
                                   [&](const Put& put) {
                                     put_pieces(put);
                                     EXPECT_GE(fs::file_size(temporary_name(dir.file("s.txt"))), std::size_t{1} << 20);
                                     EXPECT_EQ(read_text(dir.file("s.txt")), "old");
                                     throw std::runtime_error("the generator failed");
                                   }),
               std::runtime_error);
  EXPECT_EQ(read_text(dir.file("s.txt")), "old");
  EXPECT_EQ(files_in(dir.path().string()), 1);
  expected.clear();
  write_atomic_stream(dir.file("s.txt"), [&](const Put& put) {
    put("");
    put_pieces(put);
  });
  EXPECT_EQ(read_text(dir.file("s.txt")), expected);
  write_atomic_stream(dir.file("empty.txt"), [](const Put&) {});
  EXPECT_EQ(read_text(dir.file("empty.txt")), "");
  EXPECT_EQ(files_in(dir.path().string()), 2);
  EXPECT_THROW(write_atomic_stream(dir.file("missing/s.txt"), put_pieces), InternalError);
}

}  // namespace
}  // namespace tessera::core
