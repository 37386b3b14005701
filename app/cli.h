// Pieces shared by Tessera's verbs: the verb registry and the options every YAML job takes.
#pragma once

#include <functional>
#include <list>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/config.h"

namespace tessera::app {

// What a verb does once the command line is parsed; returns the process exit code.
using Action = std::function<int()>;

struct Verb {
  const char* name;
  const char* summary;
  // Declares the verb's options on `command` and returns its action (which runs only if the verb was chosen).
  Action (*setup)(CLI::App& command);
  // Started without a launcher (core::started_by_launcher()), the verb runs without MPI: a world of one rank whose
  // collectives are local (core/comm.h: Comm::alone()). Only for verbs whose code uses nothing but core::Comm,
  // core::Window and core::ProgressThread on one rank (docs/ARCHITECTURE.md lists what that excludes).
  bool alone_without_mpi = false;
};

// Whether `argv` runs a verb with alone_without_mpi as its first word (`tessera tile job.yaml`; with options before
// the verb, MPI starts as for any verb).
bool alone_without_mpi(int argc, char** argv);

// Every verb, in the order `tessera --help` lists them (docs/ARCHITECTURE.md "Conventions": explicit registries).
const std::vector<Verb>& verbs();

// A verb flag that stands for config keys (--batch for infer.batch_size; synth's --size for two keys). Its text is
// kept as given and checked by the keys' schema like a YAML value, so `--batch 0` fails as `batch_size: 0` would,
// and the error names the flag ("--batch: must be between 1 and 65536, got 0"). A flag that was not given changes
// nothing: no value of the flag's own type stands for "not set". The value goes into the config as it is, never
// through YAML text: a path with ": " or "#" in it stays that path.
enum class FlagForm {
  value,  // --out DIR: the text is the key's value
  list,   // --splits a,b: a comma-separated list for a list key (items trimmed, empty ones dropped)
  on,     // --preview: takes no value; sets a boolean key to true
};
struct KeyFlag {
  std::vector<std::string> keys;
  std::vector<std::string> clears;  // keys put back to their defaults when the flag is given (--slides: input.csv)
  FlagForm form = FlagForm::value;
  std::string value;
  bool on = false;
  CLI::Option* option = nullptr;
};

// The options of a verb that runs a YAML job: an optional job file, `--set a.b=value` overrides,
// `--print-config`, and the verb's key flags.
struct JobOptions {
  std::string file;
  std::vector<std::string> overrides;
  bool print_config = false;
  std::list<KeyFlag> key_flags;  // a list: CLI11 keeps pointers to each value
};
void add_job_options(CLI::App& command, JobOptions& options);

// Declares a key flag (see KeyFlag); `names` as CLI11 takes them ("-n,--slides").
CLI::Option* add_key_flag(CLI::App& command, JobOptions& options, const std::string& names,
                          std::vector<std::string> keys, const std::string& doc, FlagForm form = FlagForm::value,
                          std::vector<std::string> clears = {});

// Loads the job against `schema` (defaults when no file was given), applies the --set overrides, then the key
// flags that were given: a flag wins over the file and --set.
core::Config load_job(const core::Schema& schema, const JobOptions& options);
// The config points at its schema, which must outlive it: no temporaries.
core::Config load_job(core::Schema&&, const JobOptions&) = delete;

// A flag's comma-separated list: "a, b,c" → {"a", "b", "c"} (items trimmed, empty ones dropped).
std::vector<std::string> comma_list(const std::string& text);

// When --print-config was given: prints the effective config (rank 0) and returns true.
bool maybe_print_config(const core::Config& config, const JobOptions& options);

// The job's `checkpoint` key, which the verbs that load a model need: ConfigError naming the key when it is empty.
std::string required_checkpoint(const core::Config& config);

// Verb entry points (one file each under app/).
Action setup_info(CLI::App& command);
Action setup_synth(CLI::App& command);
Action setup_qc(CLI::App& command);
Action setup_tile(CLI::App& command);
Action setup_import(CLI::App& command);
Action setup_train(CLI::App& command);
Action setup_predict(CLI::App& command);
Action setup_quantize(CLI::App& command);
Action setup_infer(CLI::App& command);
Action setup_evaluate(CLI::App& command);
Action setup_bench(CLI::App& command);
Action setup_view(CLI::App& command);

}  // namespace tessera::app
