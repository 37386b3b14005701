// tessera import [job.yaml] — labelled patches (a CSV or a folder by class) → the HDF5 shards `tessera tile` writes.
// The job itself (inputs, groups and splits, extraction, resume) is preprocessing/import_job.h; this verb turns the
// command line into the job's settings, runs it and maps its result to the exit code.
#include <memory>
#include <string>

#include "app/cli.h"
#include "core/comm.h"
#include "core/error.h"
#include "preprocessing/import_job.h"

namespace tessera::app {
namespace {

struct ImportOptions {
  JobOptions job;
  bool force = false;
};

int run_import(const ImportOptions& options) {
  const auto config = load_job(prep::import_schema(), options.job);
  if (maybe_print_config(config, options.job)) return core::exit_ok;
  const auto result = prep::run_import_job(config, options.force, core::Comm::world());
  return result.patches_failed ? core::exit_input : core::exit_ok;
}

}  // namespace

Action setup_import(CLI::App& command) {
  auto options = std::make_shared<ImportOptions>();
  add_job_options(command, options->job);
  add_key_flag(command, options->job, "-o,--out", {"output"}, "Output folder (output)");
  add_key_flag(command, options->job, "--csv", {"input.csv"},
               "CSV of the patches: path,label[,group][,split] (input.csv)", FlagForm::value, {"input.folder"});
  add_key_flag(command, options->job, "--folder", {"input.folder"},
               "Folder of patches by class (input.folder; its organisation: input.layout)", FlagForm::value,
               {"input.csv"});
  add_key_flag(command, options->job, "--mpp", {"import.mpp"}, "um/px of the patches as given (import.mpp)");
  add_key_flag(command, options->job, "--tile-size", {"tile.size"},
               "Tile side in pixels (tile.size; 0 = the patches' most common side)");
  add_key_flag(command, options->job, "--fit", {"import.fit"},
               "pad (keep um/px; centre on white, crop a larger patch) or resize (import.fit)");
  command.add_flag("--force", options->force, "Import everything again even if the output is up to date");
  return [options] { return run_import(*options); };
}

}  // namespace tessera::app
