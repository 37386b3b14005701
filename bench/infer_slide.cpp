// tessera bench infer-slide — whole-slide inference end to end, as a user runs it: `tessera infer` (read + decode
// + stain-normalize + CNN + every output) on a generated slide, in child processes with 1 rank and with
// `mpirun -n R`, against the Python pipeline a user would otherwise run, and the peak memory of one rank on that
// slide and on one with four times its area.
//   The slides come from `tessera synth` (made once per size in the work folder), the checkpoint is the model's
//   initialized weights written through the checkpoint code with /meta as training writes it (architecture,
//   tile size, µm/px, stain normalization, tissue settings): untrained weights cost the same to run as trained
//   ones; only the regions and detections the outputs draw differ.
//   Python: scripts/bench_infer_slide.py in a child process (/usr/bin/python3): OpenSlide read_region + PIL resize
//   for the same tiles (the cells the memory run scored, from its heatmap.h5), the same model shape in PyTorch
//   (bench_torch.py's definitions) with the same batch and threads, the grid saved with numpy. Its side does no
//   tissue detection, stain normalization or viewer outputs, so the comparison leaves that work to Tessera alone.
//   Tiles/s: the tiles `infer` scored (its infer.json) over the child's wall time from spawn to exit (start-up,
//   model load and MPI included), and over the scoring of the slide alone (plan, read, CNN, gather: infer.json's
//   per-slide seconds). The output phase (infer.json's output_seconds, by output) is given as a fraction of the
//   1-rank run and of its scoring. The machine may be shared: the runs alternate in rounds (reversed every other
//   round), each row is its best round, CPU times (which other processes hardly change) are printed beside wall
//   times, and the load average is printed.
//   Memory: ru_maxrss of the 1-rank child. Measured first, before this process holds anything: a child's
//   ru_maxrss includes this process's own peak at the spawn (exec keeps the peak of the address space the
//   vfork-style spawn shared with it), which is printed as the floor.
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "bench/child.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "engine/checkpoint_adapter.h"
#include "engine/models/registry.h"
#include "io/checkpoint.h"
#include "io/shard.h"
#include "io/slide.h"
#include "preprocessing/stain_norm.h"

namespace tessera::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kClasses = 2;
constexpr std::uint64_t kModelSeed = 1;
constexpr std::uint64_t kSlideSeed = 5;
constexpr double kMB = 1024.0;          // ru_maxrss is in KB; MB here are MiB, as bench tile prints them
constexpr int kInferDefaultBatch = 32;  // infer.batch_size's default (app/infer.cpp), for the Python side
constexpr const char* kPythonResult = "bench-infer-slide-python: ";
constexpr const char* kPython = "/usr/bin/python3";  // Debian's, where install-deps.sh --bench puts torch

// What one `tessera infer` child did: its measurement and the figures of its infer.json.
struct InferRun {
  ChildResult child;
  json summary;  // infer.json
  std::int64_t tiles = 0;
  int ranks = 0;
  int threads_per_rank = 0;
  double job_seconds = 0.0;      // infer.json seconds: the slide loop (scoring, then the outputs)
  double scoring_seconds = 0.0;  // the slide's seconds: plan, read + decode + normalize, CNN, gather
  double plan_seconds = 0.0;
  double read_wait_seconds = 0.0;  // rank 0's model waiting for its reader
  double output_seconds = 0.0;
  json output_seconds_by_output;  // name → seconds (infer.json), {} from a Tessera that does not record them
};

// What one run of the Python pipeline did: its measurement and its result line.
struct PythonRun {
  ChildResult child;
  json result;
};

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw core::InputError("cannot open", path.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw core::InputError(fmt::format("not JSON: {}", e.what()), path.string());
  }
}

// Runs `command` (an infer job writing into `out`, emptied first) and reads what it reports about its one slide.
InferRun run_infer(const std::vector<std::string>& command, const fs::path& out, const std::string& log,
                   const std::string& what, double timeout) {
  fs::remove_all(out);
  InferRun run;
  run.child = run_child(command, log, timeout);
  require_ok(run.child, what, log);
  const fs::path summary_file = out / "infer.json";
  run.summary = read_json(summary_file);
  const json& s = run.summary;
  if (!s.value("failures", json::array()).empty() || s.value("slides", json::array()).size() != 1) {
    throw core::InternalError(
        fmt::format("{}: expected one slide done and no failures in {}; see {}", what, summary_file.string(), log));
  }
  const json& slide = s["slides"][0];
  run.tiles = s.at("tiles").get<std::int64_t>();
  run.ranks = s.at("ranks").get<int>();
  run.threads_per_rank = s.at("threads_per_rank").get<int>();
  run.job_seconds = s.at("seconds").get<double>();
  run.scoring_seconds = slide.at("seconds").get<double>();
  run.plan_seconds = slide.at("plan_seconds").get<double>();
  run.read_wait_seconds = slide.at("read_wait_seconds").get<double>();
  run.output_seconds = slide.at("output_seconds").get<double>();
  run.output_seconds_by_output = slide.value("output_seconds_by_output", json::object());
  if (run.tiles <= 0) {
    throw core::InternalError(
        fmt::format("{} scored no tiles (no tissue found?); see {}", what, summary_file.string()));
  }
  return run;
}

// The best of the rounds of one configuration: the run with the least wall time, and the least CPU time.
struct Best {
  InferRun run;
  double cpu_seconds = 0.0;
  int rounds = 0;
  void add(InferRun r) {
    cpu_seconds = rounds == 0 ? r.child.cpu_seconds : std::min(cpu_seconds, r.child.cpu_seconds);
    if (rounds == 0 || r.child.seconds < run.child.seconds) run = std::move(r);
    ++rounds;
  }
};

struct BestPython {
  PythonRun run;
  double cpu_seconds = 0.0;
  int rounds = 0;
  void add(PythonRun r) {
    cpu_seconds = rounds == 0 ? r.child.cpu_seconds : std::min(cpu_seconds, r.child.cpu_seconds);
    if (rounds == 0 || r.child.seconds < run.child.seconds) run = std::move(r);
    ++rounds;
  }
};

// Writes the model's initialized weights as a checkpoint whose /meta says how its tiles are made.
void write_untrained_checkpoint(const InferSlideBenchOptions& o, const std::string& path) {
  engine::ModelOptions model_options;
  model_options.architecture = o.model;
  model_options.input_size = o.tile_size;
  model_options.num_classes = kClasses;
  model_options.seed = kModelSeed;
  std::unique_ptr<engine::Model> model;
  try {
    model = engine::make_model(model_options);
  } catch (const core::ConfigError& e) {
    throw core::UsageError(fmt::format("--model {} --tile {}: {}", o.model, o.tile_size, e.message()));
  }
  const auto normalizer = prep::make_stain_normalizer(prep::parse_stain_method(o.stain));
  io::Checkpoint checkpoint;
  engine::describe_model(model_options, checkpoint.meta);
  checkpoint.meta.class_names = io::kLabelNames;
  checkpoint.meta.mpp = o.mpp;
  checkpoint.meta.stain_normalization = normalizer ? normalizer->describe() : "none";
  checkpoint.meta.tissue = io::TissueSettings{};  // what training records from a tiling with the default tissue keys
  checkpoint.meta.config_yaml =
      fmt::format("# tessera bench infer-slide: {} with initialized weights (seed {})\n", o.model, kModelSeed);
  engine::store_checkpoint_tensors(model->parameters(), model->buffers(), checkpoint);
  io::write_checkpoint(path, checkpoint);
}

// A table row: wall seconds and tiles/s, CPU seconds and tiles per CPU second (negative: not measured), a ratio.
std::string row(const std::string& what, double seconds, std::int64_t tiles, double cpu,
                const std::string& ratio = "") {
  const auto n = static_cast<double>(tiles);
  const std::string cpu_text = cpu > 0 ? fmt::format("{:.2f}", cpu) : "-";
  const std::string cpu_rate = cpu > 0 ? fmt::format("{:.0f}", n / cpu) : "-";
  return fmt::format("{:<58} {:>7.2f} {:>8.0f} {:>7} {:>8}  {:>9}\n", what, seconds, n / seconds, cpu_text, cpu_rate,
                     ratio);
}

json run_json(const Best& best, double one_rank_rate) {
  const InferRun& r = best.run;
  const auto tiles = static_cast<double>(r.tiles);
  const double rate = tiles / r.child.seconds;
  return {{"ranks", r.ranks},
          {"threads_per_rank", r.threads_per_rank},
          {"tiles", r.tiles},
          {"seconds", r.child.seconds},
          {"tiles_per_s", rate},
          {"cpu_seconds", best.cpu_seconds},
          {"tiles_per_cpu_s", tiles / best.cpu_seconds},
          {"scoring_seconds", r.scoring_seconds},
          {"scoring_tiles_per_s", tiles / r.scoring_seconds},
          {"plan_seconds", r.plan_seconds},
          {"read_wait_seconds", r.read_wait_seconds},
          {"output_seconds", r.output_seconds},
          {"startup_seconds", r.child.seconds - r.job_seconds},
          {"vs_one_rank", rate / one_rank_rate}};
}

}  // namespace

int run_bench_infer_slide(const InferSlideBenchOptions& o) {
  const fs::path work = fs::absolute(o.workdir);
  fs::create_directories(work);
  const std::string log = (work / "bench.log").string();
  fs::remove(log);
  const std::string tessera = self_path();
  const auto mpirun = find_in_path("mpirun");
  if (!mpirun) {
    throw core::UsageError(
        "tessera bench infer-slide runs its multi-rank job with `mpirun`, which is not on PATH: install Open MPI "
        "(scripts/install-deps.sh) or add its bin folder to PATH");
  }
  const std::string load_before = load_average();
  std::cout << fmt::format(
                   "tessera bench infer-slide: {} at {} px and {:g} um/px (initialized weights), stain {}, all "
                   "outputs; slides of {}x{} and {}x{} px; work folder {} (logs there)\n",
                   o.model, o.tile_size, o.mpp, o.stain, o.size, o.size, 2 * o.size, 2 * o.size, work.string())
            << std::flush;

  // The checkpoint, and the slides (made once per size).
  const std::string checkpoint = (work / "checkpoint.h5").string();
  write_untrained_checkpoint(o, checkpoint);
  const std::vector<int> sides = {o.size, 2 * o.size};
  std::vector<std::string> datasets;
  for (const int side : sides) {
    const fs::path set = work / fmt::format("slide-{}", side);
    if (!fs::exists(set / "dataset.csv")) {
      require_ok(run_child({tessera, "synth", "--out", set.string(), "--slides", "1", "--size", std::to_string(side),
                            "--seed", std::to_string(kSlideSeed), "--set", "preview.enabled=false"},
                           log),
                 "tessera synth", log);
    }
    datasets.push_back((set / "dataset.csv").string());
  }
  auto infer_command = [&](const std::string& dataset, const fs::path& out, int ranks) {
    std::vector<std::string> command;
    if (ranks > 1) {
      command = {*mpirun, "-n", std::to_string(ranks), "--oversubscribe", "--bind-to", "none", "--allow-run-as-root"};
    }
    for (const std::string& a : {tessera, std::string("infer"), std::string("--checkpoint"), checkpoint,
                                 std::string("--slides"), dataset, std::string("--out"), out.string(),
                                 std::string("--log-level"), std::string("info"), std::string("--force")}) {
      command.push_back(a);  // --force: every round scores the slide (a rerun would skip it as up to date)
    }
    if (o.batch > 0) {
      command.push_back("--batch");
      command.push_back(std::to_string(o.batch));
    }
    return command;
  };

  // Memory first (see the top): one rank on the slide and on the one with four times its area. These runs also
  // bring the bench slide into the page cache for the timed rounds.
  struct rusage self_usage {};
  getrusage(RUSAGE_SELF, &self_usage);
  const long own_peak_kb = self_usage.ru_maxrss;
  std::vector<InferRun> memory;
  for (std::size_t k = 0; k < sides.size(); ++k) {
    const fs::path out = work / fmt::format("memory-{}", sides[k]);
    memory.push_back(run_infer(infer_command(datasets[k], out, 1), out, log,
                               fmt::format("tessera infer (memory, {}x{} slide)", sides[k], sides[k]), o.timeout));
  }

  // The Python pipeline scores the tiles the memory run scored on the same slide, with its batch and threads.
  const json& scored_slide = memory[0].summary.at("slides").at(0);
  const std::string scored_id = scored_slide.at("id").get<std::string>();
  const fs::path scored_map = work / fmt::format("memory-{}", sides[0]) / (scored_id + ".heatmap.h5");
  const std::string script = (fs::path(TESSERA_SOURCE_DIR) / "scripts" / "bench_infer_slide.py").string();
  std::string python_missing;
  if (!o.python) {
    python_missing = "not measured (--no-python)";
  } else if (!fs::exists(script)) {
    python_missing = fmt::format("not measured: {} is missing", script);
  } else if (!fs::exists(kPython)) {
    python_missing = fmt::format("not measured: {} is missing (scripts/install-deps.sh --bench installs it)", kPython);
  }
  const std::vector<std::string> python_command = {
      kPython,     script,
      "--slide",   scored_slide.at("slide").get<std::string>(),
      "--heatmap", scored_map.string(),
      "--model",   o.model,
      "--size",    std::to_string(o.tile_size),
      "--batch",   std::to_string(o.batch > 0 ? o.batch : kInferDefaultBatch),
      "--threads", std::to_string(memory[0].threads_per_rank),
      "--out",     (work / "python-grid.npy").string()};
  auto run_python = [&]() -> std::optional<PythonRun> {
    PythonRun r;
    r.child = run_child(python_command, log, o.timeout);
    require_ok(r.child, "the Python pipeline (scripts/bench_infer_slide.py)", log);
    const std::vector<json> lines = result_lines(log, kPythonResult);
    if (lines.empty()) {
      throw core::InternalError(fmt::format("the Python pipeline printed no result line; see {}", log));
    }
    r.result = lines.back();
    if (!r.result.value("available", false)) {
      python_missing = fmt::format(
          "not measured: {} cannot import what scripts/bench_infer_slide.py needs ({}); scripts/install-deps.sh "
          "--bench installs python3-torch, python3-openslide, python3-h5py, python3-numpy, python3-pil",
          kPython, r.result.value("error", std::string("?")));
      return std::nullopt;
    }
    if (r.result.at("tiles").get<std::int64_t>() != memory[0].tiles) {
      throw core::InternalError(fmt::format("the Python pipeline scored {} tiles, tessera infer {}; see {}",
                                            r.result.at("tiles").get<std::int64_t>(), memory[0].tiles, log));
    }
    return r;
  };

  // Alternated rounds: 1 rank, R ranks, Python; reversed every other round.
  const fs::path one_out = work / "infer-1rank";
  const fs::path many_out = work / fmt::format("infer-{}ranks", o.ranks);
  Best one, many;
  BestPython python;
  for (int round = 0; round < o.rounds; ++round) {
    for (int k = 0; k < 3; ++k) {
      const int which = round % 2 == 0 ? k : 2 - k;
      if (which == 0) {
        one.add(run_infer(infer_command(datasets[0], one_out, 1), one_out, log, "tessera infer (1 rank)", o.timeout));
      } else if (which == 1) {
        many.add(run_infer(infer_command(datasets[0], many_out, o.ranks), many_out, log,
                           fmt::format("mpirun -n {} tessera infer", o.ranks), o.timeout));
      } else if (python_missing.empty()) {
        if (auto r = run_python()) python.add(std::move(*r));
      }
    }
  }
  // The map is the same on any number of ranks (engine/slide_inference.h), so are the tiles scored.
  const std::int64_t tiles = one.run.tiles;
  if (many.run.tiles != tiles || memory[0].tiles != tiles) {
    throw core::InternalError(
        fmt::format("the runs on the same slide scored different tile counts: {} (1 rank), {} "
                    "({} ranks), {} (memory run); see {}",
                    tiles, many.run.tiles, o.ranks, memory[0].tiles, log));
  }
  const std::string load_after = load_average();

  // Report.
  const json& slide_entry = one.run.summary["slides"][0];
  const std::string slide_path = slide_entry.at("slide").get<std::string>();
  const auto slide = io::Slide::open(slide_path);
  std::vector<std::string> outputs;
  for (const auto& name : slide_entry.at("outputs")) outputs.push_back(name.get<std::string>());
  const int stride = one.run.summary.at("stride").get<int>();
  const double one_rate = static_cast<double>(tiles) / one.run.child.seconds;
  const double many_rate = static_cast<double>(tiles) / many.run.child.seconds;

  std::cout << fmt::format(
      "\n{} tiles of the {}x{} px slide at {:g} um/px ({}x{} cells, stride {} px at {:g} um/px); {} outputs: {}\n",
      tiles, slide.width(), slide.height(), slide.mpp(), slide_entry.at("rows").get<std::int64_t>(),
      slide_entry.at("cols").get<std::int64_t>(), stride, o.mpp, outputs.size(), fmt::join(outputs, ", "));
  std::cout << fmt::format("machine: {} cores, {} ({}); load average (1, 5, 15 min) {} at the start, {} at the end\n\n",
                           std::thread::hardware_concurrency(), cpu_name(), cpu_isa(), load_before, load_after);
  std::cout << fmt::format("{:<58} {:>7} {:>8} {:>7} {:>8}  {:>9}\n",
                           fmt::format("tessera infer (best of {} alternated rounds)", o.rounds), "wall s", "tiles/s",
                           "CPU s", "/CPU s", "vs 1 rank");
  for (const Best* b : {&one, &many}) {
    const InferRun& r = b->run;
    const bool reference = b == &one;
    const std::string who = fmt::format("{} rank{} x {} thread{}", r.ranks, r.ranks > 1 ? "s" : "", r.threads_per_rank,
                                        r.threads_per_rank > 1 ? "s" : "");
    std::cout << row(who + ": end to end", r.child.seconds, tiles, b->cpu_seconds,
                     reference ? "" : fmt::format("{:.2f}x", many_rate / one_rate));
    std::cout << row("  scoring: plan, read + decode + normalize, CNN, gather", r.scoring_seconds, tiles, -1,
                     reference ? "" : fmt::format("{:.2f}x", one.run.scoring_seconds / many.run.scoring_seconds));
    std::cout << fmt::format(
        "    (plan {:.2f} s; rank 0's model waited {:.2f} s for its reader); outputs {:.2f} s; start-up, model load "
        "and exit {:.2f} s\n",
        r.plan_seconds, r.read_wait_seconds, r.output_seconds, r.child.seconds - r.job_seconds);
  }
  const double python_rate = python.rounds > 0 ? static_cast<double>(tiles) / python.run.child.seconds : 0.0;
  if (python.rounds > 0) {
    const json& p = python.run.result;
    const json& phases = p.at("seconds");
    std::cout << row(fmt::format("Python: OpenSlide + PyTorch {}, {} thread{}", p.value("torch", std::string("?")),
                                 p.value("threads", 0), p.value("threads", 0) > 1 ? "s" : ""),
                     python.run.child.seconds, tiles, python.cpu_seconds,
                     fmt::format("{:.2f}x", python_rate / one_rate));
    std::cout << fmt::format(
        "    (imports {:.2f} s; model and slide set-up {:.2f} s; read_region + resize {:.2f} s; model {:.2f} s; "
        "saving the grid {:.2f} s)\n",
        phases.value("imports", 0.0), phases.value("setup", 0.0), phases.value("read", 0.0), phases.value("model", 0.0),
        phases.value("write", 0.0));
  } else {
    std::cout << fmt::format("{:<58} {}\n", "Python: OpenSlide + PyTorch", python_missing);
  }
  std::cout << "  end to end: the child process from spawn to exit (CPU: user + system of it and its ranks); "
               "scoring:\n  infer.json's seconds of the slide. Untrained weights: the same work as a trained model's, "
               "other\n  regions and detections in the outputs. Python: the same tiles and model shape, no tissue "
               "detection,\n  stain normalization or viewer outputs.\n";
  if (python.rounds > 0) {
    std::cout << fmt::format("\ntessera infer (1 rank) end to end: {:.2f}x the Python pipeline's tiles/s\n",
                             one_rate / python_rate);
  }
  const double output_of_run = one.run.output_seconds / one.run.child.seconds;
  const double output_of_scoring = one.run.output_seconds / one.run.scoring_seconds;
  std::vector<std::string> by_output;
  for (const auto& [name, seconds] : one.run.output_seconds_by_output.items()) {
    by_output.push_back(fmt::format("{} {:.2f} s", name, seconds.get<double>()));
  }
  std::cout << fmt::format(
      "output phase (1 rank): {:.2f} s = {:.1f}% of the end-to-end run, {:.1f}% of the scoring\n  ({})\n",
      one.run.output_seconds, 100.0 * output_of_run, 100.0 * output_of_scoring, fmt::join(by_output, ", "));
  const double small_mb = static_cast<double>(memory[0].child.max_rss_kb) / kMB;
  const double large_mb = static_cast<double>(memory[1].child.max_rss_kb) / kMB;
  std::cout << fmt::format(
      "\npeak memory, tessera infer 1 rank: {}x{} slide ({} tiles) {:.0f} MB, {}x{} slide ({} tiles) {:.0f} MB "
      "({:.2f}x)\n  (ru_maxrss; figures at or below {:.0f} MB, this process's own peak when it started them, would "
      "be that peak)\n",
      sides[0], sides[0], memory[0].tiles, small_mb, sides[1], sides[1], memory[1].tiles, large_mb, large_mb / small_mb,
      static_cast<double>(own_peak_kb) / kMB);

  if (!o.json_file.empty()) {
    json memory_json = json::array();
    for (std::size_t k = 0; k < sides.size(); ++k) {
      memory_json.push_back({{"side", sides[k]},
                             {"tiles", memory[k].tiles},
                             {"peak_mb", static_cast<double>(memory[k].child.max_rss_kb) / kMB},
                             {"seconds", memory[k].child.seconds}});
    }
    const json report = {
        {"model", o.model},
        {"tile_size", o.tile_size},
        {"mpp", o.mpp},
        {"stain", o.stain},
        {"stride", stride},
        {"slide", {{"path", slide_path}, {"width", slide.width()}, {"height", slide.height()}, {"mpp", slide.mpp()}}},
        {"tiles", tiles},
        {"outputs", outputs},
        {"rounds", o.rounds},
        {"cores", std::thread::hardware_concurrency()},
        {"cpu", cpu_name()},
        {"isa", cpu_isa()},
        {"python", python.rounds > 0 ? json{{"available", true},
                                            {"torch", python.run.result.value("torch", std::string())},
                                            {"threads", python.run.result.value("threads", 0)},
                                            {"tiles", python.run.result.at("tiles")},
                                            {"seconds", python.run.child.seconds},
                                            {"tiles_per_s", python_rate},
                                            {"cpu_seconds", python.cpu_seconds},
                                            {"phases", python.run.result.at("seconds")},
                                            {"tessera_one_rank_vs_python", one_rate / python_rate}}
                                     : json{{"available", false}, {"reason", python_missing}}},
        {"outputs_phase",
         {{"seconds", one.run.output_seconds},
          {"of_run", output_of_run},
          {"of_scoring", output_of_scoring},
          {"by_output", one.run.output_seconds_by_output}}},
        {"load_average", {{"start", load_before}, {"end", load_after}}},
        {"runs", {run_json(one, one_rate), run_json(many, one_rate)}},
        {"memory",
         {{"slides", memory_json},
          {"large_vs_small", large_mb / small_mb},
          {"own_peak_mb", static_cast<double>(own_peak_kb) / kMB}}},
        {"workdir", work.string()}};
    core::write_file_atomic(o.json_file, report.dump(2) + "\n");
  }
  return core::exit_ok;
}

}  // namespace tessera::bench
