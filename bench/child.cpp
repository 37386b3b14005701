#include "bench/child.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

extern char** environ;

namespace tessera::bench {
namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

// How long a stopped child gets between SIGTERM and SIGKILL.
constexpr auto kTermGrace = std::chrono::seconds(5);

double cpu_seconds(const timeval& user, const timeval& system) {
  return static_cast<double>(user.tv_sec + system.tv_sec) + static_cast<double>(user.tv_usec + system.tv_usec) * 1e-6;
}

}  // namespace

// This process is an MPI singleton: Open MPI and PMIx left variables in its environment that would make a
// child `mpirun` (or a child singleton) try to join this process's job. Children get the environment without
// them (the run-as-root permissions stay).
std::vector<std::string> child_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    const bool mpi_runtime = var.rfind("OMPI_", 0) == 0 || var.rfind("PMIX_", 0) == 0 || var.rfind("OPAL_", 0) == 0 ||
                             var.rfind("ORTE_", 0) == 0;
    if (mpi_runtime && var.rfind("OMPI_ALLOW_RUN_AS_ROOT", 0) != 0) continue;
    env.push_back(var);
  }
  return env;
}

std::optional<std::string> find_in_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / program;
    if (access(candidate.c_str(), X_OK) == 0 && fs::is_regular_file(candidate)) return candidate.string();
  }
  return std::nullopt;
}

ChildResult run_child(const std::vector<std::string>& args, const std::string& log, double timeout_seconds) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  auto env_strings = child_environment();
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  { std::ofstream(log, std::ios::app) << "$ " << fmt::format("{}", fmt::join(args, " ")) << "\n"; }
  const bool watched = timeout_seconds > 0.0;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  if (watched) {
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);  // a group of its own: a hung mpirun is stopped with its ranks
  }
  pid_t pid = 0;
  const auto t0 = clock_type::now();
  const int rc = posix_spawnp(&pid, argv[0], &actions, &attributes, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (rc != 0) throw core::InternalError(fmt::format("cannot start {}: {}", args[0], std::strerror(rc)));

  // The watchdog signals the group only while the child is not yet reaped (at worst a zombie, whose pid, and so
  // the group id, cannot have been reused); the waiting below blocks, so the wall time has no polling delay.
  ChildResult result;
  std::mutex mutex;
  std::condition_variable exited;
  bool done = false;
  std::thread watchdog;
  if (watched) {
    watchdog = std::thread([&] {
      std::unique_lock lock(mutex);
      const auto limit = std::chrono::duration<double>(timeout_seconds);
      if (exited.wait_for(lock, limit, [&] { return done; })) return;
      result.timed_out = true;
      kill(-pid, SIGTERM);
      if (exited.wait_for(lock, kTermGrace, [&] { return done; })) return;
      kill(-pid, SIGKILL);
    });
  }
  siginfo_t info{};
  while (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
  }
  result.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  if (watched) {
    {
      std::lock_guard lock(mutex);
      done = true;
    }
    exited.notify_all();
    watchdog.join();
  }
  int status = 0;
  struct rusage usage {};
  while (wait4(pid, &status, 0, &usage) < 0) {
    if (errno != EINTR) throw core::InternalError(fmt::format("wait4 for {}: {}", args[0], std::strerror(errno)));
  }
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.cpu_seconds = cpu_seconds(usage.ru_utime, usage.ru_stime);
  result.max_rss_kb = usage.ru_maxrss;
  return result;
}

void require_ok(const ChildResult& r, const std::string& what, const std::string& log) {
  if (r.timed_out)
    throw core::InternalError(fmt::format("{} was stopped after {:.0f} s; see {}", what, r.seconds, log));
  if (r.code != 0) throw core::InternalError(fmt::format("{} failed with exit code {}; see {}", what, r.code, log));
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "an unknown CPU";
}

std::string cpu_isa() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
    static const std::pair<const char*, const char*> kKnown[] = {{"avx2", "AVX2"},
                                                                 {"avx512f", "AVX-512"},
                                                                 {"avx512_vnni", "AVX-512-VNNI"},
                                                                 {"avx512_bf16", "AVX-512-BF16"},
                                                                 {"amx_tile", "AMX"}};
    std::vector<std::string> found;
    for (const auto& [flag, name] : kKnown) {
      if (flags.count(flag) != 0) found.emplace_back(name);
    }
    return found.empty() ? std::string("no AVX2") : fmt::format("{}", fmt::join(found, " "));
  }
  return "unknown";
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  double one = 0, five = 0, fifteen = 0;
  if (!(in >> one >> five >> fifteen)) return "unknown";
  return fmt::format("{:.2f} {:.2f} {:.2f}", one, five, fifteen);
}

std::string self_path() { return fs::read_symlink("/proc/self/exe").string(); }

}  // namespace tessera::bench

namespace tessera::bench {

std::vector<nlohmann::json> result_lines(const std::string& log, const std::string& prefix) {
  std::ifstream in(log);
  std::vector<nlohmann::json> results;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("$ ", 0) == 0) {
      results.clear();
    } else if (line.rfind(prefix, 0) == 0) {
      try {
        results.push_back(nlohmann::json::parse(line.substr(prefix.size())));
      } catch (const nlohmann::json::exception&) {
        // A line cut off by a crash: left out, the run then lacks its result.
      }
    }
  }
  return results;
}

}  // namespace tessera::bench
