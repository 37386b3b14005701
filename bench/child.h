// Child processes of `tessera bench`: the benchmarks that measure whole jobs run this program (or mpirun, or
// Python) as a child, timed and measured from outside, as a user's run would be. Shared by bench_tile.cpp,
// bench_comm.cpp and bench_infer_slide.cpp.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::bench {

struct ChildResult {
  int code = -1;             // exit code; -1: killed by a signal or stopped
  bool timed_out = false;    // stopped after the timeout
  double seconds = 0.0;      // wall time from the spawn to the exit
  double cpu_seconds = 0.0;  // user + system, the child and the descendants it waited for (mpirun's ranks)
  long max_rss_kb = 0;       // ru_maxrss: the largest peak RSS among the child and the descendants it waited for
};

// Runs `args` (args[0] a path, or a name looked up in PATH) with stdout and stderr appended to `log` after a
// "$ <command line>" line, waits and measures it. With `timeout_seconds` > 0 the child runs in a process group
// of its own, which is stopped (SIGTERM, then SIGKILL) after that time: a hung mpirun goes with its ranks.
// InternalError when the program cannot be started.
ChildResult run_child(const std::vector<std::string>& args, const std::string& log, double timeout_seconds = 0.0);

// The lines the last run logged in `log` (those after its "$ <command line>" line) that start with `prefix`, the
// rest of each parsed as JSON; a line cut off by a crash is left out.
std::vector<nlohmann::json> result_lines(const std::string& log, const std::string& prefix);

// InternalError "<what> failed with exit code N; see <log>" (or "was stopped after ... s") unless `r` succeeded.
void require_ok(const ChildResult& r, const std::string& what, const std::string& log);

// This process's environment without the variables of its own MPI job (the children's environment).
std::vector<std::string> child_environment();

std::optional<std::string> find_in_path(const std::string& program);

// The CPU's model name from /proc/cpuinfo, or "an unknown CPU".
std::string cpu_name();

// The vector instruction sets of the CPU that oneDNN's kernels use, from /proc/cpuinfo's flags, e.g. "AVX2 AVX-512
// AVX-512-VNNI AVX-512-BF16 AMX", or "unknown".
std::string cpu_isa();

// "0.52 0.71 0.80" (1, 5 and 15 minutes), or "unknown".
std::string load_average();

// This program's path (to run it as a child).
std::string self_path();

}  // namespace tessera::bench
