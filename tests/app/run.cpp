#include "tests/app/run.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "core/comm.h"
#include "core/hash.h"
#include "io/shard.h"
#include "tests/testing/testing.h"

namespace tessera::testing {
namespace {

// Runs a shell command line, stdout and stderr captured.
Run run_command(const std::string& line) {
  TempDir tmp;
  const std::string err_file = tmp.file("stderr.txt");
  const std::string command = line + " 2>" + err_file;
  Run r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  for (std::size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) r.out.append(buffer, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  r.err = s.str();
  return r;
}

Run run_with(const std::string& prefix, const std::string& args) {
  return run_command(prefix + std::string(TESSERA_BIN) + " " + args);
}

}  // namespace

Run run(const std::string& args) { return run_with("", args); }

Run run_alone(const std::string& args) {
  std::string prefix = "env";
  for (const char* name : core::launcher_variables()) prefix += std::string(" -u ") + name;
  return run_with(prefix + " ", args);
}

Run run_mpi(int ranks, const std::string& args) {
  return run_with(
      std::string(TESSERA_MPIEXEC) + " -n " + std::to_string(ranks) + " --oversubscribe --allow-run-as-root ", args);
}

Run run_script(const std::string& script) {
  TempDir tmp;
  const std::string file = tmp.file("script.sh");
  std::ofstream(file) << script;
  return run_command(std::string("TESSERA=") + TESSERA_BIN + " MPIEXEC='" + TESSERA_MPIEXEC +
                     " --oversubscribe --allow-run-as-root' sh " + file);
}

std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path, const std::string& kind) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == kind) lines.push_back(std::move(j));
  }
  return lines;
}

std::map<ShardTileKey, std::uint64_t> shard_tiles(const std::filesystem::path& folder) {
  const auto manifest = io::read_manifest((folder / "manifest.json").string());
  std::map<ShardTileKey, std::uint64_t> tiles;
  for (const auto& s : manifest.shards) {
    const auto shard = io::ShardFile::open((folder / s.file).string());
    std::vector<std::uint8_t> pixels(shard.tile_bytes());
    for (std::int64_t i = 0; i < shard.size(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      shard.read_images(i, 1, pixels.data());
      const ShardTileKey key{shard.slides()[shard.slide_indices()[k]], shard.coords()[2 * k], shard.coords()[2 * k + 1],
                             shard.labels()[k]};
      EXPECT_TRUE(tiles.emplace(key, core::fnv1a(pixels.data(), pixels.size())).second)
          << "tile twice: " << std::get<0>(key) << " (" << std::get<1>(key) << ", " << std::get<2>(key) << ")";
    }
  }
  return tiles;
}

}  // namespace tessera::testing
