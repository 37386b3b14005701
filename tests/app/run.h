// Running the `tessera` program from tests, as a user would: output, exit code.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::testing {

struct Run {
  int code = -1;
  std::string out;
  std::string err;
};

// `tessera args` through the shell; stdout and stderr captured separately.
Run run(const std::string& args);
// The same as a process that no launcher started: the variables of core::launcher_variables() unset, whatever the
// environment the tests run in (a shell under srun, sbatch or mpirun).
Run run_alone(const std::string& args);
// The same under `mpirun -n ranks --oversubscribe`.
Run run_mpi(int ranks, const std::string& args);

// A POSIX shell script, with $TESSERA (the program) and $MPIEXEC (mpirun with --oversubscribe
// --allow-run-as-root) set: for what one command cannot say, such as killing a job mid-run.
Run run_script(const std::string& script);

// The lines of a JSON-lines file (metrics.jsonl) whose "kind" is `kind`, in order.
std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path, const std::string& kind);

// Every tile of a shard folder (its manifest's shards), keyed by slide, x, y and label, with an FNV-1a checksum of
// its pixels; a tile found twice fails the calling test.
using ShardTileKey = std::tuple<std::string, std::int64_t, std::int64_t, int>;
std::map<ShardTileKey, std::uint64_t> shard_tiles(const std::filesystem::path& folder);

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace tessera::testing
