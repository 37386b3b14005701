// tessera bench train / tessera bench infer — the CNN engine's speed on one model, against this machine's peak
// and against PyTorch, every figure measured in the same run:
//   1. the sgemm peak (bench/peak.h), with the same threads, at the start of every round;
//   2. Tessera: training steps (forward, softmax cross-entropy, backward, SGD step) or inference batches (eval
//      mode, batch norm folded) on one synthetic batch held in memory, so no I/O is measured;
//   3. PyTorch: the same model, input size, batch and threads in a child process (scripts/bench_torch.py --serve),
//      measured in rounds that alternate with Tessera's (A B, B A, A B, ...), because the machine is shared and
//      its speed drifts; medians of the rounds are reported.
// FLOP convention: Model::flops() (convolutions and linear layers, 2 FLOPs per multiply-add, forward); a training
// step counts 3× the forward FLOPs (forward, backward data, backward weights).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "bench/child.h"
#include "bench/peak.h"
#include "core/error.h"
#include "core/measure.h"
#include "engine/context.h"
#include "engine/layers/loss.h"
#include "engine/models/registry.h"
#include "engine/optim/optimizer.h"
#include "engine/precision.h"
#include "engine/sequential.h"
#include "engine/train_step.h"

extern char** environ;

namespace tessera::bench {
namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;
using nlohmann::json;

constexpr int kClasses = 2;              // tile classifiers: normal, tumour
constexpr int kPeakSize = 1024;          // sgemm n: near the peak, and short enough for many repeats per round
constexpr double kPeakMaxSeconds = 0.5;  // the peak's measuring time per round: min(this, the round's time)
constexpr double kTrainFlopFactor = 3.0;
constexpr double kLearningRate = 0.01;
constexpr double kMomentum = 0.9;
constexpr double kWeightDecay = 1e-4;
constexpr std::uint64_t kSeed = 1;
const char* const kFlopConvention =
    "Model::flops(): convolutions and linear layers, 2 FLOPs per multiply-add, forward; a training step counts "
    "3x the forward FLOPs (forward, backward data, backward weights)";

// ---------------------------------------------------------------------------------------------------------------
// Tessera's side.

// Sums the time of each child of the observed Sequentials, by module name, per pass.
class LayerTimer final : public engine::ModuleObserver {
 public:
  struct Times {
    double forward = 0.0;
    double backward = 0.0;
  };

  void begin(const engine::Module&, Pass) override { starts_.push_back(clock_type::now()); }
  void end(const engine::Module& child, Pass pass) override {
    const double dt = core::seconds_since(starts_.back());
    starts_.pop_back();
    Times& t = times_[child.name()];
    (pass == Pass::forward ? t.forward : t.backward) += dt;
  }
  const std::map<std::string, Times>& times() const { return times_; }

 private:
  std::vector<clock_type::time_point> starts_;  // nested Sequentials: a stack
  std::map<std::string, Times> times_;
};

struct ProfileRow {
  std::string layer, type, shape;
  double forward_ms = 0.0, backward_ms = 0.0, percent = 0.0;
};

struct Profile {
  int steps = 0;
  double step_ms = 0.0;       // per step
  double loss_ms = 0.0;       // softmax cross-entropy
  double optimizer_ms = 0.0;  // zero_grad and the SGD step
  double other_ms = 0.0;      // the rest: the logits' reorder and the calls between layers
  std::vector<ProfileRow> rows;
};

// One model with its synthetic batch, loss and optimizer; runs training steps or inference batches.
class TesseraRunner {
 public:
  TesseraRunner(ModelBenchKind kind, const ModelBenchOptions& o, engine::Precision precision = engine::Precision::fp32)
      : kind_(kind),
        batch_(o.batch),
        optimizer_(engine::OptimizerOptions{.momentum = kMomentum, .weight_decay = kWeightDecay}) {
    engine::ModelOptions model_options;
    model_options.architecture = o.model;
    model_options.input_size = o.size;
    model_options.num_classes = kClasses;
    model_options.seed = kSeed;
    try {
      model_ = engine::make_model(model_options);
    } catch (const core::ConfigError& e) {
      throw core::UsageError(fmt::format("--model {} --size {}: {}", o.model, o.size, e.message()));
    }
    parameter_count_ = model_->parameter_count();
    params_ = model_->parameters();
    input_ = engine::Tensor::plain({o.batch, 3, o.size, o.size});
    std::mt19937 rng(static_cast<std::uint32_t>(kSeed));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    float* x = input_.data();
    for (std::int64_t i = 0; i < input_.numel(); ++i) x[i] = normal(rng);

    if (kind_ == ModelBenchKind::infer) {
      model_->fold_batchnorm();  // eval mode, batch norm in the convolutions
      // int8 is calibrated on the benchmark's own batch (one fp32 forward): the scales change the values, not
      // the work.
      engine::ActivationRanges ranges;
      if (precision == engine::Precision::int8) {
        const engine::Calibrator calibrator(*model_);
        (void)model_->forward(input_);
        ranges = calibrator.ranges();
      }
      precision_ = engine::use_precision(*model_, precision, &ranges);
    } else {
      precision_ = engine::use_training_precision(*model_, precision, core::Comm::alone());
    }
    std::uniform_int_distribution<int> label(0, kClasses - 1);
    labels_.resize(static_cast<std::size_t>(o.batch));
    for (int& l : labels_) l = label(rng);
  }

  engine::Model& model() { return *model_; }
  // The precision the model computes in (fp32 when the CPU lacks the one asked for).
  engine::Precision precision() const { return precision_; }
  std::int64_t parameter_count() const { return parameter_count_; }

  void step() {
    if (kind_ == ModelBenchKind::infer) {
      model_->forward(input_);
      return;
    }
    engine::train_step(nullptr, params_, {}, 0, 1,
                       {.forward = [&](std::int64_t) { return loss_.forward(model_->forward(input_), labels_); },
                        .backward = [&] { model_->backward(loss_.backward()); },
                        .update = [&] { optimizer_.step(params_, kLearningRate); }});
  }

  // Images per second over at least one step and at least `seconds`.
  double measure(double seconds) {
    int steps = 0;
    const auto t0 = clock_type::now();
    double elapsed = 0.0;
    while (steps == 0 || elapsed < seconds) {
      step();
      ++steps;
      elapsed = core::seconds_since(t0);
    }
    return steps * static_cast<double>(batch_) / elapsed;
  }

  // Per-layer times over `steps` steps (at least one), with a timer on the model's body and on every
  // Sequential directly in it: the rows of Model::layers().
  Profile profile(int steps, int size) {
    LayerTimer timer;
    engine::Sequential& body = model_->body();
    std::vector<engine::Sequential*> observed = {&body};
    for (std::size_t i = 0; i < body.size(); ++i) {
      if (auto* seq = dynamic_cast<engine::Sequential*>(&body[i])) observed.push_back(seq);
    }
    for (auto* seq : observed) seq->set_observer(&timer);
    Profile p;
    p.steps = std::max(1, steps);
    double total = 0.0, loss = 0.0, optimizer = 0.0;
    for (int s = 0; s < p.steps; ++s) {
      const auto t0 = clock_type::now();
      if (kind_ == ModelBenchKind::infer) {
        model_->forward(input_);
      } else {
        engine::Optimizer::zero_grad(params_);
        optimizer += core::seconds_since(t0);
        const engine::Tensor& logits = model_->forward(input_);
        const auto t1 = clock_type::now();
        loss_.forward(logits, labels_);
        const engine::Tensor& diff = loss_.backward();
        loss += core::seconds_since(t1);
        model_->backward(diff);
        const auto t2 = clock_type::now();
        optimizer_.step(params_, kLearningRate);
        optimizer += core::seconds_since(t2);
      }
      total += core::seconds_since(t0);
    }
    for (auto* seq : observed) seq->set_observer(nullptr);

    const double per_step_ms = 1e3 / p.steps;
    p.step_ms = total * per_step_ms;
    p.loss_ms = loss * per_step_ms;
    p.optimizer_ms = optimizer * per_step_ms;
    double layers_ms = 0.0;
    for (const auto& row : model_->layers(size)) {
      const auto it = timer.times().find(row.name);
      if (it == timer.times().end()) {
        throw core::InternalError(fmt::format("bench profile: layer '{}' was never timed", row.name));
      }
      ProfileRow r{
          row.name, row.type, row.output.text(), it->second.forward * per_step_ms, it->second.backward * per_step_ms,
          0.0};
      r.percent = p.step_ms > 0.0 ? 100.0 * (r.forward_ms + r.backward_ms) / p.step_ms : 0.0;
      layers_ms += r.forward_ms + r.backward_ms;
      p.rows.push_back(std::move(r));
    }
    p.other_ms = std::max(0.0, p.step_ms - layers_ms - p.loss_ms - p.optimizer_ms);
    return p;
  }

 private:
  ModelBenchKind kind_;
  int batch_;
  std::unique_ptr<engine::Model> model_;
  engine::Precision precision_ = engine::Precision::fp32;
  std::int64_t parameter_count_ = 0;
  std::vector<engine::Param*> params_;
  engine::Tensor input_;
  std::vector<int> labels_;
  engine::SoftmaxCrossEntropy loss_;
  engine::Sgd optimizer_;
};

// ---------------------------------------------------------------------------------------------------------------
// PyTorch's side: scripts/bench_torch.py --serve as a child, one JSON line per request.

class TorchProcess {
 public:
  explicit TorchProcess(const std::vector<std::string>& args) {
    int in[2], out[2];
    core::check_errno(pipe2(in, O_CLOEXEC) == 0, "bench: pipe to the PyTorch benchmark");
    if (pipe2(out, O_CLOEXEC) != 0) {
      const int saved = errno;
      close(in[0]);
      close(in[1]);
      errno = saved;
      core::check_errno(false, "bench: pipe from the PyTorch benchmark");
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    to_child_ = in[1];
    from_child_ = fdopen(out[0], "r");
    if (rc != 0) {
      pid_ = -1;
      start_error_ = fmt::format("cannot start {}: {}", args[0], std::strerror(rc));
    }
  }
  ~TorchProcess() {
    if (to_child_ >= 0) close(to_child_);  // end of input: the child leaves its loop and exits
    if (from_child_ != nullptr) std::fclose(from_child_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  TorchProcess(const TorchProcess&) = delete;
  TorchProcess& operator=(const TorchProcess&) = delete;

  // Empty when the process started.
  const std::string& start_error() const { return start_error_; }

  json read() {
    char* line = nullptr;
    std::size_t capacity = 0;
    const ssize_t n = getline(&line, &capacity, from_child_);
    std::string text = n > 0 ? std::string(line, static_cast<std::size_t>(n)) : std::string();
    std::free(line);
    if (n <= 0) {
      int status = 0;
      std::string how = "ended";
      if (pid_ > 0 && waitpid(pid_, &status, 0) == pid_) {
        pid_ = -1;
        how = WIFEXITED(status) ? fmt::format("exited with code {}", WEXITSTATUS(status))
                                : fmt::format("was killed by signal {}", WTERMSIG(status));
      }
      throw core::InternalError(fmt::format(
          "the PyTorch benchmark (scripts/bench_torch.py) {} before answering; its messages are above", how));
    }
    try {
      return json::parse(text);
    } catch (const json::exception&) {
      throw core::InternalError(
          fmt::format("the PyTorch benchmark (scripts/bench_torch.py) printed something that is not JSON: {}", text));
    }
  }

  void request(double seconds) {
    const std::string line = fmt::format("measure {:.6f}\n", seconds);
    if (write(to_child_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      throw core::InternalError(fmt::format("cannot write to the PyTorch benchmark: {}", std::strerror(errno)));
    }
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
  FILE* from_child_ = nullptr;
  std::string start_error_;
};

// ---------------------------------------------------------------------------------------------------------------
// Report.

struct Side {
  std::vector<double> rounds;     // images/s
  std::vector<double> fractions;  // GFLOP/s of each round / the peak measured at the start of that round
  double images_per_s = 0.0;      // median of the rounds
  double gflops = 0.0;
  double fraction_of_peak = 0.0;  // median of the fractions: the machine's load drifts between rounds

  void add(double round_images_per_s, double gflop_per_image, double peak_gflops) {
    rounds.push_back(round_images_per_s);
    fractions.push_back(round_images_per_s * gflop_per_image / peak_gflops);
  }
};

void summarise(Side& side, double gflop_per_image) {
  side.images_per_s = core::median(side.rounds);
  side.gflops = side.images_per_s * gflop_per_image;
  side.fraction_of_peak = core::median(side.fractions);
}

json side_json(const Side& side) {
  return {{"images_per_s", side.images_per_s},
          {"gflops", side.gflops},
          {"fraction_of_peak", side.fraction_of_peak},
          {"rounds_images_per_s", side.rounds}};
}

std::string rounds_text(const std::vector<double>& rounds) {
  std::string out;
  for (double r : rounds) out += fmt::format("{}{:.1f}", out.empty() ? "" : " ", r);
  return out;
}

}  // namespace

int run_bench_model(ModelBenchKind kind, const ModelBenchOptions& o) {
  const bool train = kind == ModelBenchKind::train;
  const char* verb = train ? "train" : "infer";
  auto& context = engine::Context::get();
  context.set_threads(o.threads);
  const int threads = context.threads();

  TesseraRunner tessera(kind, o);
  const double forward_gflop = static_cast<double>(tessera.model().flops(o.size)) * 1e-9;
  const double gflop_per_image = forward_gflop * (train ? kTrainFlopFactor : 1.0);

  // PyTorch first: it imports, builds and warms up while nothing else runs.
  std::unique_ptr<TorchProcess> torch;
  json torch_facts;
  std::string torch_missing;
  if (!o.torch) {
    torch_missing = "not measured (--no-torch)";
  } else {
    const std::string script = (fs::path(TESSERA_SOURCE_DIR) / "scripts" / "bench_torch.py").string();
    if (!fs::exists(script)) {
      torch_missing = fmt::format("not measured: {} is missing", script);
    } else {
      torch = std::make_unique<TorchProcess>(std::vector<std::string>{
          "/usr/bin/python3", script, "--serve", "--model", o.model, "--mode", verb, "--size", std::to_string(o.size),
          "--batch", std::to_string(o.batch), "--classes", std::to_string(kClasses), "--threads",
          std::to_string(threads), "--warmup", std::to_string(o.warmup)});
      if (!torch->start_error().empty()) {
        torch_missing = fmt::format("not measured: {}", torch->start_error());
        torch.reset();
      } else {
        torch_facts = torch->read();
        if (!torch_facts.value("available", false)) {
          torch_missing = fmt::format(
              "not measured: /usr/bin/python3 cannot import what {} needs ({}); "
              "`make bench` installs PyTorch and h5py (scripts/install-deps.sh --bench)",
              fs::path(script).filename().string(), torch_facts.value("error", std::string("no torch")));
          torch.reset();
        } else if (torch_facts.at("parameters").get<std::int64_t>() != tessera.parameter_count()) {
          throw core::InternalError(fmt::format(
              "{}: the PyTorch model ({}) has {} parameters, Tessera's {}: the two are not the same network", o.model,
              torch_facts.value("source", std::string("?")),
              core::grouped(torch_facts.at("parameters").get<std::int64_t>()),
              core::grouped(tessera.parameter_count())));
        }
      }
    }
  }

  // --precision bf16|int8 (train: bf16): the same model again in reduced precision, measured beside fp32 in every
  // round.
  std::unique_ptr<TesseraRunner> reduced;
  std::string reduced_missing;
  const engine::Precision wanted = engine::parse_precision(o.precision, "--precision");
  if (wanted != engine::Precision::fp32) {
    reduced = std::make_unique<TesseraRunner>(kind, o, wanted);
    if (reduced->precision() != wanted) {
      reduced_missing = fmt::format("not measured: needs {}, oneDNN's instruction set here is {}",
                                    train                               ? "AMX"
                                    : wanted == engine::Precision::int8 ? "VNNI"
                                                                        : "AVX-512 BF16",
                                    engine::cpu_isa_name());
      reduced.reset();
    }
  }

  for (int i = 0; i < o.warmup; ++i) tessera.step();
  for (int i = 0; reduced && i < o.warmup; ++i) reduced->step();

  // Rounds of peak, A, B, then peak, B, A, ...: neither framework always runs first after the other, and each
  // is compared with the peak of its own round.
  const double per_round = o.seconds / o.rounds;
  const double peak_seconds = std::min(kPeakMaxSeconds, per_round);
  std::vector<double> peaks;
  bench::PeakResult peak;
  Side ours, theirs, low;  // low: the reduced-precision model
  for (int r = 0; r < o.rounds; ++r) {
    peak = bench::measure_sgemm_peak(kPeakSize, threads, peak_seconds);
    peaks.push_back(peak.gflops);
    const bool ours_first = r % 2 == 0 || !torch;
    // Reduced precision right before fp32 in even rounds, right after it in odd ones.
    if (reduced && r % 2 == 0) low.add(reduced->measure(per_round), gflop_per_image, peak.gflops);
    if (ours_first) ours.add(tessera.measure(per_round), gflop_per_image, peak.gflops);
    if (torch) {
      torch->request(per_round);
      theirs.add(torch->read().at("images_per_s").get<double>(), gflop_per_image, peak.gflops);
    }
    if (!ours_first) ours.add(tessera.measure(per_round), gflop_per_image, peak.gflops);
    if (reduced && r % 2 == 1) low.add(reduced->measure(per_round), gflop_per_image, peak.gflops);
  }
  const double peak_gflops = core::median(peaks);
  summarise(ours, gflop_per_image);
  if (torch) summarise(theirs, gflop_per_image);
  if (reduced) summarise(low, gflop_per_image);
  // The speed-up of each round (its two measurements ran back to back, under the same load) and their median.
  std::vector<double> low_ratios;
  for (std::size_t r = 0; reduced && r < low.rounds.size(); ++r) low_ratios.push_back(low.rounds[r] / ours.rounds[r]);
  const double low_speedup = reduced ? core::median(low_ratios) : 0.0;
  const double ratio = torch ? ours.images_per_s / theirs.images_per_s : 0.0;
  torch.reset();  // the child exits before the profile runs

  // Profiles over about one round's time each (the reduced-precision model's too).
  std::optional<Profile> profile, reduced_profile;
  if (o.profile) {
    const auto steps_in_round = [&](const Side& side) {
      return std::clamp(static_cast<int>(per_round * side.images_per_s / o.batch), 1, 1000);
    };
    profile = tessera.profile(steps_in_round(ours), o.size);
    if (reduced) reduced_profile = reduced->profile(steps_in_round(low), o.size);
  }

  const std::string what =
      train ? "training step: forward + softmax cross-entropy + backward + SGD (momentum 0.9, weight decay 1e-4)"
            : "inference: eval mode, batch norm folded into the convolutions (PyTorch: eval, inference_mode)";
  if (o.json) {
    json out = {{"bench", verb},
                {"model", o.model},
                {"size", o.size},
                {"batch", o.batch},
                {"classes", kClasses},
                {"threads", threads},
                {"cpu", cpu_name()},
                {"cpu_isa", engine::cpu_isa_name()},
                {"rounds", o.rounds},
                {"seconds_per_round", per_round},
                {"step", what},
                {"flop_convention", kFlopConvention},
                {"forward_gflop_per_image", forward_gflop},
                {"gflop_per_image", gflop_per_image},
                {"peak", {{"gflops", peak_gflops}, {"rounds_gflops", peaks}, {"n", peak.n}, {"threads", peak.threads}}},
                {"parameters", tessera.parameter_count()}};
    out["tessera"] = side_json(ours);
    if (reduced) {
      json r = side_json(low);
      r["precision"] = o.precision;
      r["speedup_vs_fp32"] = low_speedup;
      r["rounds_speedup_vs_fp32"] = low_ratios;
      out["tessera_reduced"] = r;
    } else if (!reduced_missing.empty()) {
      out["tessera_reduced"] = {{"precision", o.precision}, {"available", false}, {"reason", reduced_missing}};
    }
    if (!torch_missing.empty()) {
      out["pytorch"] = {{"available", false}, {"reason", torch_missing}};
      out["ratio"] = nullptr;
    } else {
      json p = side_json(theirs);
      p["available"] = true;
      p["version"] = torch_facts.value("torch", std::string());
      p["parameters"] = torch_facts.at("parameters");
      p["source"] = torch_facts.value("source", std::string());
      p["mkldnn"] = torch_facts.value("mkldnn", false);
      out["pytorch"] = p;
      out["ratio"] = ratio;
    }
    const auto profile_json = [](const Profile& p) {
      json rows = json::array();
      for (const auto& r : p.rows) {
        rows.push_back({{"layer", r.layer},
                        {"type", r.type},
                        {"shape", r.shape},
                        {"forward_ms", r.forward_ms},
                        {"backward_ms", r.backward_ms},
                        {"percent", r.percent}});
      }
      return json{{"steps", p.steps},       {"step_ms", p.step_ms},
                  {"loss_ms", p.loss_ms},   {"optimizer_ms", p.optimizer_ms},
                  {"other_ms", p.other_ms}, {"layers", rows}};
    };
    if (profile) out["profile"] = profile_json(*profile);
    if (reduced_profile) out["tessera_reduced"]["profile"] = profile_json(*reduced_profile);
    std::cout << out.dump(2) << "\n";
    return core::exit_ok;
  }

  std::cout << fmt::format("tessera bench {}: {}, {}x{} px, batch {}, {} classes; {} threads on {}\n", verb, o.model,
                           o.size, o.size, o.batch, kClasses, threads, cpu_name());
  std::cout << fmt::format("{}; synthetic data in memory\n", what);
  std::cout << fmt::format("oneDNN ISA: {}\n", engine::cpu_isa_name());
  std::cout << fmt::format(
      "work: {:.4g} GFLOP per image forward (convolutions and linear layers, 2 FLOPs per "
      "multiply-add){}\n",
      forward_gflop,
      train ? fmt::format("; a training image counts 3x: {:.4g} GFLOP (forward, backward data, "
                          "backward weights)",
                          gflop_per_image)
            : "");
  std::cout << fmt::format(
      "peak: {:.1f} GFLOP/s (oneDNN sgemm {}^3, {} threads, best over >= {:g} s at the start of "
      "every round; rounds: {})\n",
      peak_gflops, peak.n, peak.threads, peak_seconds, rounds_text(peaks));
  std::cout << fmt::format(
      "{} rounds of >= {:.2f} s per framework{}; medians (of peak: median of each round's "
      "GFLOP/s / that round's peak)\n\n",
      o.rounds, per_round, torch_missing.empty() ? ", Tessera and PyTorch alternating" : "");
  std::cout << fmt::format("{:<16} {:>10} {:>9} {:>8}   {}\n", "", "images/s", "GFLOP/s", "of peak",
                           "rounds (images/s)");
  std::cout << fmt::format("{:<16} {:>10.1f} {:>9.1f} {:>7.1f}%   {}\n", "Tessera", ours.images_per_s, ours.gflops,
                           100.0 * ours.fraction_of_peak, rounds_text(ours.rounds));
  if (reduced) {
    std::cout << fmt::format("{:<16} {:>10.1f} {:>9.1f} {:>7.1f}%   {}\n", fmt::format("Tessera {}", o.precision),
                             low.images_per_s, low.gflops, 100.0 * low.fraction_of_peak, rounds_text(low.rounds));
  } else if (!reduced_missing.empty()) {
    std::cout << fmt::format("{:<16} {}\n", fmt::format("Tessera {}", o.precision), reduced_missing);
  }
  if (torch_missing.empty()) {
    std::cout << fmt::format("{:<16} {:>10.1f} {:>9.1f} {:>7.1f}%   {}\n",
                             fmt::format("PyTorch {}", torch_facts.value("torch", std::string())), theirs.images_per_s,
                             theirs.gflops, 100.0 * theirs.fraction_of_peak, rounds_text(theirs.rounds));
    std::cout << fmt::format("\nTessera / PyTorch: {:.2f}x\n", ratio);
    std::cout << fmt::format("parameters: {} in both (PyTorch model from {})\n",
                             core::grouped(tessera.parameter_count()), torch_facts.value("source", std::string("?")));
  } else {
    std::cout << fmt::format("{:<16} {}\n", "PyTorch", torch_missing);
    std::cout << fmt::format("\nparameters: {}\n", core::grouped(tessera.parameter_count()));
  }
  if (reduced) {
    std::cout << fmt::format(
        "Tessera {} / Tessera fp32: {:.2f}x (median of the rounds' ratios: {}; the same model and batch, measured "
        "back to back in each round)\n",
        o.precision, low_speedup, fmt::format("{:.2f}", fmt::join(low_ratios, " ")));
  }
  const auto print_profile = [&](const std::string& who, const Profile& p) {
    std::cout << fmt::format("\nprofile: {}, mean of {} step(s), {:.2f} ms per step\n", who, p.steps, p.step_ms);
    std::cout << fmt::format("{:<18} {:<18} {:<12} {:>11} {:>12} {:>7}\n", "layer", "type", "output", "forward ms",
                             "backward ms", "% step");
    for (const auto& r : p.rows) {
      std::cout << fmt::format("{:<18} {:<18} {:<12} {:>11.2f} {:>12} {:>6.1f}%\n", r.layer, r.type, r.shape,
                               r.forward_ms, train ? fmt::format("{:.2f}", r.backward_ms) : "-", r.percent);
    }
    const auto extra = [&](const char* name, double ms) {
      std::cout << fmt::format("{:<50} {:>11.2f} {:>12} {:>6.1f}%\n", name, ms, "",
                               p.step_ms > 0 ? 100.0 * ms / p.step_ms : 0.0);
    };
    if (train) {
      extra("loss (softmax cross-entropy)", p.loss_ms);
      extra("zero_grad + SGD step", p.optimizer_ms);
    }
    extra("rest (logits reorder, calls)", p.other_ms);
  };
  if (profile) print_profile("Tessera", *profile);
  if (reduced_profile) print_profile(fmt::format("Tessera {}", o.precision), *reduced_profile);
  return core::exit_ok;
}

}  // namespace tessera::bench
