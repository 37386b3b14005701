// What every fuzz target shares: the input as a file (the readers under test take a path), and the rule that
// bad input is reported as an input or configuration error, never as anything else.
//
// A target is one LLVMFuzzerTestOneInput per <name>_fuzzer.cpp. The same source is compiled twice: for libFuzzer
// in the fuzz build (TESSERA_FUZZ, clang), and for fuzz_replay in the normal build, which renames the entry point
// (fuzz/CMakeLists.txt) and replays fuzz/regressions/ and fuzz/corpus/ as a CTest test.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace tessera::fuzz {

// One in-memory file (memfd) per process, rewritten for every input: no disk traffic, nothing left behind, and a
// path (/proc/self/fd/N) that libtiff, pugixml and std::ifstream open like any other file.
class InputFile {
 public:
  static InputFile& instance() {
    static InputFile file;
    return file;
  }

  // Replaces the file's contents with `data` and returns its path.
  const std::string& write(const std::uint8_t* data, std::size_t size) {
    if (::ftruncate(fd_, 0) != 0) die("ftruncate");
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) die("pwrite");
      done += static_cast<std::size_t>(n);
    }
    return path_;
  }

 private:
  InputFile() : fd_(::memfd_create("tessera-fuzz-input", 0)) {
    if (fd_ < 0) die("memfd_create");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  [[noreturn]] static void die(const char* what) {
    std::perror(what);
    std::abort();
  }

  int fd_;
  std::string path_;
};

// Runs `parse`; the errors a reader may give for bad input (InputError, ConfigError) are the expected outcome. Any
// other exception (InternalError, an uncaught library exception such as nlohmann's type_error, std::bad_alloc)
// escapes, and libFuzzer reports it as a crash: bad input must never look like a bug of Tessera.
template <typename Parse>
void expect_input_errors(Parse&& parse) {
  try {
    parse();
  } catch (const core::InputError& e) {
    // Every input error names its file.
    if (e.file().empty()) {
      std::fprintf(stderr, "input error without a file: %s\n", e.what());
      std::abort();
    }
  } catch (const core::ConfigError&) {
  }
}

}  // namespace tessera::fuzz
