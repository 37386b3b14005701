// Model checkpoints (`tessera train` → `tessera infer`, `predict`, resumed training), layout fixed in
// docs/ARCHITECTURE.md:
//
//   /params/<name>            float32  learnable parameters, PyTorch names and shapes: conv weights O×I×kH×kW,
//                                      linear weights [out, in], biases and batch-norm gamma/beta [C]
//   /buffers/<name>           float32  persistent buffers (batch-norm running_mean / running_var [C])
//   /meta                     attributes: format = "tessera-checkpoint", version, architecture, input_size (tile
//                                      px), num_classes, class_names, mpp, stain_normalization, stain_target,
//                                      config_yaml, step, epoch, created (ISO 8601 UTC), tessera_version, and
//                                      the tiling's tissue_min_fraction, tissue_mask_mpp (float64) and
//                                      tissue_reject_pen_marks (int64 0/1): all three or none; and what the
//                                      model was trained on (io/provenance.h): training_data ("synthetic",
//                                      "real", "mixed" or "unknown"; derived from the counts, for readers of
//                                      the file), training_synthetic_slides, training_real_slides,
//                                      training_unknown_slides (int64), training_shards: all five or none (none:
//                                      written before provenance was recorded, or converted; "unknown");
//                                      the Slurm job that wrote it (io/provenance.h SlurmJob): slurm_job_id,
//                                      slurm_array_job_id, slurm_array_task_id, slurm_nodelist (strings),
//                                      slurm_ntasks, slurm_restarts (int64): all six or none (outside Slurm);
//                                      the model's size (int64 > 0), written only for the architectures built
//                                      with one: width (compact), classifier_width (alexnet, vgg*); absent (other
//                                      architectures, files written before it or converted without it): the
//                                      default, 32 and 4096
//   /optimizer/<state>/<name> float32  per-parameter optimizer state (e.g. momentum_buffer), shaped like the
//                                      parameter; attributes name, step
//   /easgd/center/<name>      float32  the EASGD centre variable, shaped like the parameter
//   /easgd/center_buffers/<name>  float32  the live centre's buffers (the values the elastic exchanges go on from),
//                                      shaped like the buffer; absent in checkpoints written before it (the live
//                                      centre's buffers are then /buffers)
//   /easgd                    attribute layout (int64): 1 = /easgd/center only, 2 = also /easgd/center_buffers
//                                      (written when the centre has buffers). Absent in files written before it:
//                                      1, or 2 when /easgd/center_buffers is there. A layout 2 file without
//                                      /easgd/center_buffers (or with it empty) is damaged and refused naming it,
//                                      not read as an old one; a layout above 2 is refused as newer than the reader
//   /replicas/<rank>/params/<name>             float32  one rank's own replica, for strategies whose ranks'
//   /replicas/<rank>/buffers/<name>            float32  models differ (EASGD-type): parameters, buffers and
//   /replicas/<rank>/optimizer/<state>/<name>  float32  optimizer state as in /params, /buffers, /optimizer
//                                                       (attributes name, step on /replicas/<rank>/optimizer);
//                                                       ranks 0..n-1 without gaps, absent when not needed
//   /replica_files            attributes set (string), bytes (int64 [n]): the replicas are in files of their own,
//                                      one per rank, written in parallel (below); absent otherwise
//   /state                    attributes the trainer keeps for resuming (RNG words, data-loader position, ...)
//   /quantization/<name>      float32 [2]  int8 calibration (`tessera quantize`, engine/precision.h): the
//                                      [min, max] an activation took on the calibration tiles in fp32, named
//                                      "<conv>.input", "<conv>.output", "<block>.output"; absent until calibrated
//
// Replica files. A checkpoint whose every rank has a replica of its own (EASGD-type training on n ranks) does not hold
// them: each rank writes its own, in parallel, beside the checkpoint, and the checkpoint is their index:
//
//   <folder>/<stem>.h5                          the checkpoint: the centre/model, meta, state, /replica_files
//   <folder>/<stem>.replicas/<set>/rank-<r>.h5  rank r's replica, a checkpoint file itself (/params, /buffers,
//                                               /optimizer are the replica; /meta the run's; /state replica_rank,
//                                               replica_set), <set> = "step-<step>-<16 hex digits>", new for
//                                               every checkpoint written
//
// /replica_files set names <stem>.replicas/<set> (relative to the checkpoint's folder), bytes each rank's file
// size. The set is published atomically: every replica file is written atomically into a folder no published
// checkpoint names, and only once all of them are in place is the checkpoint (the index) renamed over its name. A
// reader that opens the checkpoint finds the set it names complete; a job killed before the rename leaves the
// previous checkpoint and its set as they were (and an unnamed set, removed by the next checkpoint of that name);
// one killed after it leaves the new checkpoint complete (and the old set, removed likewise). A replica file that
// is missing, of another size than the index records, or that says it is another rank's or set's, is refused
// naming it. Inference reads the checkpoint alone; only a resumed run reads replica files, each rank its own.
//
// Tensor names keep their dots inside one dataset name ("layer1.0.conv1.weight" is a dataset directly in
// /params, not nested groups), so `{k: f["params"][k][()] for k in f["params"]}` in h5py is a torchvision
// state_dict minus `num_batches_tracked` (scripts/torch_checkpoint.py converts both ways).
//
// A checkpoint is written under a temporary name beside the target and renamed when complete: a reader never
// sees a half-written checkpoint, and a failed write leaves the previous file untouched. All metadata is
// written before all tensor data, so a checkpoint cut short still names its tensors. Readers check the
// format, every tensor's type (float32) and shape, that its data lies inside the file, and read all of it; a
// broken file is refused with one core::InputError naming the file and the first bad tensor, e.g.
//   "file 'x.h5': tensor 'layer1.0.conv1.weight' in /params has shape [64, 3, 3, 3], the model expects
//    [64, 64, 3, 3]"
//   "file 'x.h5': tensor 'fc.weight' in /params: its data (bytes 10552..10584) lies beyond the end of the
//    file (the file is truncated: expected at least 10624 bytes, the file has 10568)".
// Readers ignore top-level groups they do not know, so a reader older than /replicas reads a file with
// replicas as the same checkpoint without them (the format version did not change for them).
//
// Memory: a checkpoint is built in memory, held once in the Checkpoint and once more in the file image while
// writing. Replicas held in the file (/replicas) cost p × model × (1 + optimizer slots) floats for p ranks
// (ResNet-18 with momentum: 11.7 M parameters × 2 × 4 bytes ≈ 94 MB per rank, 750 MB for 8 ranks); replica files
// cost each writer one replica, whatever p. A resumed rank need not load the others' state:
// read_checkpoint(path, layout, ReplicaRead::skip) and read_checkpoint_replica(path, rank, layout).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "io/provenance.h"
#include "io/tissue_settings.h"

namespace tessera::io {

inline constexpr int checkpoint_format_version = 1;

// One float32 tensor in C order (row-major over `shape`); an empty shape is a scalar (one value).
struct CheckpointTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> data;  // size = product of shape

  std::int64_t numel() const;
  bool operator==(const CheckpointTensor&) const = default;  // float ==: NaN never equal, -0 equals 0
};

using TensorMap = std::map<std::string, CheckpointTensor>;  // tensor name → tensor

// What inference needs besides the weights, so that preprocessing travels with the model.
struct CheckpointMeta {
  std::string architecture;                  // e.g. "resnet18", "tiny_cnn" (required)
  std::int64_t input_size = 0;               // tile edge in pixels (required, > 0)
  std::int64_t num_classes = 0;              // (required, > 0)
  std::vector<std::string> class_names;      // empty, or num_classes names
  double mpp = 0.0;                          // µm/px the tiles were made at; 0 = unknown
  std::string stain_normalization = "none";  // "none", "reinhard", "macenko"
  std::string stain_target;                  // the fitted target's text (StainNormalizer::describe())
  std::string config_yaml;                   // the effective job
  // How the training tiles' tissue was found (the shards' tiling job); nullopt in checkpoints written before it
  // was recorded, or converted from elsewhere (inference then uses its own tissue.* defaults).
  std::optional<TissueSettings> tissue;
  // What the model was trained on (the training slides' origins, the shards); nullopt in checkpoints written before
  // it was recorded, or converted from elsewhere: unknown, and inference claims nothing about it.
  std::optional<TrainingProvenance> provenance;
  // The Slurm job that wrote the checkpoint (io/provenance.h); nullopt when it ran outside Slurm.
  std::optional<SlurmJob> slurm;
  // The model's size where its architecture has one (engine/models/model.h ModelOptions): compact's `width`, AlexNet's
  // and VGG's `classifier_width` (> 0). nullopt for the other architectures, and in checkpoints written before it was
  // recorded or converted without it: the model is then built with the default (32, 4096).
  std::optional<std::int64_t> width;
  std::optional<std::int64_t> classifier_width;
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::string created;                               // ISO 8601 UTC; the writer fills in the current time when empty
  std::string tessera_version;                       // "" = not recorded
  std::int64_t version = checkpoint_format_version;  // format version; set by the reader, ignored by the writer

  bool operator==(const CheckpointMeta&) const = default;
};

// Per-parameter optimizer state: state name (e.g. "momentum_buffer") → parameter name → tensor of the
// parameter's shape. A state may cover only some parameters (PyTorch creates momentum lazily).
struct OptimizerState {
  std::string name;  // e.g. "sgd", "lars"; empty = no optimizer state in the checkpoint
  std::int64_t step = 0;
  std::map<std::string, TensorMap> slots;

  bool empty() const { return name.empty() && slots.empty(); }
  bool operator==(const OptimizerState&) const = default;
};

// One attribute under /state. Scalars and one-dimensional arrays are told apart (a 1-element array stays an
// array), so a value reads back with the type it was written with.
using StateValue = std::variant<std::int64_t, std::uint64_t, double, std::string, std::vector<std::int64_t>,
                                std::vector<std::uint64_t>, std::vector<double>>;
using StateMap = std::map<std::string, StateValue>;

// One rank's own model and optimizer state (/replicas/<rank>), when the ranks' models differ.
struct Replica {
  TensorMap params;
  TensorMap buffers;
  OptimizerState optimizer;  // empty() = none

  bool operator==(const Replica&) const = default;
};

// The index of replicas in files of their own (see "Replica files" above).
struct ReplicaFiles {
  std::string set;                  // "<stem>.replicas/<set>", relative to the checkpoint's folder; empty = none
  std::vector<std::int64_t> bytes;  // each rank's file size; index = rank

  bool empty() const { return set.empty(); }
  bool operator==(const ReplicaFiles&) const = default;
};

struct Checkpoint {
  CheckpointMeta meta;
  TensorMap params;
  TensorMap buffers;
  OptimizerState optimizer;        // empty() = none
  TensorMap easgd_center;          // empty = none
  TensorMap easgd_center_buffers;  // empty = none (written only beside easgd_center; /easgd layout 1, else 2)
  std::vector<Replica> replicas;   // index = rank; empty = none. Written into the file (/replicas); read from the
                                   // file or from the replica files the index names
  ReplicaFiles replica_files;      // written as /replica_files (then `replicas` must be empty); read back as is
  StateMap state;
  TensorMap quantization;  // empty = not calibrated for int8

  bool operator==(const Checkpoint&) const = default;
};

// A tensor the model expects: name and PyTorch shape.
struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
};

// Every parameter and buffer of a model, in the model's order (the order decides which bad tensor an error
// names first).
struct CheckpointLayout {
  std::vector<TensorSpec> params;
  std::vector<TensorSpec> buffers;
};

// Writes atomically (core/atomic_file.h: temporary file beside `path`, fsync, rename). Argument mistakes (data
// size not matching the shape, a name with '/', missing architecture) and failing writes throw core::InternalError
// naming the file; the temporary file is removed and an existing `path` is left as it was. The file is built in
// memory first and written with plain write(2) calls (so a full disk is an ordinary error), which costs its size
// in RAM once more while writing.
void write_checkpoint(const std::string& path, const Checkpoint& checkpoint);

// Replica files (see "Replica files" above). new_replica_set creates a new, empty set folder for the checkpoint
// `path` of step `step` (and syncs the folders above it) and returns its name for ReplicaFiles::set;
// write_replica_file writes rank `rank`'s replica into it atomically and returns the file's size;
// remove_other_replica_sets removes every set of `path` but `keep` (what a killed job left, and the sets of
// checkpoints since replaced). Failures are core::InternalError naming the file or folder.
std::string new_replica_set(const std::string& path, std::int64_t step);
std::string replica_file(const std::string& path, const std::string& set, int rank);
std::int64_t write_replica_file(const std::string& path, const std::string& set, int rank, const CheckpointMeta& meta,
                                const Replica& replica);
void remove_other_replica_sets(const std::string& path, const std::string& keep);

// Whether a read loads the replicas (a truncated file is refused either way).
enum class ReplicaRead { all, skip };

// Free-form read: everything in the file, after checking the format, the meta attributes, and that every
// tensor is float32 and fully readable (and that the replicas are ranks 0..n-1); replicas in files of their own
// are read from them, each checked against the index. core::InputError naming the file
// (and the first bad tensor) otherwise; core::FileNotFoundError when there is no file.
// With ReplicaRead::skip the replicas are left out (in the file or in files of their own): the model alone, e.g. for
// model.init_from, whatever the rank count that wrote it.
Checkpoint read_checkpoint(const std::string& path, ReplicaRead replicas = ReplicaRead::all);

// Checked read against the model: the params and buffers must be exactly `expected` (same names, same shapes;
// a missing or extra tensor is an error), optimizer state and the EASGD centre, when present, must name
// parameters of the model with their shapes (the centre: all of them). Each replica is held to the same rules
// as /params, /buffers and /optimizer, and the replicas must be ranks 0..n-1 without gaps; errors name the
// replica ("tensor 'fc.weight' in /replicas/1/params has shape ..."). With ReplicaRead::skip, /replicas is
// neither read nor checked and `replicas` stays empty (inference; a resumed rank that reads its own replica
// with read_checkpoint_replica). /easgd is read and checked by both reads whoever uses it, so `tessera predict` and
// `infer` (engine/inference.cpp, a checked read) refuse a file whose /easgd layout is above 2 although they use only
// /params and /buffers.
Checkpoint read_checkpoint(const std::string& path, const CheckpointLayout& expected,
                           ReplicaRead replicas = ReplicaRead::all);

// One rank's replica, checked like the replicas of a checked read, without reading the other ranks' tensors
// (only the names under /replicas, to check that the ranks are 0..n-1; or only its own replica file). The format and
// /meta are checked too. core::InputError naming the file when the file has no /replicas or no replica for `rank`;
// core::InternalError for a negative rank.
Replica read_checkpoint_replica(const std::string& path, int rank, const CheckpointLayout& expected);

// Only the /meta attributes (format checked): enough to build the model before reading its weights. A
// truncated file is refused here already, naming the first tensor whose data is gone.
CheckpointMeta read_checkpoint_meta(const std::string& path);

// "[64, 3, 3, 3]" ("[]" for a scalar).
std::string describe_shape(const std::vector<std::int64_t>& shape);

}  // namespace tessera::io
