// Running the `tessera` program from tests, as a user would: output, exit code.
#pragma once

#include <filesystem>
#include <string>
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
// The same under `mpirun -n ranks --oversubscribe`.
Run run_mpi(int ranks, const std::string& args);

// A POSIX shell script, with $TESSERA (the program) and $MPIEXEC (mpirun with --oversubscribe
// --allow-run-as-root) set: for what one command cannot say, such as killing a job mid-run.
Run run_script(const std::string& script);

// The lines of a JSON-lines file (metrics.jsonl) whose "kind" is `kind`, in order.
std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path, const std::string& kind);

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace tessera::testing
