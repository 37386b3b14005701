// tessera tile [job.yaml] — slides + tumour annotations → contiguous HDF5 shards of labelled tiles.
// The job itself (plan, partition, extract, resume) is preprocessing/tile_job.h; this verb turns the command line
// into the job's settings, runs it and maps its result to the exit code.
#include <memory>
#include <string>
#include <vector>

#include "app/cli.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/signals.h"
#include "preprocessing/tile_job.h"

namespace tessera::app {
namespace {

struct TileOptions {
  JobOptions job;
  bool force = false;
  const KeyFlag* preview = nullptr;  // --preview: also a mode of the job (previews only, no shards)
};

int run_tile(const TileOptions& options) {
  const auto config = load_job(prep::tile_schema(), options.job);
  if (maybe_print_config(config, options.job)) return core::exit_ok;
  core::install_stop_handlers();  // SIGUSR1: finish the shard in hand; SIGTERM: stop now (core/signals.h)
  const auto result =
      prep::run_tile_job(config, {.force = options.force, .preview_only = options.preview->on}, core::Comm::world());
  if (result.stopped != core::StopRequest::none) return core::exit_interrupted;
  return result.slides_failed ? core::exit_input : core::exit_ok;
}

}  // namespace

Action setup_tile(CLI::App& command) {
  auto options = std::make_shared<TileOptions>();
  add_job_options(command, options->job);
  add_key_flag(command, options->job, "-o,--out", {"output"}, "Output folder (output)");
  add_key_flag(command, options->job, "--csv", {"input.csv"}, "dataset.csv of the slides to tile (input.csv)",
               FlagForm::value, {"input.slides"});
  command.add_flag("--force", options->force, "Rebuild everything even if the output is up to date");
  add_key_flag(command, options->job, "--on-corrupt-tile", {"tile.on_corrupt_tile"},
               "fail: a slide with a damaged tile fails (default); skip: leave damaged tiles out, count them in the "
               "manifest (tile.on_corrupt_tile)");
  add_key_flag(command, options->job, "--artefact-tiles", {"tile.artefact_tiles"},
               "drop: leave out tiles over qc.max_fraction in excluded artefacts (default); keep: keep them, marked in "
               "the shard's 'artefacts' dataset (tile.artefact_tiles)");
  add_key_flag(command, options->job, "--preview", {"preview.enabled"},
               "Only plan and write previews/<slide>.png (tissue mask, tile grid by label); no shards", FlagForm::on);
  options->preview = &options->job.key_flags.back();
  return [options] { return run_tile(*options); };
}

}  // namespace tessera::app
