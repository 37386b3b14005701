// tessera-simulate: the training loop's communication schedule, run on a simulated cluster by SimGrid's SMPI.
//
// Built against SMPI (TESSERA_SMPI, sim/README.md) together with Tessera's own core::Comm and distributed
// strategies, unmodified: every exchange below is the code `tessera train` runs. What is replaced is the
// computation: forward and backward of a step are a delay of --compute seconds of simulated time on the rank's
// host (the time `tessera bench train` measures per step, scaled by the node speed the caller assumes).
//
// The model is its tensor layout (--layout: one line per parameter or buffer, "param N" or "buffer N" elements,
// as `tessera bench scale` writes it from the real network), every tensor shrunk by --payload-scale k (the
// platform's bandwidths are divided by the same k by the caller, so that each message's transfer time is the
// full model's; latencies are unchanged). Values are not trained: the strategies move and combine whatever the
// tensors hold.
//
//   smpirun -np 64 -platform P.xml -hostfile H ./tessera-simulate.so --strategy easgd --tau 8 --steps 16
//           --compute 0.25 --layout resnet50.layout   (one command line)
//
// Rank 0 prints one JSON line: the mean step time over the slowest rank, its split into compute, communication
// and waiting (the strategies' own CommStats, read on MPI's clock, which is simulated time here), the payload
// bytes per rank and step, the weak-scaling efficiency compute / step, and what one checkpoint after the steps
// costs, written two ways (issue 14 §5):
//   parallel  as `tessera train` writes it: every rank writes its own replica (parameters, buffers, --optimizer-slots
//             momentum-like slots) to storage, the sizes are gathered to rank 0 (8 bytes a rank), and rank 0 writes
//             the checkpoint (the centre twice, as /params and /easgd/center, its optimizer slots, the buffers twice,
//             as /buffers and /easgd/center_buffers)
//   gathered  as Tessera did before: every replica gathered to rank 0 over the network (MPI_Gather of the shrunk
//             payload, whose transfer takes the full model's time), which writes them all and the checkpoint
//   Only strategies whose replicas differ (replicas_differ()) have replicas; for the others both are rank 0 writing
//   the model and its optimizer state. Storage is not simulated by SimGrid here: a write of b bytes (at the model's
//   full size) is a delay of b / bandwidth of simulated time on the writing rank's host, where each rank reaches
//   storage at --disk-mbps MB/s and, with --fs-gbps, all ranks writing at once share that aggregate (a parallel file
//   system's limit). Seconds are from a barrier before to a barrier after, so the slowest rank's.
//
// --strategy central-easgd is the baseline the decentralized strategies replace: the original EASGD's parameter
// server. The last rank holds the centre and does not train; every tau steps each worker sends it its replica
// and receives the centre (x̃ ← x̃ + α(x_i − x̃) on the server, x_i ← x_i − α(x_i − x̃) on the worker), one
// worker after another, in the order their requests arrive.
//
// Everything lives on the stack of a rank's main(): SMPI runs ranks as threads of one process, and this file
// has no global state.

#include <mpi.h>
#include <simgrid/host.h>
#include <smpi/smpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/comm.h"
#include "core/error.h"
#include "engine/parameters.h"
#include "engine/strategy.h"
#include "engine/train_step.h"

namespace {

using tessera::engine::Buffer;
using tessera::engine::CommStats;
using tessera::engine::Param;

struct Options {
  std::string strategy = "easgd";
  std::string layout;          // file: "param N" / "buffer N" per line
  double payload_scale = 1.0;  // every tensor's element count divided by this (≥ 1)
  int steps = 16;
  double compute = 0.1;       // simulated seconds of forward + backward per step
  double disk_mbps = 1000.0;  // checkpoint: each rank's write bandwidth to storage, MB/s
  double fs_gbps = 0.0;       // checkpoint: the storage's aggregate bandwidth, GB/s, shared by ranks writing at once
                              // (0 = no aggregate limit)
  int optimizer_slots = 1;    // checkpoint: per-parameter optimizer tensors (SGD momentum: 1)
  tessera::engine::StrategyOptions strategy_options;
};

[[noreturn]] void usage(const std::string& problem) {
  throw tessera::core::UsageError("tessera-simulate: " + problem +
                                  " (flags: --strategy NAME --layout FILE --payload-scale K --steps N --compute S "
                                  "--tau T --beta B --bucket-mb M --inter allreduce|easgd --ranks-per-node K "
                                  "--disk-mbps MB --fs-gbps GB --optimizer-slots N)");
}

Options parse(int argc, char** argv) {
  Options o;
  o.strategy_options.bucket_mb = 0.0;  // see sim/README.md: SMPI 3.32's in-place non-blocking allreduce is broken
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    if (i + 1 >= argc) usage("flag " + key + " needs a value");
    const std::string value = argv[i + 1];
    try {
      if (key == "--strategy")
        o.strategy = value;
      else if (key == "--layout")
        o.layout = value;
      else if (key == "--payload-scale")
        o.payload_scale = std::stod(value);
      else if (key == "--steps")
        o.steps = std::stoi(value);
      else if (key == "--compute")
        o.compute = std::stod(value);
      else if (key == "--tau")
        o.strategy_options.tau = std::stoi(value);
      else if (key == "--beta")
        o.strategy_options.beta = std::stod(value);
      else if (key == "--bucket-mb")
        o.strategy_options.bucket_mb = std::stod(value);
      else if (key == "--inter")
        o.strategy_options.inter = value;
      else if (key == "--ranks-per-node")
        o.strategy_options.ranks_per_node = std::stoi(value);
      else if (key == "--disk-mbps")
        o.disk_mbps = std::stod(value);
      else if (key == "--fs-gbps")
        o.fs_gbps = std::stod(value);
      else if (key == "--optimizer-slots")
        o.optimizer_slots = std::stoi(value);
      else
        usage("unknown flag " + key);
    } catch (const std::logic_error&) {  // stoi/stod: not a number
      usage("flag " + key + ": '" + value + "' is not a number");
    }
  }
  if (o.layout.empty()) usage("--layout is required");
  if (o.payload_scale < 1.0) usage("--payload-scale must be at least 1");
  if (o.steps < 1 || o.compute < 0.0) usage("--steps must be at least 1 and --compute not negative");
  if (o.strategy_options.bucket_mb > 0.0) usage("--bucket-mb must be 0 under SMPI (sim/README.md)");
  if (!(o.disk_mbps > 0.0) || o.fs_gbps < 0.0 || o.optimizer_slots < 0) {
    usage("--disk-mbps must be positive, --fs-gbps and --optimizer-slots not negative");
  }
  return o;
}

// The model's tensors, each shrunk by the payload scale (at least one element each).
struct Model {
  std::vector<Param> params;
  std::vector<Buffer> buffers;
  std::int64_t full_elements = 0;  // before scaling
  std::int64_t full_params = 0;    // of which parameters
  std::int64_t elements = 0;       // after
};

Model read_layout(const std::string& path, double scale) {
  std::ifstream in(path);
  if (!in) throw tessera::core::FileNotFoundError(path);
  Model m;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string kind;
    std::int64_t n = 0;
    if (!(fields >> kind >> n) || n < 1 || (kind != "param" && kind != "buffer")) {
      throw tessera::core::InputError(fmt::format("layout line {}: expected 'param N' or 'buffer N'", number), path);
    }
    const auto scaled = std::max<std::int64_t>(1, std::llround(static_cast<double>(n) / scale));
    m.full_elements += n;
    m.elements += scaled;
    if (kind == "param") {
      m.full_params += n;
      Param p;
      p.name = fmt::format("t{}", number);
      p.shape = {scaled};
      p.value.assign(static_cast<std::size_t>(scaled), 0.01f);
      p.grad.assign(static_cast<std::size_t>(scaled), 0.001f);
      m.params.push_back(std::move(p));
    } else {
      Buffer b;
      b.name = fmt::format("t{}", number);
      b.shape = {scaled};
      b.value.assign(static_cast<std::size_t>(scaled), 1.0f);
      m.buffers.push_back(std::move(b));
    }
  }
  if (m.params.empty()) throw tessera::core::InputError("layout without parameters", path);
  return m;
}

// Forward and backward of one step: `seconds` of simulated computation on this rank's host.
void compute(double seconds) {
  if (seconds > 0.0) smpi_execute_flops(seconds * sg_host_get_speed(sg_host_self()));
}

// The original EASGD's parameter server (see the top). Returns this rank's communication seconds and bytes.
CommStats central_easgd(const tessera::core::Comm& world, Model& model, const Options& o) {
  CommStats stats;
  const int server = world.size() - 1;
  const int workers = world.size() - 1;
  const double beta = o.strategy_options.beta;
  const float alpha =
      static_cast<float>(o.strategy_options.alpha > 0.0 ? o.strategy_options.alpha : beta / std::max(1, workers));
  const std::size_t n = static_cast<std::size_t>(model.elements);
  std::vector<float> flat(n), center(n, 0.01f);
  const int exchanges = o.steps / o.strategy_options.tau;
  const int count = static_cast<int>(n);
  if (world.rank() == server) {
    // Serve every worker's every exchange, in the order requests arrive.
    for (int served = 0; served < exchanges * workers; ++served) {
      MPI_Status status;
      TESSERA_MPI_CHECK(MPI_Recv(flat.data(), count, MPI_FLOAT, MPI_ANY_SOURCE, 0, world.handle(), &status));
      TESSERA_MPI_CHECK(MPI_Send(center.data(), count, MPI_FLOAT, status.MPI_SOURCE, 1, world.handle()));
      for (std::size_t j = 0; j < n; ++j) center[j] += alpha * (flat[j] - center[j]);
    }
    return stats;
  }
  for (int step = 1; step <= o.steps; ++step) {
    compute(o.compute);
    if (step % o.strategy_options.tau != 0) continue;
    const double start = MPI_Wtime();
    float* out = flat.data();
    for (const auto& p : model.params) out = std::copy(p.value.begin(), p.value.end(), out);
    TESSERA_MPI_CHECK(MPI_Send(flat.data(), count, MPI_FLOAT, server, 0, world.handle()));
    TESSERA_MPI_CHECK(MPI_Recv(center.data(), count, MPI_FLOAT, server, 1, world.handle(), MPI_STATUS_IGNORE));
    const float* c = center.data();
    for (auto& p : model.params) {
      for (auto& x : p.value) x -= alpha * (x - *c++);
    }
    stats.seconds += MPI_Wtime() - start;
    stats.bytes += static_cast<std::int64_t>(n * sizeof(float));
    ++stats.exchanges;
  }
  return stats;
}

// What one checkpoint costs, written in parallel and gathered (see the top).
struct CheckpointCost {
  double parallel_s = 0.0, gathered_s = 0.0;
  double rank_bytes = 0.0;           // parallel: the most one rank writes (rank 0: its replica and the checkpoint)
  double root_bytes_gathered = 0.0;  // gathered: what rank 0 receives, holds and writes
  double total_bytes = 0.0;          // written by all ranks (the same both ways)
};

// A write of `bytes` (full size) while `writers` ranks write at once: simulated time on this rank's host.
void write_delay(double bytes, int writers, const Options& o) {
  double bandwidth = o.disk_mbps * 1e6;
  if (o.fs_gbps > 0.0) bandwidth = std::min(bandwidth, o.fs_gbps * 1e9 / writers);
  compute(bytes / bandwidth);
}

CheckpointCost checkpoint(const tessera::core::Comm& world, const Model& model, bool replicas, const Options& o) {
  const double slots = o.optimizer_slots;
  const double params = static_cast<double>(model.full_params);
  const double buffers = static_cast<double>(model.full_elements - model.full_params);
  const double replica = 4.0 * (params * (1.0 + slots) + buffers);
  // The checkpoint rank 0 writes: the centre (or the model), its optimizer slots, and under easgd the centre again
  // (its parameters and its live buffers).
  const double index_bytes = 4.0 * ((params + buffers) * (replicas ? 2.0 : 1.0) + params * slots);
  const int p = world.size();
  CheckpointCost cost;
  if (!replicas) {
    world.barrier();
    const double t0 = MPI_Wtime();
    if (world.rank() == 0) write_delay(index_bytes, 1, o);
    world.barrier();
    cost.parallel_s = cost.gathered_s = MPI_Wtime() - t0;
    cost.rank_bytes = cost.root_bytes_gathered = cost.total_bytes = index_bytes;
    return cost;
  }
  // Parallel: every rank its replica, the sizes to rank 0, then the checkpoint naming them.
  world.barrier();
  double t0 = MPI_Wtime();
  write_delay(replica, p, o);
  long long size = std::llround(replica);
  std::vector<long long> sizes(world.rank() == 0 ? static_cast<std::size_t>(p) : 0);
  TESSERA_MPI_CHECK(MPI_Gather(&size, 1, MPI_LONG_LONG, sizes.data(), 1, MPI_LONG_LONG, 0, world.handle()));
  if (world.rank() == 0) write_delay(index_bytes, 1, o);
  world.barrier();
  cost.parallel_s = MPI_Wtime() - t0;
  // Gathered: every replica (the shrunk payload) to rank 0, which writes them and the checkpoint.
  std::size_t n = 0;  // the shrunk replica: parameters with their optimizer slots, and buffers
  for (const auto& param : model.params) n += param.value.size() * static_cast<std::size_t>(1 + o.optimizer_slots);
  for (const auto& buffer : model.buffers) n += buffer.value.size();
  std::vector<float> mine(n, 0.5f);
  std::vector<float> all(world.rank() == 0 ? n * static_cast<std::size_t>(p) : 0);
  world.barrier();
  t0 = MPI_Wtime();
  TESSERA_MPI_CHECK(MPI_Gather(mine.data(), static_cast<int>(n), MPI_FLOAT, all.data(), static_cast<int>(n), MPI_FLOAT,
                               0, world.handle()));
  if (world.rank() == 0) write_delay(replica * p + index_bytes, 1, o);
  world.barrier();
  cost.gathered_s = MPI_Wtime() - t0;
  cost.rank_bytes = replica + index_bytes;
  cost.root_bytes_gathered = replica * p + index_bytes;
  cost.total_bytes = replica * p + index_bytes;
  return cost;
}

void run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const auto world = tessera::core::Comm::world();
  Model model = read_layout(o.layout, o.payload_scale);
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  for (auto& p : model.params) params.push_back(&p);
  for (auto& b : model.buffers) buffers.push_back(&b);

  const bool central = o.strategy == "central-easgd";
  if (central && world.size() < 2) usage("central-easgd needs a server and at least one worker (2 ranks)");
  std::unique_ptr<tessera::engine::Strategy> strategy;
  if (!central) {
    strategy = tessera::engine::make_strategy(o.strategy, world, o.strategy_options);
    strategy->initialize(params, buffers);
  }

  world.barrier();
  const double start = MPI_Wtime();
  CommStats stats;
  if (central) {
    stats = central_easgd(world, model, o);
  } else {
    // The trainer's step (engine/train_step.h), with the strategy's calls in its order. The calibrated delay
    // stands for all the local work of a step (zeroing, forward, backward, the element-wise update), so the
    // gradients are not zeroed again and backward and update add nothing.
    const tessera::engine::StepWork work{.forward =
                                             [&](std::int64_t) {
                                               compute(o.compute);
                                               return 0.0;
                                             },
                                         .backward = [] {},
                                         .update = [] {},
                                         .zero_gradients = false};
    for (int step = 0; step < o.steps; ++step)
      tessera::engine::train_step(strategy.get(), params, buffers, step, 1, work);
    stats = strategy->stats();
  }
  const double elapsed = MPI_Wtime() - start;
  // An epoch's end (async-easgd completes its exchanges in flight): once per epoch, not part of the step time.
  if (strategy) strategy->settle(params, buffers);
  // Then its checkpoint (not for the parameter-server baseline, whose server holds the only centre).
  std::optional<CheckpointCost> cost;
  if (strategy) cost = checkpoint(world, model, strategy->replicas_differ(), o);

  // Step time of the slowest rank; communication and waiting averaged over the training ranks.
  const bool trains = !(central && world.rank() == world.size() - 1);
  const int trainers = central ? world.size() - 1 : world.size();
  const double slowest = world.allreduce_value(elapsed, tessera::core::ReduceOp::max);
  const double comm_sum = world.allreduce_value(trains ? stats.seconds : 0.0, tessera::core::ReduceOp::sum);
  const double wait_sum = world.allreduce_value(trains ? stats.wait_seconds : 0.0, tessera::core::ReduceOp::sum);
  const std::int64_t bytes_max =
      world.allreduce_value(trains ? stats.bytes : std::int64_t{0}, tessera::core::ReduceOp::max);
  if (world.rank() == 0) {
    const double step = slowest / o.steps;
    const double comm = comm_sum / trainers / o.steps;
    const double wait = wait_sum / trainers / o.steps;
    nlohmann::json out = {
        {"strategy", o.strategy},
        {"ranks", world.size()},
        {"trainers", trainers},
        {"tau", o.strategy_options.tau},
        {"steps", o.steps},
        {"params", model.full_elements},
        {"payload_scale", o.payload_scale},
        {"compute_s", o.compute},
        {"step_s", step},
        {"comm_s", comm},
        {"wait_s", wait},
        {"comm_fraction", step > 0 ? comm / step : 0.0},
        {"wait_fraction", step > 0 ? wait / step : 0.0},
        {"efficiency", step > 0 ? o.compute / step : 1.0},
        // Payload this rank handed to the network per step, at the model's full size.
        {"mb_per_step", static_cast<double>(bytes_max) * o.payload_scale / o.steps / 1e6},
    };
    if (cost) {
      out.update({{"ckpt_parallel_s", cost->parallel_s},
                  {"ckpt_gathered_s", cost->gathered_s},
                  {"ckpt_rank_mb", cost->rank_bytes / 1e6},
                  {"ckpt_root_mb_gathered", cost->root_bytes_gathered / 1e6},
                  {"ckpt_total_mb", cost->total_bytes / 1e6},
                  {"disk_mbps", o.disk_mbps},
                  {"fs_gbps", o.fs_gbps}});
    }
    std::printf("tessera-simulate: %s\n", out.dump().c_str());
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Neither MpiSession nor a log: SMPI gives each rank its own MPI_Init, and errors go to stderr with the rank.
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  try {
    run(argc, argv);
  } catch (const std::exception& e) {
    // The whole simulation ends here, with an exit code smpirun passes on (its MPI_Abort exits with 0).
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "tessera-simulate: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    std::fflush(stdout);
    // Tessera's exit codes (README): 2 a usage or configuration mistake, 3 bad input (the layout file), 1 others.
    const bool usage = dynamic_cast<const tessera::core::UsageError*>(&e) != nullptr ||
                       dynamic_cast<const tessera::core::ConfigError*>(&e) != nullptr;
    std::_Exit(usage ? 2 : dynamic_cast<const tessera::core::InputError*>(&e) != nullptr ? 3 : 1);
  }
  MPI_Finalize();
  return 0;
}
