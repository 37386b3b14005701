#include "core/error.h"

#include <gtest/gtest.h>

namespace tessera::core {
namespace {

TEST(Error, ContextIsRenderedOutermostFirst) {
  InputError e("cannot read tile", "a.svs");
  e.add_context("region", "(0, 512, 256x256)").add_context("level", 2);
  // The file was attached first (innermost), the level last (outermost): outermost renders first.
  EXPECT_STREQ(e.what(), "level 2, region '(0, 512, 256x256)', file 'a.svs': cannot read tile");
  EXPECT_EQ(e.message(), "cannot read tile");
  EXPECT_EQ(e.context("file"), "a.svs");
  EXPECT_EQ(e.context("level"), "2");
  EXPECT_EQ(e.context("missing"), "");
}

TEST(Error, ConfigErrorNamesFileLineAndKey) {
  ConfigError e("unknown key", "job.yaml", 4, "tile.sise");
  EXPECT_STREQ(e.what(), "file 'job.yaml', line 4, key 'tile.sise': unknown key");
  EXPECT_EQ(e.kind(), ErrorKind::config);
  EXPECT_EQ(e.line(), 4);
  ConfigError no_line("bad value", "", 0, "seed");
  EXPECT_STREQ(no_line.what(), "key 'seed': bad value");
  // A command-line source names itself, key included.
  ConfigError flag("must be at least 1, got 0", "--batch", 0, "infer.batch_size");
  EXPECT_STREQ(flag.what(), "--batch: must be at least 1, got 0");
  EXPECT_EQ(flag.key(), "infer.batch_size");
  ConfigError set("unknown key", "--set tile.sise=3", 0, "tile.sise");
  EXPECT_STREQ(set.what(), "--set tile.sise=3: unknown key");
}

TEST(Error, KindsMapToDocumentedExitCodes) {
  EXPECT_EQ(exit_code_for(ErrorKind::usage), 2);
  EXPECT_EQ(exit_code_for(ErrorKind::config), 2);
  EXPECT_EQ(exit_code_for(ErrorKind::input), 3);
  EXPECT_EQ(exit_code_for(ErrorKind::internal), 1);
  EXPECT_EQ(exit_code_for(ErrorKind::interrupted), 75);
  EXPECT_EQ(FileNotFoundError("x.tif").kind(), ErrorKind::input);
  EXPECT_STREQ(FileNotFoundError("x.tif").what(), "file 'x.tif': file not found");
}

TEST(Error, ContextAddedWhileUnwindingIsKept) {
  try {
    try {
      throw InputError("truncated", "s.h5");
    } catch (Error& e) {
      e.add_context("shard", 3);
      throw;
    }
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "shard 3, file 's.h5': truncated");
    EXPECT_EQ(e.file(), "s.h5");
  }
}

TEST(Error, CheckErrnoThrowsWithTheSystemMessage) {
  errno = ENOENT;
  EXPECT_THROW(check_errno(false, "open x"), InternalError);
  EXPECT_NO_THROW(check_errno(true, "open x"));
  errno = ENOENT;
  try {
    check_errno(false, "open x");
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("open x: No such file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::core
