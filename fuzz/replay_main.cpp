// fuzz_replay: runs fuzz inputs through the fuzz targets outside libFuzzer, in the normal build (fuzz/CMakeLists.txt
// compiles every <name>_fuzzer.cpp a second time for it, its LLVMFuzzerTestOneInput renamed tessera_fuzz_<name>).
//
//   fuzz_replay <target> <file or folder>...
//
// Every file (folders: every file under them, in name order) goes through the target once. A crash aborts, which
// fails the CTest test; a run that found no input at all fails too, so that a moved folder is noticed.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using Target = int (*)(const std::uint8_t*, std::size_t);

#define TESSERA_FUZZ_TARGETS(X) \
  X(config)                     \
  X(asap_xml)                   \
  X(geojson)                    \
  X(dataset_csv)                \
  X(detections_csv)             \
  X(manifest)                   \
  X(tiff)                       \
  X(dicom)

#define TESSERA_DECLARE(name) extern "C" int tessera_fuzz_##name(const std::uint8_t*, std::size_t);
TESSERA_FUZZ_TARGETS(TESSERA_DECLARE)
#undef TESSERA_DECLARE

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  struct Named {
    const char* name;
    Target run;
  };
#define TESSERA_ENTRY(name) {#name, tessera_fuzz_##name},
  const std::vector<Named> targets = {TESSERA_FUZZ_TARGETS(TESSERA_ENTRY)};
#undef TESSERA_ENTRY
  const auto usage = [&] {
    std::fprintf(stderr, "usage: fuzz_replay <target> <file or folder>...\ntargets:");
    for (const auto& t : targets) std::fprintf(stderr, " %s", t.name);
    std::fprintf(stderr, "\n");
    return 2;
  };
  if (argc < 3) return usage();
  const auto target =
      std::find_if(targets.begin(), targets.end(), [&](const Named& t) { return t.name == std::string(argv[1]); });
  if (target == targets.end()) return usage();

  std::vector<fs::path> files;
  for (int i = 2; i < argc; ++i) {
    const fs::path arg(argv[i]);
    if (fs::is_directory(arg)) {
      for (const auto& entry : fs::recursive_directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else if (fs::is_regular_file(arg)) {
      files.push_back(arg);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "fuzz_replay %s: no input files\n", target->name);
    return 1;
  }
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.eof() && in.fail()) {
      std::fprintf(stderr, "fuzz_replay: cannot read %s\n", file.c_str());
      return 1;
    }
    std::printf("%s: %s (%zu bytes)\n", target->name, file.c_str(), bytes.size());
    std::fflush(stdout);  // the last input named is the one that crashed
    target->run(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%zu inputs replayed through %s, no crash\n", files.size(), target->name);
  return 0;
}
