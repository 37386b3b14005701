// The benchmark harnesses behind `tessera bench` (app/bench.cpp is the verb): each runs the real code paths and
// reports measured figures, never asserting a speed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/parameters.h"
#include "engine/tensor.h"

namespace tessera::engine {
class Model;
class Optimizer;
class SoftmaxCrossEntropy;
class Strategy;
}  // namespace tessera::engine

namespace tessera::bench {

struct TileBenchOptions {
  int slides = 4;
  int size = 8192;  // level-0 side of each synthetic slide
  int tile_size = 96;
  double mpp = 1.0;
  std::string workdir = "data/bench-tile";
  int rounds = 5;         // alternated rounds of the tiling measurements (best of each)
  int read_set_mb = 512;  // least size of the shard set the readers are compared on
  bool qc = true;         // slide quality control in the tiling jobs (tile's default); off: the like-for-like figures
};

int run_bench_tile(const TileBenchOptions& options);

// `tessera bench import` (bench/import.cpp): the whole `tessera import` process against a Python PIL + h5py loop on
// the same patches (a CSV, or generated PNG patches), alternated rounds, best of each.
struct ImportBenchOptions {
  std::string csv;     // path,label[,group] of the patches; "" = generate `patches` PNG patches
  int patches = 8000;  // generated patches
  int tile_size = 50;  // the patches' side and the tiles'
  int rounds = 3;
  std::string workdir = "data/bench-import";
};

int run_bench_import(const ImportBenchOptions& options);

// `tessera bench dicom` (dicom.cpp): level-0 regions read from one synthetic slide as a tiled TIFF and as a DICOM
// series with the same JPEG tiles, in alternated rounds; regions/s of each and their ratio.
struct DicomBenchOptions {
  int size = 16384;     // level-0 side of the synthetic slide
  int tile_size = 256;  // TIFF tile = DICOM frame = region side, in px
  int regions = 4000;   // regions read per round
  int rounds = 5;       // alternated rounds (best of each)
  std::string workdir = "data/bench-dicom";
  std::string json_file;  // also write the figures as JSON here
};

int run_bench_dicom(const DicomBenchOptions& options);

// `tessera bench infer-slide` (bench_infer_slide.cpp): `tessera infer` end to end (every output) on a generated
// slide in child runs with 1 rank and with `mpirun -n ranks`, and the Python pipeline a user would otherwise run
// (scripts/bench_infer_slide.py: OpenSlide reads + PyTorch, the same model shape and tiles), tiles/s by wall and
// CPU time in alternated rounds, the output phase as a fraction of the run, and one rank's peak memory on that
// slide and on one with four times its area.
struct InferSlideBenchOptions {
  int size = 16384;    // level-0 side of the slide (tessera synth: 0.25 um/px); the memory run's second has twice it
  int tile_size = 96;  // the model's input in px
  double mpp = 1.0;    // the model's um/px
  std::string model = "compact";
  std::string stain = "reinhard";  // the checkpoint's stain normalization: none, reinhard, macenko (built-in target)
  int batch = 0;                   // tiles per forward pass; 0 = infer's default
  int ranks = 2;
  int rounds = 3;  // alternated rounds (best of each)
  std::string workdir = "data/bench-infer-slide";
  double timeout = 3600.0;  // seconds a child run may take before it is stopped and reported as hung
  std::string json_file;    // also write the figures as JSON here
  bool python = true;       // also run the Python pipeline (scripts/bench_infer_slide.py)
};

int run_bench_infer_slide(const InferSlideBenchOptions& options);

// `tessera bench train` and `tessera bench infer` (bench_train.cpp): a model's images/s on synthetic data,
// as GFLOP/s and a fraction of the sgemm peak measured in the same run, against PyTorch on the same machine.
enum class ModelBenchKind { train, infer };

struct ModelBenchOptions {
  std::string model = "compact";  // a name of the model registry
  int size = 96;                  // input edge in px
  int batch = 64;
  int threads = 0;       // 0 = all cores this process may use
  double seconds = 4.0;  // minimum measuring time of each framework, split over the rounds
  int rounds = 4;        // alternating Tessera / PyTorch measurements (A B, B A, ...); medians
  int warmup = 2;        // untimed steps before measuring (the first builds the primitives)
  bool torch = true;     // compare with PyTorch (scripts/bench_torch.py)
  bool profile = false;  // per-layer times of Tessera's model
  bool json = false;     // one JSON object on stdout instead of the table
  // Also measure the model in this precision (engine/precision.h; train: fp32 or bf16), in the same rounds as
  // fp32; "fp32" measures fp32 alone.
  std::string precision = "fp32";
};

int run_bench_model(ModelBenchKind kind, const ModelBenchOptions& options);

// `tessera bench comm` (bench_comm.cpp): allreduce bandwidth and each distributed strategy's exchange cost, in
// child `mpirun` runs of this program against one rank using every core, measured in the same rounds.
struct CommBenchOptions {
  int ranks = 2;
  std::string model = "compact";
  int size = 64;   // input edge in px
  int batch = 32;  // images per rank and step
  int steps = 16;  // measured training steps per run: a multiple of every tau measured, so each exchanges at its rate
  int rounds = 2;  // alternated rounds (best of each row)
  double timeout = 600.0;  // seconds a child run may take before it is stopped and reported as hung
  std::string json_file;   // also write the figures as JSON here
  // The command that starts a child run's ranks, before "-n R ...": empty = this machine's mpirun (with
  // --oversubscribe --bind-to none). Words split at spaces, e.g. "scripts/testhosts.sh mpirun --host t1:1,t2:1".
  std::string launcher;
  // The hidden worker side (a child run): "bandwidth" or "train"; empty in the parent.
  std::string worker;
  std::string strategy;  // train: empty = no strategy (the 1-rank reference)
  int threads = 0;
  int tau = 8;
  double bucket_mb = 25.0;
  std::string progress = "thread";
  std::string inter = "allreduce";
};

int run_bench_comm(const CommBenchOptions& options);

// One rank's training on a random batch held in memory (bench_comm.cpp): a registry model with two classes,
// cross-entropy, SGD with momentum, each step taken as the trainer takes it (engine/train_step.h), with the
// strategy's calls when one is given. `bench comm` drives strategies with it; `bench scale` times its steps to
// calibrate the simulated computation.
class SyntheticTraining {
 public:
  SyntheticTraining(const std::string& architecture, int size, int batch, int rank);
  ~SyntheticTraining();
  SyntheticTraining(const SyntheticTraining&) = delete;
  SyntheticTraining& operator=(const SyntheticTraining&) = delete;

  // Forward, loss, backward, the strategy's reduce_gradients, the optimizer's update number `number`, the
  // strategy's after_update. `strategy` may be null.
  void step(engine::Strategy* strategy, std::int64_t number);

  engine::Model& model() { return *model_; }
  std::vector<engine::Param*>& params() { return params_; }
  std::vector<engine::Buffer*>& buffers() { return buffers_; }
  double last_loss() const { return last_loss_; }

 private:
  std::unique_ptr<engine::Model> model_;
  std::unique_ptr<engine::SoftmaxCrossEntropy> loss_;
  std::unique_ptr<engine::Optimizer> optimizer_;
  engine::Tensor input_;
  std::vector<int> labels_;
  std::vector<engine::Param*> params_;
  std::vector<engine::Buffer*> buffers_;
  double last_loss_ = 0.0;
};

// `tessera bench scale` (bench_scale.cpp): the strategies' real exchange code on simulated clusters of 2 to 1024
// ranks (SimGrid SMPI, sim/README.md), computation replaced by the step time measured here.
struct ScaleBenchOptions {
  std::string platforms = "infiniband-100g,ethernet-10g";  // names in sim/platforms, or paths to platform files
  std::string ranks = "2,4,8,16,32,64,128,256,512,1024";
  std::string strategies = "allreduce,easgd,async-easgd,two-level,central-easgd";
  std::string models = "compact,resnet50";
  int tau = 8;                         // easgd-type strategies in the rank sweep
  std::string tau_sweep = "1,4,8,16";  // easgd's tau at --tau-sweep-ranks ranks on each platform
  int tau_sweep_ranks = 64;
  int steps = 16;                                 // simulated steps per run: a multiple of every tau
  int batch = 32;                                 // images per rank and step (calibration)
  std::string sizes = "compact=64,resnet50=224";  // input edge per model (calibration)
  std::string compute;                            // "model=seconds,...": skip the calibration for these models
  double node_speed = 1.0;                        // a simulated rank computes this many times faster than one core here
  double payload_kb = 256.0;  // each rank's model is shrunk to about this size (bandwidths by as much)
  int ranks_per_node = 4;     // ranks per simulated node (hosts of the platform files have 4 cores)
  double disk_mbps = 1000.0;  // checkpoint: each rank's write bandwidth to storage, MB/s (an assumption, not simulated)
  double fs_gbps = 0.0;       // checkpoint: the storage's aggregate bandwidth shared by all writers, GB/s (0 = none)
  std::string out = "bench-scale";
  std::string simulator;    // path of tessera-simulate.so (default: the one built beside this binary)
  double timeout = 1800.0;  // seconds one simulation may take
  bool validate = true;     // first compare a 2-rank simulation of this machine with a measured 2-rank run
  // A `bench comm --json` report measured elsewhere (e.g. across the test hosts): validate against it instead of a
  // new 2-rank run here, on a platform of its hosts written from its allreduce sweep, and sweep nothing.
  std::string measured;
};

int run_bench_scale(const ScaleBenchOptions& options);
// The child's side, on every rank of its mpirun job.
int run_bench_comm_worker(const CommBenchOptions& options);

// `tessera bench view` (view.cpp): the viewer's tiles over loopback, every tile of a synthetic slide and of its
// heatmap on a cold then a warm cache (tiles/s, p50 and p99 latency), and `tessera view`'s peak memory.
struct ViewBenchOptions {
  int size = 16384;        // level-0 side of the synthetic slide
  int clients = 4;         // client threads, one keep-alive connection each
  int cache_mb = 256;      // the server's tile cache
  double seconds = 120.0;  // time bound of each phase
  std::string workdir = "data/bench-view";
  std::string json_file;  // also write the figures as JSON here
};

int run_bench_view(const ViewBenchOptions& options);

}  // namespace tessera::bench
