// tessera bench scale — how the distributed strategies behave on clusters of 2 to 1024 ranks, simulated with
// SimGrid's SMPI running Tessera's own exchange code (sim/simulate.cpp, sim/README.md; issue 8).
//
//   1. Calibration: each model's training step (forward, loss, backward, SGD) at --batch images, timed here on one
//      core; a simulated rank computes --node-speed times faster.
//   2. Validation: `tessera bench comm` measures 2 ranks on this machine (each strategy's step time, and the
//      allreduce latency and bandwidth); a platform file of this machine is written from those figures and each
//      strategy is simulated on it with the measured computation. The simulated and measured step times are
//      reported side by side with their error.
//   3. The sweep: for every platform, model, rank count and strategy (easgd-type at --tau), and easgd's tau sweep
//      at --tau-sweep-ranks, one smpirun of the simulator. Every rank's model is shrunk to about --payload-kb and
//      the platform's bandwidths are divided by the same factor: each message's transfer time is the full
//      model's, latencies are unchanged (sim/README.md says what that leaves out).
// Written into --out: scale.csv (one row per simulation), scale.json (the same, the calibration, validation
// and assumptions), efficiency-<platform>-<model>.png and comm-<platform>-<model>.png. Every figure is simulated.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pugixml.hpp>

#include "analysis/plot.h"
#include "bench/bench.h"
#include "bench/child.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/measure.h"
#include "engine/context.h"
#include "engine/models/model.h"
#include "io/image.h"

#ifndef TESSERA_SIMULATOR_LIBRARY
#define TESSERA_SIMULATOR_LIBRARY ""
#endif

namespace tessera::bench {
namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;
using nlohmann::json;

const char* const kSimPrefix = "tessera-simulate: ";
constexpr int kCalibrationWarmup = 2;  // untimed steps (the first builds the primitives)
constexpr double kCalibrationSeconds = 4.0;
constexpr int kCalibrationMinSteps = 3;
// What every simulation runs with (sim/README.md): no computation timed but the calibrated delays, network
// factors of 1 (a message of n bytes over a link takes latency + n / bandwidth, so shrinking payload and
// bandwidth together keeps every transfer's time), Rabenseifner's allreduce (reduce-scatter + allgather, what
// Open MPI and MPICH use for large messages) at every size, the other collectives as Open MPI selects them.
constexpr double kEagerBytes = 65536;  // SMPI's smpi/send-is-detached-thresh default
const std::vector<std::string> kSmpiConfig = {
    "--cfg=smpi/privatization:no", "--cfg=smpi/coll-selector:ompi", "--cfg=smpi/allreduce:rab_rdb",
    "--cfg=smpi/bw-factor:0:1",    "--cfg=smpi/lat-factor:0:1",     "--log=root.thresh:warning",
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<int> int_list(const std::string& text, const char* flag) {
  std::vector<int> out;
  for (const auto& item : split_list(text)) {
    try {
      out.push_back(std::stoi(item));
    } catch (const std::logic_error&) {
      throw core::UsageError(fmt::format("bench scale: {} '{}': '{}' is not a whole number", flag, text, item));
    }
  }
  return out;
}

// "a=1,b=2" → {a: "1", b: "2"}
std::map<std::string, std::string> key_values(const std::string& text, const char* flag) {
  std::map<std::string, std::string> out;
  for (const auto& item : split_list(text)) {
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      throw core::UsageError(fmt::format("bench scale: {}: '{}' is not model=value", flag, item));
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

// A model as the simulator sees it: its tensors' sizes (sim/simulate.cpp's layout file) and one step's time.
struct ModelFacts {
  std::string name;
  int size = 0;
  std::int64_t parameters = 0;
  std::int64_t buffer_values = 0;
  double step_seconds = 0.0;  // one core here, --batch images
  std::string layout;         // file
  bool measured = false;
};

ModelFacts calibrate(const std::string& name, int size, int batch, const std::string& given_seconds,
                     const fs::path& dir) {
  ModelFacts m;
  m.name = name;
  m.size = size;
  engine::Context::get().set_threads(1);
  SyntheticTraining training(name, size, batch, 0);
  std::ofstream layout(dir / (name + ".layout"));
  layout << "# " << name << " at " << size << " px: one line per parameter, then per buffer (element counts)\n";
  for (const auto* p : training.params()) {
    layout << "param " << p->numel() << "\n";
    m.parameters += p->numel();
  }
  for (const auto* b : training.buffers()) {
    layout << "buffer " << b->value.size() << "\n";
    m.buffer_values += static_cast<std::int64_t>(b->value.size());
  }
  m.layout = (dir / (name + ".layout")).string();
  if (!given_seconds.empty()) {
    try {
      m.step_seconds = std::stod(given_seconds);
    } catch (const std::logic_error&) {
      m.step_seconds = 0.0;
    }
    if (!(m.step_seconds > 0.0)) {
      throw core::UsageError(
          fmt::format("bench scale: --compute {}={}: not a positive number of seconds", name, given_seconds));
    }
    return m;
  }
  for (int i = 0; i < kCalibrationWarmup; ++i) training.step(nullptr, 0);
  int steps = 0;
  const auto t0 = clock_type::now();
  while (steps < kCalibrationMinSteps || core::seconds_since(t0) < kCalibrationSeconds) {
    training.step(nullptr, steps + 1);
    ++steps;
  }
  m.step_seconds = core::seconds_since(t0) / steps;
  m.measured = true;
  return m;
}

// "12.5GBps" / 64 → "0.1953125GBps": the number divided, the unit kept.
std::string divide_rate(const std::string& value, double by) {
  std::size_t end = 0;
  const double number = std::stod(value, &end);
  return fmt::format("{:.10g}{}", number / by, value.substr(end));
}

struct Platform {
  std::string name;
  fs::path source;
  std::vector<std::string> hosts;  // in order
  int cores = 1;
};

Platform read_platform(const std::string& name_or_path) {
  Platform p;
  p.source = fs::path(name_or_path);
  if (p.source.extension() != ".xml")
    p.source = fs::path(TESSERA_SOURCE_DIR) / "sim" / "platforms" / (name_or_path + ".xml");
  p.name = p.source.stem().string();
  pugi::xml_document doc;
  const auto parsed = doc.load_file(p.source.c_str());
  if (!parsed) throw core::InputError(fmt::format("not a platform file: {}", parsed.description()), p.source.string());
  for (const auto& cluster : doc.select_nodes("//cluster")) {
    const auto c = cluster.node();
    const std::string radical = c.attribute("radical").value();
    const auto dash = radical.find('-');
    if (dash == std::string::npos) throw core::InputError("cluster radical must be 'first-last'", p.source.string());
    const int first = std::stoi(radical.substr(0, dash));
    const int last = std::stoi(radical.substr(dash + 1));
    for (int i = first; i <= last; ++i) {
      p.hosts.push_back(fmt::format("{}{}{}", c.attribute("prefix").value(), i, c.attribute("suffix").value()));
    }
    p.cores = std::max(1, c.attribute("core").as_int(1));
  }
  if (p.hosts.empty()) throw core::InputError("no <cluster> with hosts", p.source.string());
  return p;
}

// The platform with every bandwidth divided by `scale`, written to `out`.
void write_scaled_platform(const Platform& p, double scale, const fs::path& out) {
  pugi::xml_document doc;
  doc.load_file(p.source.c_str(), pugi::parse_full);  // the declaration and DOCTYPE, which SimGrid's parser wants
  for (const auto& node : doc.select_nodes("//*")) {
    for (const char* attr : {"bw", "bb_bw", "loopback_bw", "bandwidth"}) {
      auto a = node.node().attribute(attr);
      if (a) a.set_value(divide_rate(a.value(), scale).c_str());
    }
  }
  if (!doc.save_file(out.c_str(), "  ", pugi::format_default | pugi::format_no_declaration))
    throw core::InputError("cannot write the platform file", out.string());
}

bool fits(const Platform& p, int ranks, int per_host) { return ranks <= static_cast<int>(p.hosts.size()) * per_host; }

// `per_host` ranks on each host in order: rank r on host r / per_host. The ranks must fit().
void write_hostfile(const Platform& p, int ranks, int per_host, const fs::path& out) {
  std::ofstream f(out);
  for (int r = 0; r < ranks; ++r) f << p.hosts[static_cast<std::size_t>(r / per_host)] << "\n";
  if (!f) throw core::InputError("cannot write the host file", out.string());
}

struct Simulation {
  std::string platform, model, strategy;
  int ranks = 0;  // training ranks (central-easgd adds its server)
  int tau = 0;
  std::string inter;
  json result;  // the simulator's line
  std::string failure;
  bool skipped = false;  // not run: the platform has no room for its ranks
  double wall_seconds = 0.0;
};

class Simulator {
 public:
  Simulator(std::string library, std::string smpirun, fs::path work, double timeout)
      : library_(std::move(library)), smpirun_(std::move(smpirun)), work_(std::move(work)), timeout_(timeout) {}

  // The storage every simulated checkpoint is written to (sim/simulate.cpp --disk-mbps, --fs-gbps).
  void set_storage(double disk_mbps, double fs_gbps) {
    storage_ = {"--disk-mbps", fmt::format("{:.10g}", disk_mbps), "--fs-gbps", fmt::format("{:.10g}", fs_gbps)};
  }

  // One smpirun. `extra` adds SMPI settings (the validation times local computation too).
  Simulation run(const Platform& platform, const fs::path& platform_file, int per_host, const ModelFacts& model,
                 double payload_scale, double compute, const std::string& strategy, int ranks, int tau,
                 const std::string& inter, int steps, const std::vector<std::string>& extra = {}) {
    Simulation s{platform.name, model.name, strategy, ranks, tau, inter, {}, {}, false, 0.0};
    const int np = strategy == "central-easgd" ? ranks + 1 : ranks;
    if (!fits(platform, np, per_host)) {  // a point the platform has no room for: listed, not run
      s.failure = fmt::format("skipped: {} ranks do not fit on {} ({} hosts x {} ranks)", np, platform.name,
                              platform.hosts.size(), per_host);
      s.skipped = true;
      return s;
    }
    const fs::path hostfile = work_ / fmt::format("hosts-{}-{}-{}", platform.name, np, per_host);
    write_hostfile(platform, np, per_host, hostfile);
    std::vector<std::string> args = {
        smpirun_, "-np", std::to_string(np), "-platform", platform_file.string(), "-hostfile", hostfile.string()};
    args.insert(args.end(), kSmpiConfig.begin(), kSmpiConfig.end());
    // Sends of less than 64 KiB are eager (the sender goes on) in SMPI as in MPI libraries: the threshold shrinks
    // with the payload, so every message keeps the protocol it has at the model's full size.
    args.push_back(fmt::format("--cfg=smpi/send-is-detached-thresh:{}",
                               std::max<long>(1, std::lround(kEagerBytes / payload_scale))));
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {library_, "--strategy", strategy, "--layout", model.layout, "--payload-scale",
                             fmt::format("{:.10g}", payload_scale), "--steps", std::to_string(steps), "--compute",
                             fmt::format("{:.10g}", compute), "--tau", std::to_string(tau)});
    if (!inter.empty()) args.insert(args.end(), {"--inter", inter});
    args.insert(args.end(), storage_.begin(), storage_.end());
    const auto t0 = clock_type::now();
    const std::string log = (work_ / "simulations.log").string();
    const ChildResult run = run_child(args, log, timeout_);
    const auto results = result_lines(log, kSimPrefix);
    s.wall_seconds = core::seconds_since(t0);
    if (run.timed_out) {
      s.failure = fmt::format("stopped after {:.0f} s", timeout_);
    } else if (run.code != 0) {
      s.failure = run.code > 0 ? fmt::format("exit code {}", run.code) : "killed by a signal";
    } else if (results.size() != 1) {
      s.failure = "no result line";
    } else {
      s.result = results.front();
    }
    return s;
  }

 private:
  std::string library_, smpirun_;
  fs::path work_;
  double timeout_;
  std::vector<std::string> storage_;
};

std::string percent(double f) { return fmt::format("{:.1f}%", 100.0 * f); }

std::string series_label(const Simulation& s) {
  if (s.strategy == "allreduce") return "allreduce";
  if (s.strategy == "two-level")
    return fmt::format("two-level ({})", s.inter == "easgd" ? fmt::format("easgd t{}", s.tau) : "allreduce");
  return fmt::format("{} t{}", s.strategy, s.tau);
}

void write_plots(const std::vector<Simulation>& sims, const fs::path& out, const std::string& platform,
                 const std::string& model, int max_ranks) {
  const std::vector<cv::Scalar> colours = {{0, 114, 178},  {213, 94, 0},  {0, 158, 115}, {204, 121, 167},
                                           {86, 180, 233}, {230, 159, 0}, {0, 0, 0}};
  for (const bool efficiency : {true, false}) {
    analysis::Chart chart;
    chart.title = fmt::format("{} on {}: {} (SIMULATED)", model, platform,
                              efficiency ? "weak-scaling efficiency" : "communication fraction of the step");
    chart.subtitle = "SimGrid SMPI running Tessera's exchange code; computation = calibrated delay";
    chart.x_label = "ranks";
    chart.y_label = efficiency ? "efficiency (compute / step time)" : "communication / step time";
    chart.x_log2 = true;
    chart.x_min = 2;
    chart.x_max = max_ranks;
    for (double x = 2; x <= max_ranks; x *= 2) chart.x_ticks.push_back(x);
    chart.y_min = 0;
    chart.y_max = 1;
    chart.y_ticks = {0, 0.2, 0.4, 0.6, 0.8, 1.0};
    std::map<std::string, analysis::PlotSeries> by_label;
    std::vector<std::string> order;
    for (const auto& s : sims) {
      if (s.platform != platform || s.model != model || !s.failure.empty() || s.result.is_null()) continue;
      const std::string label = series_label(s);
      if (!by_label.count(label)) {
        order.push_back(label);
        by_label[label].label = label;
        by_label[label].rgb = colours[(order.size() - 1) % colours.size()];
      }
      const double y =
          efficiency ? s.result.at("efficiency").get<double>() : s.result.at("comm_fraction").get<double>();
      by_label[label].points.emplace_back(s.ranks, y);
    }
    for (const auto& label : order) {
      auto series = by_label[label];
      std::sort(series.points.begin(), series.points.end(), [](auto a, auto b) { return a.x < b.x; });
      if (series.points.size() > 1) chart.series.push_back(series);
    }
    if (chart.series.empty()) chart.note = "no simulation finished";
    io::write_png(out / fmt::format("{}-{}-{}.png", efficiency ? "efficiency" : "comm", platform, model),
                  analysis::render_chart(chart));
  }
}

// The validation: a run measured by `tessera bench comm` — 2 ranks on this machine, run here, or the report given
// with --measured (e.g. one rank on each of 2 test hosts) — against the simulation of a platform written from the
// same run's allreduce sweep (the calibration); the strategies' rows are what it is checked against.
json validate(Simulator& simulator, const ScaleBenchOptions& o, const fs::path& work, const ModelFacts& compact) {
  json measured;
  if (!o.measured.empty()) {
    std::ifstream in(o.measured);
    try {
      measured = json::parse(in);
    } catch (const json::exception& e) {
      throw core::InputError(fmt::format("not a `bench comm --json` report: {}", e.what()), o.measured);
    }
    if (measured.value("bench", "") != "comm" || !measured.contains("strategies") || !measured.contains("bandwidth")) {
      throw core::InputError("not a `bench comm --json` report (no strategies or bandwidth)", o.measured);
    }
  } else {
    const fs::path report = work / "bench-comm.json";
    const std::vector<std::string> args = {self_path(),
                                           "bench",
                                           "comm",
                                           "--ranks",
                                           "2",
                                           "--model",
                                           compact.name,
                                           "--size",
                                           std::to_string(compact.size),
                                           "--batch",
                                           std::to_string(o.batch),
                                           "--steps",
                                           "16",
                                           "--rounds",
                                           "2",
                                           "--json",
                                           report.string()};
    std::cout << "validation: measuring 2 ranks on this machine (tessera bench comm) ..." << std::endl;
    const std::string log = (work / "bench-comm.log").string();
    require_ok(run_child(args, log, o.timeout), "bench scale: the measured 2-rank run (tessera bench comm)", log);
    std::ifstream in(report);
    measured = json::parse(in);
  }
  int ranks = 0, hosts = 1;
  try {
    ranks = measured.at("ranks").get<int>();
    hosts = std::clamp(measured.value("hosts", 1), 1, std::max(ranks, 1));
    (void)measured.at("steps").get<int>();
    (void)measured.at("no_exchange").at("step_s").get<double>();
  } catch (const json::exception& e) {
    throw core::InputError(fmt::format("not a complete `bench comm --json` report: {}", e.what()), o.measured);
  }
  // The calibration reads the link from a 2-rank allreduce (2 messages, n bytes each way): 2 ranks on this machine,
  // or one on each of 2 hosts.
  if (ranks != 2) {
    throw core::InputError(fmt::format("the report has {} ranks on {} host(s); the link is calibrated from a 2-rank "
                                       "run (2 ranks on one host, or one on each of 2 hosts)",
                                       ranks, hosts),
                           o.measured.empty() ? std::string("bench-comm.json") : o.measured);
  }
  const int per_host = (ranks + hosts - 1) / hosts;
  // Latency and bandwidth of the link from the allreduce (2 ranks, reduce-scatter + allgather: 2 messages' latency
  // and n bytes each way): from the smallest message and the largest one of at most 4 MB. One host: shared memory,
  // the loopback link. Several: each message crosses two links (its host's and the other's), full duplex.
  const auto& rows = measured.at("bandwidth");
  if (rows.size() < 2) throw core::InternalError("bench scale: bench comm measured no allreduce bandwidth");
  const json* small = &rows.front();
  const json* large = &rows.front();
  for (const auto& r : rows) {
    if (r.at("bytes").get<double>() <= 4.0 * (1 << 20)) large = &r;
  }
  const double links = hosts > 1 ? 2.0 : 1.0;
  const double ns = small->at("bytes").get<double>(), ts = small->at("seconds").get<double>();
  const double nl = large->at("bytes").get<double>(), tl = large->at("seconds").get<double>();
  const double per_byte = std::max(1e-12, (tl - ts) / (nl - ns));
  const double latency = std::max(1e-7, (ts - ns * per_byte) / (2.0 * links));
  const double bandwidth = 1.0 / per_byte;
  const fs::path platform_file = work / (hosts > 1 ? "measured-hosts.xml" : "this-machine.xml");
  {
    std::ofstream f(platform_file);
    f << "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n";
    if (hosts > 1) {
      f << fmt::format(
               "<!-- {} hosts of {} rank(s) as `tessera bench comm` measured them ({}): each host's link from "
               "the\n     allreduce sweep, full duplex. -->\n<platform version=\"4.1\">\n",
               hosts, per_host, measured.value("launcher", std::string()))
        << fmt::format(
               "  <cluster id=\"here\" prefix=\"here-\" suffix=\"\" radical=\"0-{0}\" speed=\"1Gf\" core=\"{1}\" "
               "bw=\"{2:.6g}Bps\" lat=\"{3:.6g}s\" sharing_policy=\"SPLITDUPLEX\" loopback_bw=\"{2:.6g}Bps\" "
               "loopback_lat=\"{3:.6g}s\"/>\n",
               hosts - 1, per_host, bandwidth, latency);
    } else {
      f << "<!-- This machine, from `tessera bench comm`'s 2-rank allreduce: one host of 2 cores; the ranks talk "
           "through\n"
        << "     shared memory, modelled as the loopback link. -->\n<platform version=\"4.1\">\n"
        << fmt::format(
               "  <cluster id=\"here\" prefix=\"here-\" suffix=\"\" radical=\"0-0\" speed=\"1Gf\" core=\"2\" "
               "bw=\"{0:.6g}Bps\" lat=\"{1:.6g}s\" loopback_bw=\"{0:.6g}Bps\" loopback_lat=\"{1:.6g}s\"/>\n",
               bandwidth, latency);
    }
    f << "</platform>\n";
  }
  const Platform here = read_platform(platform_file.string());
  const double compute = measured.at("no_exchange").at("step_s").get<double>();
  // Local computation of the exchanges (packing, element-wise updates) is timed as it runs here: the simulated
  // host computes at the rate SMPI is told this machine has.
  const std::vector<std::string> timed = {"--cfg=smpi/simulate-computation:yes", "--cfg=smpi/host-speed:1Gf"};
  json rows_out = json::array();
  std::cout << fmt::format(
      "\nvalidation: {} ranks on {} ({}; {} at {} px, batch {}); {} {:.3f} GB/s, {:.1f} us per link; computation "
      "{:.1f} ms per step (the ranks side by side without a strategy, measured)\n",
      ranks, hosts > 1 ? fmt::format("{} hosts", hosts) : "this machine", measured.value("cpu", std::string()),
      compact.name, compact.size, measured.value("batch", 0), hosts > 1 ? "links" : "shared memory", bandwidth / 1e9,
      latency * 1e6, compute * 1e3);
  std::cout << fmt::format("{:<44} {:>12} {:>12} {:>8}\n", "strategy", "measured ms", "simulated ms", "error");
  std::vector<double> errors;
  for (const auto& row : measured.at("strategies")) {
    if (!row.contains("step_s")) continue;
    const auto& opts = row.at("options");
    const std::string strategy = row.at("strategy").get<std::string>();
    if (strategy == "allreduce" && opts.value("bucket_mb", 0.0) > 0.0) continue;  // SMPI: no buckets (sim/README.md)
    const int tau = opts.value("tau", 8);
    const std::string inter = opts.value("inter", strategy == "two-level" ? "allreduce" : "");
    const Simulation s = simulator.run(here, platform_file, per_host, compact, 1.0, compute, strategy, ranks, tau,
                                       inter, measured.at("steps").get<int>(), timed);
    const double real = row.at("step_s").get<double>();
    json out = {{"label", row.at("label")}, {"measured_step_s", real}};
    if (!s.failure.empty()) {
      out["failure"] = s.failure;
      std::cout << fmt::format("{:<44} {:>12.1f} FAILED: {}\n", row.at("label").get<std::string>(), real * 1e3,
                               s.failure);
    } else {
      const double sim = s.result.at("step_s").get<double>();
      const double error = sim / real - 1.0;
      errors.push_back(std::abs(error));
      out.update({{"simulated_step_s", sim}, {"error", error}, {"simulated", s.result}});
      std::cout << fmt::format("{:<44} {:>12.1f} {:>12.1f} {:>+7.1f}%\n", row.at("label").get<std::string>(),
                               real * 1e3, sim * 1e3, 100.0 * error);
    }
    rows_out.push_back(out);
  }
  const double mean_error =
      errors.empty() ? 0.0 : std::accumulate(errors.begin(), errors.end(), 0.0) / static_cast<double>(errors.size());
  std::cout << fmt::format("mean absolute error {:.1f}% over {} strategies (load average {} at the measurement)\n",
                           100.0 * mean_error, errors.size(), measured.at("load_average").dump());
  return {{"platform",
           {{"hosts", hosts}, {"ranks_per_host", per_host}, {"bandwidth_Bps", bandwidth}, {"latency_s", latency}}},
          {"compute_step_s", compute},
          {"rows", rows_out},
          {"mean_abs_error", mean_error},
          {"measured", measured}};
}

}  // namespace

int run_bench_scale(const ScaleBenchOptions& o) {
  const std::string library = o.simulator.empty() ? std::string(TESSERA_SIMULATOR_LIBRARY) : o.simulator;
  if (library.empty() || !fs::exists(library)) {
    throw core::UsageError(fmt::format(
        "bench scale: the SMPI simulator '{}' is not built: install SimGrid (scripts/install-deps.sh) and rebuild, "
        "or give --simulator PATH",
        library));
  }
  const auto smpirun = find_in_path("smpirun");
  if (!smpirun) throw core::UsageError("bench scale: `smpirun` (SimGrid) is not on PATH: run scripts/install-deps.sh");
  const auto ranks = int_list(o.ranks, "--ranks");
  const auto taus = int_list(o.tau_sweep, "--tau-sweep");
  const auto sizes = key_values(o.sizes, "--sizes");
  const auto given = key_values(o.compute, "--compute");
  if (ranks.empty() || *std::min_element(ranks.begin(), ranks.end()) < 2) {
    throw core::UsageError("bench scale: --ranks needs rank counts of at least 2");
  }
  for (int t : taus) {
    if (t < 1 || o.steps % t != 0)
      throw core::UsageError(fmt::format("bench scale: --steps {} is not a multiple of tau {}", o.steps, t));
  }
  if (o.steps % o.tau != 0)
    throw core::UsageError(fmt::format("bench scale: --steps {} is not a multiple of --tau {}", o.steps, o.tau));
  if (o.node_speed <= 0 || o.payload_kb <= 0 || o.ranks_per_node < 1) {
    throw core::UsageError("bench scale: --node-speed, --payload-kb and --ranks-per-node must be positive");
  }
  const fs::path out(o.out);
  const fs::path work = out / "work";
  fs::create_directories(work);
  Simulator simulator(library, *smpirun, work, o.timeout);
  if (!(o.disk_mbps > 0.0) || o.fs_gbps < 0.0) {
    throw core::UsageError("bench scale: --disk-mbps must be positive and --fs-gbps not negative");
  }
  simulator.set_storage(o.disk_mbps, o.fs_gbps);

  // Only the validation against a run measured elsewhere (--measured): no calibration here, no sweep.
  if (!o.measured.empty()) {
    std::ifstream in(o.measured);
    const json report_in = json::parse(in, nullptr, false);
    std::string model;
    int size = 0, batch = 0;
    try {
      model = report_in.at("model").get<std::string>();
      size = report_in.at("size").get<int>();
      batch = report_in.at("batch").get<int>();
    } catch (const json::exception&) {
      throw core::InputError("not a `bench comm --json` report (no model, size or batch)", o.measured);
    }
    const ModelFacts facts = calibrate(model, size, batch, "1", work);
    const json report = {{"bench", "scale"}, {"simulated", true}, {"validation", validate(simulator, o, work, facts)}};
    core::write_file_atomic((out / "scale.json").string(), report.dump(2) + "\n");
    std::cout << fmt::format("\nEvery simulated figure above comes from SimGrid SMPI (sim/README.md). Report: {}\n",
                             (out / "scale.json").string());
    return core::exit_ok;
  }

  // 1. Calibration.
  std::vector<ModelFacts> models;
  for (const auto& name : split_list(o.models)) {
    const auto size_text = sizes.count(name) ? sizes.at(name) : std::string("224");
    const auto sizes_of = int_list(size_text, "--sizes");
    if (sizes_of.size() != 1 || sizes_of.front() < 1) {
      throw core::UsageError(fmt::format("bench scale: --sizes {}={}: not an input edge in px", name, size_text));
    }
    const int size = sizes_of.front();
    std::cout << fmt::format("calibration: {} at {} px, batch {}, one core ...", name, size, o.batch) << std::flush;
    models.push_back(calibrate(name, size, o.batch, given.count(name) ? given.at(name) : "", work));
    const auto& m = models.back();
    std::cout << fmt::format(" {:.3f} s per step{} ({} parameters, {:.1f} MB)\n", m.step_seconds,
                             m.measured ? "" : " (given)", m.parameters, m.parameters * 4.0 / 1e6);
  }

  json report = {{"bench", "scale"}, {"simulated", true}};
  // 2. Validation on this machine.
  if (o.validate) {
    const auto compact = std::find_if(models.begin(), models.end(), [](const auto& m) { return m.name == "compact"; });
    ModelFacts facts = compact != models.end() ? *compact : calibrate("compact", 64, o.batch, "1", work);
    report["validation"] = validate(simulator, o, work, facts);
  }

  // 3. The sweep.
  std::vector<Simulation> sims;
  std::vector<std::string> platform_names;
  for (const auto& name : split_list(o.platforms)) {
    const Platform platform = read_platform(name);
    platform_names.push_back(platform.name);
    const int per_host = std::min(o.ranks_per_node, platform.cores);
    for (const auto& m : models) {
      const double model_bytes = 4.0 * static_cast<double>(m.parameters + m.buffer_values);
      const double scale = std::max(1.0, model_bytes / (o.payload_kb * 1024.0));
      const fs::path platform_file = work / fmt::format("{}-{}.xml", platform.name, m.name);
      write_scaled_platform(platform, scale, platform_file);
      const double compute = m.step_seconds / o.node_speed;
      std::cout << fmt::format("\n{} on {}: compute {:.4f} s per step, payload 1/{:.1f}\n", m.name, platform.name,
                               compute, scale);
      std::cout << fmt::format("{:<28} {:>6} {:>10} {:>10} {:>8} {:>8} {:>10} {:>8} {:>22} {:>22}\n", "strategy",
                               "ranks", "step ms", "efficiency", "comm", "wait", "MB/step", "wall s",
                               "ckpt s parallel/gath.", "ckpt MB rank/rank 0 g.");
      auto one = [&](const std::string& strategy, int p, int tau, const std::string& inter) {
        Simulation s = simulator.run(platform, platform_file, per_host, m, scale, compute, strategy, p, tau, inter,
                                     o.steps, {"--cfg=smpi/simulate-computation:no"});
        const std::string label = series_label(s);
        if (!s.failure.empty()) {
          std::cout << fmt::format("{:<28} {:>6} {}{}\n", label, p, s.skipped ? "" : "FAILED: ", s.failure);
        } else {
          const auto& r = s.result;
          // The checkpoint, written in parallel (each rank its replica) and gathered (rank 0 all of them): seconds,
          // and the MB the busiest rank writes each way (none for the parameter-server baseline).
          const std::string ckpt_seconds = r.contains("ckpt_parallel_s")
                                               ? fmt::format("{:.3f}/{:.3f}", r.at("ckpt_parallel_s").get<double>(),
                                                             r.at("ckpt_gathered_s").get<double>())
                                               : "-";
          const std::string ckpt_mb = r.contains("ckpt_rank_mb")
                                          ? fmt::format("{:.1f}/{:.1f}", r.at("ckpt_rank_mb").get<double>(),
                                                        r.at("ckpt_root_mb_gathered").get<double>())
                                          : "-";
          std::cout << fmt::format("{:<28} {:>6} {:>10.2f} {:>10.3f} {:>8} {:>8} {:>10.2f} {:>8.0f} {:>22} {:>22}\n",
                                   label, p, r.at("step_s").get<double>() * 1e3, r.at("efficiency").get<double>(),
                                   percent(r.at("comm_fraction").get<double>()),
                                   percent(r.at("wait_fraction").get<double>()), r.at("mb_per_step").get<double>(),
                                   s.wall_seconds, ckpt_seconds, ckpt_mb);
        }
        sims.push_back(std::move(s));
      };
      for (const auto& strategy : split_list(o.strategies)) {
        for (int p : ranks) {
          if (strategy == "two-level") {
            one(strategy, p, o.tau, "allreduce");
            one(strategy, p, o.tau, "easgd");
          } else {
            one(strategy, p, strategy == "allreduce" ? 1 : o.tau, "");
          }
        }
      }
      for (int t : taus) {
        if (t == o.tau) continue;  // in the sweep above
        one("easgd", o.tau_sweep_ranks, t, "");
      }
    }
  }

  // Outputs.
  std::string csv =
      "simulated,platform,model,parameters,strategy,inter,tau,ranks,compute_s,step_s,efficiency,comm_fraction,"
      "wait_fraction,mb_per_step,payload_scale,ckpt_parallel_s,ckpt_gathered_s,ckpt_rank_mb,ckpt_root_mb_gathered,"
      "failure\n";
  json rows = json::array();
  bool failed = false;
  for (const auto& s : sims) {
    const auto& r = s.result;
    const bool ok = s.failure.empty();
    failed = failed || (!ok && !s.skipped);
    const auto field = [&](const char* key) { return ok && r.contains(key) ? r.at(key).dump() : std::string(); };
    csv += fmt::format("yes,{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", s.platform, s.model,
                       ok ? r.at("params").dump() : "", s.strategy, s.inter, s.tau, s.ranks,
                       ok ? r.at("compute_s").dump() : "", ok ? r.at("step_s").dump() : "",
                       ok ? r.at("efficiency").dump() : "", ok ? r.at("comm_fraction").dump() : "",
                       ok ? r.at("wait_fraction").dump() : "", ok ? r.at("mb_per_step").dump() : "",
                       ok ? r.at("payload_scale").dump() : "", field("ckpt_parallel_s"), field("ckpt_gathered_s"),
                       field("ckpt_rank_mb"), field("ckpt_root_mb_gathered"), s.failure);
    rows.push_back({{"platform", s.platform},
                    {"model", s.model},
                    {"strategy", s.strategy},
                    {"inter", s.inter},
                    {"tau", s.tau},
                    {"ranks", s.ranks},
                    {"result", r},
                    {"failure", s.failure},
                    {"wall_seconds", s.wall_seconds}});
  }
  core::write_file_atomic((out / "scale.csv").string(), csv);
  const int max_ranks = *std::max_element(ranks.begin(), ranks.end());
  for (const auto& platform : platform_names) {
    for (const auto& m : models) write_plots(sims, out, platform, m.name, max_ranks);
  }
  json calibration = json::array();
  for (const auto& m : models) {
    calibration.push_back({{"model", m.name},
                           {"size", m.size},
                           {"batch", o.batch},
                           {"parameters", m.parameters},
                           {"buffer_values", m.buffer_values},
                           {"step_s_one_core", m.step_seconds},
                           {"measured", m.measured},
                           {"node_speed", o.node_speed},
                           {"compute_s", m.step_seconds / o.node_speed}});
  }
  report["calibration"] = calibration;
  report["simulations"] = rows;
  report["smpi_config"] = kSmpiConfig;
  report["assumptions"] = "sim/README.md";
  core::write_file_atomic((out / "scale.json").string(), report.dump(2) + "\n");
  std::cout << fmt::format(
      "\nEvery figure above is SIMULATED (SimGrid SMPI; assumptions in sim/README.md).\n"
      "Table: {}  plots: {}/efficiency-*.png, comm-*.png\n",
      (out / "scale.csv").string(), out.string());
  if (failed)
    throw core::InternalError(
        fmt::format("bench scale: some simulations failed; see {}", (work / "simulations.log").string()));
  return core::exit_ok;
}

}  // namespace tessera::bench
