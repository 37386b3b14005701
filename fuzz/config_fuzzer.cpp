// The YAML job loader (core/config.h): Config::parse against a real job's schema (tessera train's: every value type,
// bounds, allowed values, nested sections), then `--set` overrides, then the effective config as YAML.
//
// Input: the job's YAML text, then optionally overrides after NUL bytes ("yaml\0train.epochs=3\0model.x=y").
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "engine/trainer.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t end = input.find('\0');
  const std::string yaml = input.substr(0, end);
  std::vector<std::string> overrides;
  for (std::size_t at = end; at != std::string::npos && at < input.size();) {
    const std::size_t next = input.find('\0', at + 1);
    overrides.push_back(input.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1));
    at = next;
  }
  fuzz::expect_input_errors([&] {
    const core::Config config = core::Config::parse(engine::train_schema(), yaml, "job.yaml", overrides);
    // What --print-config prints and what every job saves: must render whatever was accepted.
    (void)config.to_yaml();
  });
  return 0;
}
