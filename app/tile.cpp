// tessera tile [job.yaml] — slides + tumour annotations → contiguous HDF5 shards of labelled tiles.
// The job itself (plan, partition, extract, resume) is preprocessing/tile_job.h; this verb turns the command line
// into the job's settings, runs it and maps its result to the exit code.
#include <memory>
#include <string>
#include <vector>

#include "app/cli.h"
#include "core/comm.h"
#include "core/error.h"
#include "preprocessing/tile_job.h"

namespace tessera::app {
namespace {

struct TileOptions {
  JobOptions job;
  bool force = false;
  bool preview = false;
  std::string out;
  std::string on_corrupt_tile;
};

int run_tile(const TileOptions& options) {
  std::vector<std::string> extra;
  if (!options.out.empty()) extra.push_back("output=" + options.out);
  if (options.preview) extra.emplace_back("preview.enabled=true");
  if (!options.on_corrupt_tile.empty()) extra.push_back("tile.on_corrupt_tile=" + options.on_corrupt_tile);
  const auto config = load_job(prep::tile_schema(), options.job, extra);
  if (maybe_print_config(config, options.job)) return core::exit_ok;
  const auto result =
      prep::run_tile_job(config, {.force = options.force, .preview_only = options.preview}, core::Comm::world());
  return result.slides_failed ? core::exit_input : core::exit_ok;
}

}  // namespace

Action setup_tile(CLI::App& command) {
  auto options = std::make_shared<TileOptions>();
  add_job_options(command, options->job);
  command.add_option("-o,--out", options->out, "Output folder (same as --set output=...)");
  command.add_flag("--force", options->force, "Rebuild everything even if the output is up to date");
  command
      .add_option("--on-corrupt-tile", options->on_corrupt_tile,
                  "fail: a slide with a damaged tile fails (default); skip: leave damaged tiles out, count them in "
                  "the manifest (same as --set tile.on_corrupt_tile=...)")
      ->check(CLI::IsMember({"fail", "skip"}));
  command.add_flag("--preview", options->preview,
                   "Only plan and write previews/<slide>.png (tissue mask, tile grid by label); no shards");
  return [options] { return run_tile(*options); };
}

}  // namespace tessera::app
