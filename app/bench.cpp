// tessera bench <what> — speed measurements. Every figure is taken in the same run as the reference it is
// compared with (this machine is shared and noisy), and printed with what it was measured on.
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "app/cli.h"
#include "bench/bench.h"
#include "bench/peak.h"
#include "core/comm.h"
#include "core/error.h"
#include "engine/models/registry.h"

namespace tessera::app {
namespace {

struct PeakOptions {
  int size = 2048;
  int threads = 0;
  double seconds = 2.0;
};

int run_peak(const PeakOptions& options) {
  const int all = options.threads > 0 ? options.threads : bench::default_threads();
  std::cout << fmt::format("oneDNN sgemm {0}x{0}x{0}, best of at least {1:g} s per row\n", options.size,
                           options.seconds);
  std::cout << fmt::format("{:>8}  {:>10}  {:>12}  {:>8}\n", "threads", "GFLOP/s", "ms/product", "repeats");
  for (int threads : {1, all}) {
    const auto r = bench::measure_sgemm_peak(options.size, threads, options.seconds);
    std::cout << fmt::format("{:>8}  {:>10.1f}  {:>12.2f}  {:>8}\n", r.threads, r.gflops, r.seconds * 1e3, r.repeats)
              << std::flush;
    if (all == 1) break;
  }
  return core::exit_ok;
}

// The options `bench train` and `bench infer` share.
CLI::App* add_model_bench(CLI::App& command, const char* name, const char* description, bench::ModelBenchOptions& o) {
  CLI::App* cmd = command.add_subcommand(name, description);
  cmd->add_option("--model", o.model, "Model architecture")
      ->check(CLI::IsMember(engine::model_names()))
      ->capture_default_str();
  cmd->add_option("--size", o.size, "Input edge in px")->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--batch", o.batch, "Images per step")->check(CLI::Range(1, 65536))->capture_default_str();
  cmd->add_option("--threads", o.threads, "Threads for both frameworks (0 = all cores)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--seconds", o.seconds, "Minimum measuring time of each framework, over all rounds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "Alternating Tessera / PyTorch rounds (medians are reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "Untimed steps before measuring")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  cmd->add_flag("--no-torch{false}", o.torch, "Do not run PyTorch (scripts/bench_torch.py)");
  cmd->add_flag("--profile", o.profile, "Per-layer forward and backward times of Tessera's model");
  cmd->add_flag("--json", o.json, "One JSON object instead of the table");
  return cmd;
}

}  // namespace

Action setup_bench(CLI::App& command) {
  command.require_subcommand(1);
  auto peak = std::make_shared<PeakOptions>();
  CLI::App* peak_cmd =
      command.add_subcommand("peak", "The machine's compute peak: a large oneDNN sgemm, 1 thread and all");
  peak_cmd->add_option("--size", peak->size, "Matrix size n (n x n x n product)")
      ->check(CLI::Range(64, 16384))
      ->capture_default_str();
  peak_cmd->add_option("--threads", peak->threads, "Threads for the second row (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  peak_cmd->add_option("--seconds", peak->seconds, "Minimum measuring time per row")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  auto tile = std::make_shared<bench::TileBenchOptions>();
  CLI::App* tile_cmd = command.add_subcommand(
      "tile", "Tiling speed: tiles/s with 1 and 2 ranks vs raw JPEG decode and a Python per-tile loop; shard reads");
  tile_cmd->add_option("--slides", tile->slides, "Synthetic slides to tile")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  tile_cmd->add_option("--size", tile->size, "Level-0 side of each slide in pixels")
      ->check(CLI::Range(1024, 200000))
      ->capture_default_str();
  tile_cmd->add_option("--tile", tile->tile_size, "Tile size in pixels")
      ->check(CLI::Range(16, 1024))
      ->capture_default_str();
  tile_cmd->add_option("--mpp", tile->mpp, "Tile resolution in um/px")
      ->check(CLI::Range(0.25, 16.0))
      ->capture_default_str();
  tile_cmd->add_option("--workdir", tile->workdir, "Folder for slides, shards and the log")->capture_default_str();
  tile_cmd->add_option("--rounds", tile->rounds, "Alternated rounds of the tiling measurements (best of each)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  tile_cmd->add_option("--qc", tile->qc, "on|off: slide quality control in the tiling jobs (on: tile's default)")
      ->capture_default_str();
  tile_cmd->add_option("--read-mb", tile->read_set_mb, "Least size of the shard set the readers are compared on")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();

  auto import = std::make_shared<bench::ImportBenchOptions>();
  CLI::App* import_cmd = command.add_subcommand(
      "import", "Patch import speed: the whole tessera import process vs a Python PIL + h5py loop on the same patches");
  import_cmd->add_option("--csv", import->csv, "The patches (path,label[,group]); default: generated PNG patches");
  import_cmd->add_option("--patches", import->patches, "Generated patches (without --csv)")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  import_cmd->add_option("--tile", import->tile_size, "Patch and tile side in pixels")
      ->check(CLI::Range(8, 1024))
      ->capture_default_str();
  import_cmd->add_option("--rounds", import->rounds, "Alternated rounds (best of each)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  import_cmd->add_option("--workdir", import->workdir, "Folder for the patches, shards and the log")
      ->capture_default_str();
  auto dicom = std::make_shared<bench::DicomBenchOptions>();
  CLI::App* dicom_cmd = command.add_subcommand(
      "dicom", "DICOM reading vs the direct TIFF path: the same regions of one slide with the same JPEG tiles");
  dicom_cmd->add_option("--size", dicom->size, "Level-0 side of the synthetic slide in pixels")
      ->check(CLI::Range(1024, 100000))
      ->capture_default_str();
  dicom_cmd->add_option("--tile", dicom->tile_size, "Tile (and frame, and region) side in pixels")
      ->check(CLI::Range(64, 1024))
      ->capture_default_str();
  dicom_cmd->add_option("--regions", dicom->regions, "Regions read per round")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  dicom_cmd->add_option("--rounds", dicom->rounds, "Alternated rounds (best of each)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  dicom_cmd->add_option("--workdir", dicom->workdir, "Folder for the slide and its DICOM series (kept)")
      ->capture_default_str();
  dicom_cmd->add_option("--json", dicom->json_file, "Also write the figures as JSON to this file");

  auto slide = std::make_shared<bench::InferSlideBenchOptions>();
  CLI::App* slide_cmd = command.add_subcommand(
      "infer-slide",
      "Whole-slide inference end to end (read, decode, normalize, CNN, every output): tiles/s with 1 "
      "and 2 ranks (child runs) against a Python pipeline (OpenSlide + PyTorch), the output phase's share, peak "
      "memory for a slide and a 4x larger one");
  slide_cmd->add_option("--size", slide->size, "Level-0 side of the slide in pixels (the second slide: twice it)")
      ->check(CLI::Range(512, 131072))
      ->capture_default_str();
  slide_cmd->add_option("--tile", slide->tile_size, "The model's input in pixels")
      ->check(CLI::Range(16, 1024))
      ->capture_default_str();
  slide_cmd->add_option("--mpp", slide->mpp, "The model's resolution in um/px")
      ->check(CLI::Range(0.25, 16.0))
      ->capture_default_str();
  slide_cmd->add_option("--model", slide->model, "Model architecture")
      ->check(CLI::IsMember(engine::model_names()))
      ->capture_default_str();
  slide_cmd->add_option("--stain", slide->stain, "The checkpoint's stain normalization (built-in target)")
      ->check(CLI::IsMember({"none", "reinhard", "macenko"}))
      ->capture_default_str();
  slide_cmd->add_option("--batch", slide->batch, "Tiles per forward pass (0 = infer's default)")
      ->check(CLI::Range(0, 65536))
      ->capture_default_str();
  slide_cmd->add_option("--ranks", slide->ranks, "Ranks of the multi-rank run (more than cores: oversubscribed)")
      ->check(CLI::Range(2, 1024))
      ->capture_default_str();
  slide_cmd->add_option("--rounds", slide->rounds, "Alternated rounds of the 1-rank and multi-rank runs (best of each)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  slide_cmd->add_option("--workdir", slide->workdir, "Folder for the slides, the checkpoint, outputs and logs")
      ->capture_default_str();
  slide_cmd->add_option("--timeout", slide->timeout, "Seconds a child run may take before it is stopped as hung")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  slide_cmd->add_option("--json", slide->json_file, "Also write the figures as JSON to this file");
  slide_cmd->add_flag("--no-python{false}", slide->python,
                      "Do not run the Python pipeline (scripts/bench_infer_slide.py)");

  auto train = std::make_shared<bench::ModelBenchOptions>();
  CLI::App* train_cmd = add_model_bench(
      command, "train", "Training speed of a model (images/s, GFLOP/s, fraction of peak) vs PyTorch", *train);
  auto infer = std::make_shared<bench::ModelBenchOptions>();
  CLI::App* infer_cmd = add_model_bench(
      command, "infer", "Inference speed of a model (batch norm folded) vs PyTorch under inference_mode", *infer);
  infer_cmd
      ->add_option("--precision", infer->precision,
                   "Also measure the model in bf16 or int8 against fp32 in the same rounds (fp32: fp32 alone; int8 is "
                   "calibrated on the benchmark's own batch)")
      ->check(CLI::IsMember({"fp32", "bf16", "int8"}))
      ->capture_default_str();
  train_cmd
      ->add_option("--precision", train->precision,
                   "Also measure training in bf16 (fp32 master weights and optimizer) against fp32 in the same rounds "
                   "(fp32: fp32 alone)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();

  auto comm = std::make_shared<bench::CommBenchOptions>();
  CLI::App* comm_cmd = command.add_subcommand(
      "comm",
      "Distributed training's cost: allreduce bandwidth, and each strategy's images/s, communication and "
      "waiting fractions and bytes per step against 1 rank with every core (child mpirun runs)");
  comm_cmd->add_option("--ranks", comm->ranks, "Ranks of the distributed runs (more than cores: oversubscribed)")
      ->check(CLI::Range(2, 1024))
      ->capture_default_str();
  comm_cmd->add_option("--model", comm->model, "Model architecture")
      ->check(CLI::IsMember(engine::model_names()))
      ->capture_default_str();
  comm_cmd->add_option("--size", comm->size, "Input edge in px")->check(CLI::Range(1, 4096))->capture_default_str();
  comm_cmd->add_option("--batch", comm->batch, "Images per rank and step")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  comm_cmd->add_option("--steps", comm->steps, "Measured training steps per run")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  comm_cmd->add_option("--rounds", comm->rounds, "Alternated rounds of all runs (best of each row)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  comm_cmd->add_option("--timeout", comm->timeout, "Seconds a child run may take before it is stopped as hung")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  comm_cmd->add_option("--json", comm->json_file, "Also write the figures as JSON to this file");
  comm_cmd->add_option("--launcher", comm->launcher,
                       "Command that starts the ranks, before '-n R' (default: mpirun --oversubscribe --bind-to none); "
                       "across test hosts: \"scripts/testhosts.sh mpirun --host t1:1,t2:1\"");
  // The child runs' side, hidden from --help.
  comm_cmd->add_option("--worker", comm->worker)->check(CLI::IsMember({"bandwidth", "train"}))->group("");
  comm_cmd->add_option("--strategy", comm->strategy)->group("");
  comm_cmd->add_option("--threads", comm->threads)->check(CLI::NonNegativeNumber)->group("");
  comm_cmd->add_option("--tau", comm->tau)->group("");
  comm_cmd->add_option("--bucket-mb", comm->bucket_mb)->group("");
  comm_cmd->add_option("--progress", comm->progress)->check(CLI::IsMember({"thread", "boundaries"}))->group("");
  comm_cmd->add_option("--inter", comm->inter)->group("");

  auto scale = std::make_shared<bench::ScaleBenchOptions>();
  CLI::App* scale_cmd = command.add_subcommand(
      "scale",
      "SIMULATED scaling to 1024 ranks: the strategies' exchange code on SimGrid SMPI clusters, computation "
      "calibrated here; validated against a measured 2-rank run (sim/README.md)");
  scale_cmd->add_option("--platforms", scale->platforms, "Platform names in sim/platforms, or platform files")
      ->capture_default_str();
  scale_cmd->add_option("--ranks", scale->ranks, "Rank counts to simulate")->capture_default_str();
  scale_cmd
      ->add_option("--strategies", scale->strategies,
                   "Strategies (the registry's, and central-easgd: the parameter-server baseline)")
      ->capture_default_str();
  scale_cmd->add_option("--models", scale->models, "Models whose layout and step time are simulated")
      ->capture_default_str();
  scale_cmd->add_option("--sizes", scale->sizes, "Input edge in px per model, for the calibration")
      ->capture_default_str();
  scale_cmd->add_option("--batch", scale->batch, "Images per rank and step")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  scale_cmd->add_option("--compute", scale->compute,
                        "model=seconds per step on one core here, instead of measuring it (e.g. resnet50=12.5)");
  scale_cmd
      ->add_option("--node-speed", scale->node_speed,
                   "How many times faster than one core here a simulated rank computes")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  scale_cmd->add_option("--tau", scale->tau, "tau of the easgd-type strategies in the rank sweep")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  scale_cmd->add_option("--tau-sweep", scale->tau_sweep, "easgd's tau values at --tau-sweep-ranks")
      ->capture_default_str();
  scale_cmd->add_option("--tau-sweep-ranks", scale->tau_sweep_ranks, "Ranks of the tau sweep")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  scale_cmd->add_option("--steps", scale->steps, "Simulated steps per run (a multiple of every tau)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  scale_cmd
      ->add_option("--payload-kb", scale->payload_kb,
                   "Each rank's model shrinks to about this size, the bandwidths by as much")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  scale_cmd->add_option("--ranks-per-node", scale->ranks_per_node, "Ranks per simulated node")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  scale_cmd
      ->add_option("--disk-mbps", scale->disk_mbps,
                   "Checkpoints: each rank's write bandwidth to storage in MB/s (an assumption; writes are delays)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  scale_cmd
      ->add_option("--fs-gbps", scale->fs_gbps,
                   "Checkpoints: the storage's aggregate bandwidth in GB/s, shared by ranks writing at once (0 = none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  scale_cmd->add_option("--out", scale->out, "Folder for scale.csv, scale.json and the plots")->capture_default_str();
  scale_cmd->add_option("--simulator", scale->simulator, "The SMPI simulator (default: the one built with Tessera)");
  scale_cmd->add_option("--timeout", scale->timeout, "Seconds one simulation may take")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  scale_cmd
      ->add_option("--measured", scale->measured,
                   "A `bench comm --json` report (e.g. across the test hosts): simulate its hosts, links calibrated "
                   "from its allreduce sweep, and compare each strategy's step time with it; no sweep")
      ->check(CLI::ExistingFile);
  scale_cmd
      ->add_flag("--validate,!--no-validate", scale->validate,
                 "First simulate this machine and compare with a measured 2-rank run")
      ->capture_default_str();

  auto view = std::make_shared<bench::ViewBenchOptions>();
  CLI::App* view_cmd = command.add_subcommand(
      "view", "tessera view's tiles on loopback: tiles/s, p50/p99 latency cold and warm, the server's peak memory");
  view_cmd->add_option("--size", view->size, "Level-0 side of the synthetic slide")
      ->check(CLI::Range(1024, 200000))
      ->capture_default_str();
  view_cmd->add_option("--clients", view->clients, "Concurrent client threads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  view_cmd->add_option("--cache-mb", view->cache_mb, "The server's tile cache in MB")
      ->check(CLI::Range(16, 65536))
      ->capture_default_str();
  view_cmd->add_option("--seconds", view->seconds, "Time bound of each phase")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  view_cmd->add_option("--workdir", view->workdir, "Folder for the slide, its outputs and the log")
      ->capture_default_str();
  view_cmd->add_option("--json", view->json_file, "Also write the figures as JSON to this file");

  return [peak, peak_cmd, tile, tile_cmd, import, import_cmd, dicom, dicom_cmd, slide, slide_cmd, train, train_cmd,
          infer, infer_cmd, comm, comm_cmd, scale, scale_cmd, view, view_cmd]() -> int {
    // A `bench comm` child runs on every rank of its job; every other bench runs on rank 0 alone.
    if (comm_cmd->parsed() && !comm->worker.empty()) return bench::run_bench_comm_worker(*comm);
    if (!core::Comm::world().is_root()) return core::exit_ok;
    if (comm_cmd->parsed()) return bench::run_bench_comm(*comm);
    if (scale_cmd->parsed()) return bench::run_bench_scale(*scale);
    if (peak_cmd->parsed()) return run_peak(*peak);
    if (tile_cmd->parsed()) return bench::run_bench_tile(*tile);
    if (import_cmd->parsed()) return bench::run_bench_import(*import);
    if (view_cmd->parsed()) return bench::run_bench_view(*view);
    if (dicom_cmd->parsed()) return bench::run_bench_dicom(*dicom);
    if (slide_cmd->parsed()) return bench::run_bench_infer_slide(*slide);
    if (train_cmd->parsed()) return bench::run_bench_model(bench::ModelBenchKind::train, *train);
    if (infer_cmd->parsed()) return bench::run_bench_model(bench::ModelBenchKind::infer, *infer);
    return core::exit_usage;
  };
}

}  // namespace tessera::app
