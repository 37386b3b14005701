// Pieces shared by Tessera's verbs: the verb registry and the options every YAML job takes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "io/config.h"

namespace tessera::app {

// What a verb does once the command line is parsed; returns the process exit code.
using Action = std::function<int()>;

struct Verb {
  const char* name;
  const char* summary;
  // Declares the verb's options on `command` and returns its action (which runs only if the verb was chosen).
  Action (*setup)(CLI::App& command);
};

// Every verb, in the order `tessera --help` lists them (STYLE.md: an explicit registry).
const std::vector<Verb>& verbs();

// The options of a verb that runs a YAML job: an optional job file, `--set a.b=value` overrides and
// `--print-config`.
struct JobOptions {
  std::string file;
  std::vector<std::string> overrides;
  bool print_config = false;
};
void add_job_options(CLI::App& command, JobOptions& options);

// Loads the job against `schema` (defaults when no file was given) with the overrides applied.
// `extra_overrides` come from verb-specific flags (e.g. --out) and win over the file and --set.
io::Config load_job(const io::Schema& schema, const JobOptions& options,
                    const std::vector<std::string>& extra_overrides = {});
// The config points at its schema, which must outlive it: no temporaries.
io::Config load_job(io::Schema&&, const JobOptions&, const std::vector<std::string>& = {}) = delete;

// When --print-config was given: prints the effective config (rank 0) and returns true.
bool maybe_print_config(const io::Config& config, const JobOptions& options);

// Verb entry points (one file each under app/).
Action setup_info(CLI::App& command);
Action setup_synth(CLI::App& command);
Action setup_tile(CLI::App& command);
Action setup_train(CLI::App& command);
Action setup_predict(CLI::App& command);
Action setup_infer(CLI::App& command);
Action setup_evaluate(CLI::App& command);
Action setup_bench(CLI::App& command);

}  // namespace tessera::app
