// tessera — one program, one verb per stage. See README.md for the verbs and the exit codes.
#include <malloc.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "app/cli.h"
#include "app/version.h"
#include "core/comm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/hosts.h"
#include "core/log.h"
#include "io/hdf5_library.h"

namespace {

using namespace tessera;

// An unknown verb gets a suggestion instead of CLI11's generic "arguments were not expected".
void check_verb(int argc, char** argv) {
  if (argc < 2) return;
  const std::string word = argv[1];
  if (word.empty() || word.front() == '-') return;
  std::vector<std::string> names;
  for (const auto& verb : app::verbs()) {
    if (word == verb.name) return;
    names.emplace_back(verb.name);
  }
  std::string message = "unknown verb '" + word + "'";
  const std::string suggestion = core::closest_match(word, names);
  if (!suggestion.empty()) message += "; did you mean '" + suggestion + "'?";
  message += " (run 'tessera --help' for the list)";
  throw core::UsageError(message);
}

int run(int argc, char** argv) {
  check_verb(argc, argv);

  CLI::App cli{"Tessera: finds cancerous regions in whole-slide images, from one laptop to a cluster.", "tessera"};
  cli.require_subcommand(1);
  cli.fallthrough();
  cli.set_version_flag("--version", app::version_text());
  std::string log_level = "info";
  cli.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")->capture_default_str();
  cli.footer(
      "Exit codes: 0 success, 1 internal failure, 2 usage or configuration error, 3 bad input data\n"
      "(also: a batch job in which some items failed), 75 interrupted by SIGUSR1 or SIGTERM with its work so far\n"
      "recorded (train, tile, infer: run it again to go on). Run under mpirun/srun for many processes.");

  std::vector<std::pair<CLI::App*, app::Action>> actions;
  for (const auto& verb : app::verbs()) {
    CLI::App* command = cli.add_subcommand(verb.name, verb.summary);
    actions.emplace_back(command, verb.setup(*command));
  }

  const auto& world = core::Comm::world();
  std::int64_t status = 0;  // 0 parsed; 1 --help or --version (CLI11's "errors" with exit code 0); 2 a usage error
  std::ostringstream out, err;
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    status = e.get_exit_code() == 0 ? 1 : 2;
    cli.exit(e, out, err);
  }
  // Every rank learns how the others' parse went, so that none waits in a collective for a rank that stopped (a job
  // file missing on one host only): all stop together. One message: rank 0's, or a failing rank's when rank 0's
  // parse succeeded.
  std::int64_t any = status, root_status = status;
  if (world.size() > 1) {
    any = world.allreduce_value(status, core::ReduceOp::max);
    world.broadcast(&root_status, sizeof root_status, 0);
  }
  if (any != 0) {
    if (world.is_root()) {
      std::cout << out.str();
      std::cerr << err.str();
    } else if (status == 2 && root_status == 0) {
      std::cerr << "tessera: rank " << world.rank() << ": " << err.str();
    }
    return any == 2 ? core::exit_usage : core::exit_ok;
  }

  core::init_logging(log_level, world.rank(), world.size());
  if (core::MpiSession::alone()) spdlog::debug("started without a launcher: one rank, without MPI");
  if (world.size() > 1) {
    // Which ranks run where: when a host fails, Open MPI names the host, and this line the ranks on it.
    const core::HostMap hosts = core::describe_hosts(world);
    if (world.is_root()) spdlog::info("{} ranks on {} host(s): {}", world.size(), hosts.hosts, hosts.text);
  }
  for (auto& [command, action] : actions) {
    if (command->parsed()) return action();
  }
  return core::exit_usage;  // unreachable: require_subcommand(1)
}

}  // namespace

int main(int argc, char** argv) {
  // Decoded slide tiles, read windows and activation buffers are a few hundred KB to tens of MB and are
  // allocated again and again. glibc serves blocks over 128 KB with fresh mmaps, each paying page faults on
  // first touch; keeping blocks up to 32 MB on the heap (and up to 64 MB of free heap before trimming) lets
  // them be reused. Measured on `tessera bench tile`: extraction CPU time 0.18 s → 0.08 s at 96 px.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  io::skip_hdf5_exit_cleanup();  // first: see io/hdf5_library.h (a failed close must not become a SIGSEGV at exit)
  core::fault::enabled();        // a malformed TESSERA_FAULT (tests only) ends the process now, before any work
  std::optional<core::MpiSession> mpi;
  try {
    // `tessera tile` started on its own needs no MPI (why: README, "Running on many processes").
    mpi.emplace(&argc, &argv, core::started_by_launcher() || !app::alone_without_mpi(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "tessera: cannot start MPI: " << e.what() << "\n";
    return core::exit_internal;
  }

  int code = core::exit_ok;
  std::string failure;
  try {
    code = run(argc, argv);
  } catch (const core::Error& e) {
    code = core::exit_code_for(e.kind());
    failure = std::string(core::to_string(e.kind())) + ": " + e.what();
  } catch (const std::exception& e) {
    code = core::exit_internal;
    failure = std::string("internal error: ") + e.what();
  }

  if (!failure.empty()) {
    // One failing rank may leave the others waiting in a collective: take the whole job down, naming the rank.
    if (core::Comm::world().size() > 1) core::abort_job(failure, code);
    std::cerr << "tessera: " << failure << "\n";
  }
  mpi->finalize();
  return code;
}
