#include "io/checkpoint.h"

#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/fault.h"
#include "io/hdf5.h"

namespace tessera::io {
namespace {

constexpr const char* checkpoint_format_name = "tessera-checkpoint";
constexpr const char* params_group = "params";
constexpr const char* buffers_group = "buffers";
constexpr const char* quantization_group = "quantization";
constexpr const char* meta_group = "meta";
constexpr const char* optimizer_group = "optimizer";
constexpr const char* easgd_group = "easgd";
constexpr const char* easgd_center_group = "center";
constexpr const char* easgd_center_buffers_group = "center_buffers";
// The attribute "layout" of /easgd: 1 = /easgd/center only (the live centre's buffers are /buffers), 2 = also
// /easgd/center_buffers. Absent: a file written before it, layout 1, or 2 when it has /easgd/center_buffers (written
// between the two changes).
constexpr const char* easgd_layout_key = "layout";
constexpr std::int64_t easgd_layout_center = 1;
constexpr std::int64_t easgd_layout_center_buffers = 2;
constexpr const char* state_group = "state";
constexpr const char* replicas_group = "replicas";
constexpr const char* replica_files_group = "replica_files";
// /state of a replica file: whose replica it is, of which set.
constexpr const char* replica_rank_key = "replica_rank";
constexpr const char* replica_set_key = "replica_set";

// A set's name relative to the checkpoint's folder stays inside that folder.
bool is_beside(const std::string& set) {
  const std::filesystem::path p(set);
  return !set.empty() && !p.is_absolute() && !p.lexically_normal().string().starts_with("..");
}

// No tensor of a real model comes near this; a larger declared size is a corrupt header, refused before any
// allocation is attempted.
constexpr std::int64_t max_tensor_elements = std::int64_t{1} << 34;

// ---------------------------------------------------------------------------------------------------------
// HDF5 plumbing (io/hdf5.h): a quiet error stack, RAII ids, checks, and the typed attribute and dataset helpers.

using hdf5::Handle;
using hdf5::QuietHdf5;

// "tensor 'conv1.weight' in /params"
std::string tensor_label(const std::string& group, const std::string& name) {
  return "tensor '" + name + "' in /" + group;
}

// "replicas/1"
std::string replica_path(std::size_t rank) { return std::string(replicas_group) + "/" + std::to_string(rank); }

// A rank's group name under /replicas: decimal digits without a sign or leading zeros; -1 for anything else.
std::int64_t parse_rank(const std::string& name) {
  constexpr std::size_t max_digits = 9;  // far beyond any rank count, and no overflow
  if (name.empty() || name.size() > max_digits || (name.size() > 1 && name[0] == '0')) return -1;
  std::int64_t rank = 0;
  for (const char ch : name) {
    if (ch < '0' || ch > '9') return -1;
    rank = rank * 10 + (ch - '0');
  }
  return rank;
}

// =========================================================================================================
// Writing

// Failures while writing are ours (or the system's), not the user's data: core::InternalError with the file.
struct WriteChecker : hdf5::Hdf5Checker {
  explicit WriteChecker(std::string file) : Hdf5Checker(std::move(file), core::ErrorKind::internal) {}
};

void check_name(const WriteChecker& h5, const std::string& where, const std::string& name) {
  if (name.empty() || name == "." || name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
    h5.fail("invalid name '" + name + "' in " + where + " (names must be non-empty and contain no '/')");
  }
}

std::int64_t checked_numel(const WriteChecker& h5, const std::string& label, const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) {
    if (d < 0) h5.fail(label + " has a negative dimension in shape " + describe_shape(shape));
    if (d != 0 && n > max_tensor_elements / d) h5.fail(label + " is too large: shape " + describe_shape(shape));
    n *= d;
  }
  return n;
}

void validate_tensors(const WriteChecker& h5, const std::string& group, const TensorMap& tensors) {
  for (const auto& [name, tensor] : tensors) {
    check_name(h5, "/" + group, name);
    const std::string label = tensor_label(group, name);
    const std::int64_t n = checked_numel(h5, label, tensor.shape);
    if (static_cast<std::int64_t>(tensor.data.size()) != n) {
      h5.fail(label + " has " + std::to_string(tensor.data.size()) + " values but shape " +
              describe_shape(tensor.shape) + " needs " + std::to_string(n));
    }
  }
}

// `path`: "optimizer" or "replicas/<rank>/optimizer".
void validate_optimizer(const WriteChecker& h5, const std::string& path, const OptimizerState& optimizer) {
  if (optimizer.name.empty() && !optimizer.slots.empty())
    h5.fail("optimizer state without an optimizer name in /" + path);
  for (const auto& [slot, tensors] : optimizer.slots) {
    check_name(h5, "/" + path, slot);
    validate_tensors(h5, path + "/" + slot, tensors);
  }
}

// Every argument mistake is found before the temporary file is created.
void validate_checkpoint(const WriteChecker& h5, const Checkpoint& c) {
  if (c.meta.architecture.empty()) h5.fail("checkpoint meta: architecture is empty");
  if (c.meta.input_size <= 0) h5.fail("checkpoint meta: input_size must be positive");
  if (c.meta.num_classes <= 0) h5.fail("checkpoint meta: num_classes must be positive");
  if (!c.meta.class_names.empty() && static_cast<std::int64_t>(c.meta.class_names.size()) != c.meta.num_classes) {
    h5.fail("checkpoint meta: " + std::to_string(c.meta.class_names.size()) + " class names for " +
            std::to_string(c.meta.num_classes) + " classes");
  }
  if (!(c.meta.mpp >= 0.0) || !std::isfinite(c.meta.mpp)) h5.fail("checkpoint meta: mpp must be a finite number >= 0");
  if (c.meta.tissue && !(c.meta.tissue->min_fraction >= 0.0 && c.meta.tissue->min_fraction <= 1.0)) {
    h5.fail("checkpoint meta: tissue min_fraction must be in [0, 1]");
  }
  if (c.meta.tissue && (!(c.meta.tissue->mask_mpp > 0.0) || !std::isfinite(c.meta.tissue->mask_mpp))) {
    h5.fail("checkpoint meta: tissue mask_mpp must be a finite number > 0");
  }
  if ((c.meta.width && *c.meta.width <= 0) || (c.meta.classifier_width && *c.meta.classifier_width <= 0)) {
    h5.fail("checkpoint meta: width and classifier_width must be positive");
  }
  if (c.meta.provenance && (c.meta.provenance->synthetic_slides < 0 || c.meta.provenance->real_slides < 0 ||
                            c.meta.provenance->unknown_slides < 0)) {
    h5.fail("checkpoint meta: training slide counts must not be negative");
  }
  validate_tensors(h5, params_group, c.params);
  validate_tensors(h5, buffers_group, c.buffers);
  validate_optimizer(h5, optimizer_group, c.optimizer);
  validate_tensors(h5, "easgd/center", c.easgd_center);
  validate_tensors(h5, "easgd/center_buffers", c.easgd_center_buffers);
  if (!c.easgd_center_buffers.empty() && c.easgd_center.empty()) {
    h5.fail("/easgd/center_buffers without /easgd/center");
  }
  validate_tensors(h5, quantization_group, c.quantization);
  for (std::size_t rank = 0; rank < c.replicas.size(); ++rank) {
    const std::string path = replica_path(rank);
    validate_tensors(h5, path + "/" + params_group, c.replicas[rank].params);
    validate_tensors(h5, path + "/" + buffers_group, c.replicas[rank].buffers);
    validate_optimizer(h5, path + "/" + optimizer_group, c.replicas[rank].optimizer);
  }
  if (!c.replica_files.empty()) {
    if (!c.replicas.empty()) h5.fail("a checkpoint holds its replicas in the file or names replica files, not both");
    if (c.replica_files.bytes.empty()) h5.fail("/replica_files names no replica file");
    if (!is_beside(c.replica_files.set)) {
      h5.fail("/replica_files set '" + c.replica_files.set + "' is not a folder beside the checkpoint");
    }
  }
  for (const auto& entry : c.state) check_name(h5, "/state", entry.first);
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

// No modification times in object headers (the same checkpoint gives the same bytes, `created` aside), and
// links listed in creation order.
void set_group_properties(const WriteChecker& h5, hid_t plist, const std::string& what) {
  h5.check(H5Pset_obj_track_times(plist, false), what);
  h5.check(H5Pset_link_creation_order(plist, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED), what);
}

class CheckpointWriter {
 public:
  CheckpointWriter(const WriteChecker& h5, hid_t file) : h5_(h5), file_(file) {}

  // Groups track link creation order, so tools list tensors in the model's order rather than by name.
  Handle create_group(hid_t parent, const char* name, const std::string& label) {
    const std::string what = "cannot create group '" + label + "'";
    Handle gcpl = h5_.own(H5Pcreate(H5P_GROUP_CREATE), H5Pclose, what);
    set_group_properties(h5_, gcpl.get(), what);
    Handle group = h5_.own(H5Gcreate2(parent, name, H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose, what);
    h5_.close(gcpl, what);
    return group;
  }

  // Creates the dataset now and queues its data for write_data(): contiguous storage is allocated at the
  // first write, so every piece of metadata lands before every tensor's data. A file cut short then keeps
  // the names and shapes of all tensors, and the reader can name the first one whose data is gone.
  void create_tensor(hid_t group, const std::string& group_path, const std::string& name,
                     const CheckpointTensor& tensor) {
    const std::string label = tensor_label(group_path, name);
    // Contiguous little-endian float32 (a scalar for an empty shape): what h5py and numpy read directly, and what
    // torch.from_numpy takes. Allocated at the first write, without modification times.
    const std::vector<hsize_t> dims(tensor.shape.begin(), tensor.shape.end());
    Handle dataset =
        hdf5::create_dataset<float>(h5_, group, name, dims, {.track_times = false}, "cannot create " + label);
    pending_.push_back({std::move(dataset), &tensor, label});
  }

  void create_tensors(hid_t parent, const char* name, const std::string& group_path, const TensorMap& tensors) {
    Handle group = create_group(parent, name, "/" + group_path);
    for (const auto& [tensor_name, tensor] : tensors) create_tensor(group.get(), group_path, tensor_name, tensor);
    h5_.close(group, "cannot close group '/" + group_path + "'");
  }

  void write_data() {
    for (auto& p : pending_) {
      const std::string what = "cannot write " + p.label;
      // Fault point "checkpoint.write" (core/fault.h): do=enospc|eio fails a tensor's write as a full disk would.
      if (const int error = core::fault::error_at("checkpoint.write"); error != 0) h5_.fail_system(what, error);
      hdf5::write_dataset(h5_, p.dataset, p.tensor->data, what);
      h5_.close(p.dataset, what);
    }
    pending_.clear();
  }

  // Attributes: integers as int64, numbers as float64, strings as variable-length UTF-8 (io/hdf5.h).
  void write_string(hid_t object, const std::string& name, const std::string& value) {
    hdf5::write_attribute<std::string>(h5_, object, name, value);
  }
  void write_int(hid_t object, const std::string& name, std::int64_t value) {
    hdf5::write_attribute<std::int64_t>(h5_, object, name, value);
  }
  void write_double(hid_t object, const std::string& name, double value) {
    hdf5::write_attribute<double>(h5_, object, name, value);
  }

  void write_meta(const CheckpointMeta& meta) {
    Handle group = create_group(file_, meta_group, "/meta");
    const hid_t g = group.get();
    write_string(g, "format", checkpoint_format_name);
    write_int(g, "version", checkpoint_format_version);
    write_string(g, "architecture", meta.architecture);
    write_int(g, "input_size", meta.input_size);
    write_int(g, "num_classes", meta.num_classes);
    if (!meta.class_names.empty()) {
      hdf5::write_attribute<std::vector<std::string>>(h5_, g, "class_names", meta.class_names);
    }
    write_double(g, "mpp", meta.mpp);
    write_string(g, "stain_normalization", meta.stain_normalization);
    write_string(g, "stain_target", meta.stain_target);
    write_string(g, "config_yaml", meta.config_yaml);
    write_int(g, "step", meta.step);
    write_int(g, "epoch", meta.epoch);
    write_string(g, "created", meta.created.empty() ? utc_now() : meta.created);
    if (!meta.tessera_version.empty()) write_string(g, "tessera_version", meta.tessera_version);
    if (meta.tissue) {
      write_double(g, "tissue_min_fraction", meta.tissue->min_fraction);
      write_double(g, "tissue_mask_mpp", meta.tissue->mask_mpp);
      write_int(g, "tissue_reject_pen_marks", meta.tissue->reject_pen_marks ? 1 : 0);
    }
    if (const auto& p = meta.provenance) {
      write_string(g, "training_data", to_string(p->data()));
      write_int(g, "training_synthetic_slides", p->synthetic_slides);
      write_int(g, "training_real_slides", p->real_slides);
      write_int(g, "training_unknown_slides", p->unknown_slides);
      write_string(g, "training_shards", p->shards);
    }
    if (meta.width) write_int(g, "width", *meta.width);
    if (meta.classifier_width) write_int(g, "classifier_width", *meta.classifier_width);
    if (const auto& job = meta.slurm) {
      write_string(g, "slurm_job_id", job->job_id);
      write_string(g, "slurm_array_job_id", job->array_job_id);
      write_string(g, "slurm_array_task_id", job->array_task_id);
      write_string(g, "slurm_nodelist", job->nodelist);
      write_int(g, "slurm_ntasks", job->ntasks);
      write_int(g, "slurm_restarts", job->restarts);
    }
    h5_.close(group, "cannot close group '/meta'");
  }

  // `path`: "optimizer" or "replicas/<rank>/optimizer", the group `optimizer` in `parent`.
  void create_optimizer(hid_t parent, const std::string& path, const OptimizerState& optimizer) {
    Handle group = create_group(parent, optimizer_group, "/" + path);
    write_string(group.get(), "name", optimizer.name);
    write_int(group.get(), "step", optimizer.step);
    for (const auto& [slot, tensors] : optimizer.slots) {
      create_tensors(group.get(), slot.c_str(), path + "/" + slot, tensors);
    }
    h5_.close(group, "cannot close group '/" + path + "'");
  }

  void create_replicas(const std::vector<Replica>& replicas) {
    Handle group = create_group(file_, replicas_group, "/replicas");
    for (std::size_t rank = 0; rank < replicas.size(); ++rank) {
      const Replica& replica = replicas[rank];
      const std::string path = replica_path(rank);
      Handle replica_group = create_group(group.get(), std::to_string(rank).c_str(), "/" + path);
      create_tensors(replica_group.get(), params_group, path + "/" + params_group, replica.params);
      create_tensors(replica_group.get(), buffers_group, path + "/" + buffers_group, replica.buffers);
      if (!replica.optimizer.empty()) {
        create_optimizer(replica_group.get(), path + "/" + optimizer_group, replica.optimizer);
      }
      h5_.close(replica_group, "cannot close group '/" + path + "'");
    }
    h5_.close(group, "cannot close group '/replicas'");
  }

  void create_easgd(const TensorMap& center, const TensorMap& center_buffers) {
    Handle group = create_group(file_, easgd_group, "/easgd");
    write_int(group.get(), easgd_layout_key,
              center_buffers.empty() ? easgd_layout_center : easgd_layout_center_buffers);
    create_tensors(group.get(), easgd_center_group, "easgd/center", center);
    if (!center_buffers.empty()) {
      create_tensors(group.get(), easgd_center_buffers_group, "easgd/center_buffers", center_buffers);
    }
    h5_.close(group, "cannot close group '/easgd'");
  }

  void write_replica_files(const ReplicaFiles& files) {
    Handle group = create_group(file_, replica_files_group, "/replica_files");
    write_string(group.get(), "set", files.set);
    hdf5::write_attribute<std::vector<std::int64_t>>(h5_, group.get(), "bytes", files.bytes);
    h5_.close(group, "cannot close group '/replica_files'");
  }

  void write_state(const StateMap& state) {
    Handle group = create_group(file_, state_group, "/state");
    const hid_t g = group.get();
    for (const auto& [key, value] : state) {
      const std::string& name = key;  // a lambda may not capture a structured binding before clang 16 (make fuzz)
      // Each alternative of StateValue is stored as its own type (io/hdf5.h): a scalar, or a one-dimensional array.
      std::visit([&](const auto& v) { hdf5::write_attribute<std::decay_t<decltype(v)>>(h5_, g, name, v); }, value);
    }
    h5_.close(group, "cannot close group '/state'");
  }

 private:
  struct PendingWrite {
    Handle dataset;
    const CheckpointTensor* tensor;
    std::string label;
  };

  const WriteChecker& h5_;
  hid_t file_;
  std::vector<PendingWrite> pending_;  // in creation order
};

// Builds the whole file in memory (HDF5's core driver without a backing store) and returns its bytes. HDF5
// never touches the disk: a failing disk write is then a plain write(2) error of ours, and no HDF5 file is
// ever left half-closed (HDF5 1.10 keeps a file id alive, and crashes at exit, when the flush of H5Fclose fails).
std::vector<char> build_image(const WriteChecker& h5, const std::string& name, const Checkpoint& c) {
  QuietHdf5 quiet;
  std::size_t data_bytes = 0;
  std::size_t tensor_count = 0;
  auto add = [&](const TensorMap& tensors) {
    for (const auto& entry : tensors) data_bytes += entry.second.data.size() * sizeof(float);
    tensor_count += tensors.size();
  };
  add(c.params);
  add(c.buffers);
  for (const auto& slot : c.optimizer.slots) add(slot.second);
  add(c.easgd_center);
  add(c.easgd_center_buffers);
  add(c.quantization);
  for (const auto& replica : c.replicas) {
    add(replica.params);
    add(replica.buffers);
    for (const auto& slot : replica.optimizer.slots) add(slot.second);
  }
  // A dataset's object header and link take a few hundred bytes; the rest is /meta (the job's YAML) and groups.
  constexpr std::size_t metadata_base = std::size_t{1} << 20;
  constexpr std::size_t metadata_per_tensor = 1024;
  const std::size_t metadata_allowance = metadata_base + metadata_per_tensor * tensor_count;

  Handle fapl = h5.own(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "cannot create a file access list");
  // One growth step of the in-memory file holds the data and typical metadata: no reallocation on the way.
  h5.check(H5Pset_fapl_core(fapl.get(), data_bytes + metadata_allowance, false), "cannot set the in-memory driver");
  // Objects may use the 1.8 format where they need it (groups that track creation order, whose headers then
  // hold attributes over 64 KiB such as a long job YAML); every HDF5 since 1.8 and h5py read it. The
  // superblock stays version 0: HDF5 1.10 returns a version-2 superblock with a stale checksum from
  // H5Fget_file_image.
  h5.check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_EARLIEST, H5F_LIBVER_V18), "cannot set the file format version");
  Handle fcpl = h5.own(H5Pcreate(H5P_FILE_CREATE), H5Pclose, "cannot create a file creation list");
  set_group_properties(h5, fcpl.get(), "cannot set the root group's properties");
  Handle file = h5.own(H5Fcreate(name.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), H5Fclose,
                       "cannot create the in-memory file");
  CheckpointWriter writer(h5, file.get());
  writer.write_meta(c.meta);
  writer.create_tensors(file.get(), params_group, params_group, c.params);
  writer.create_tensors(file.get(), buffers_group, buffers_group, c.buffers);
  if (!c.optimizer.empty()) writer.create_optimizer(file.get(), optimizer_group, c.optimizer);
  if (!c.easgd_center.empty()) writer.create_easgd(c.easgd_center, c.easgd_center_buffers);
  if (!c.replicas.empty()) writer.create_replicas(c.replicas);
  if (!c.replica_files.empty()) writer.write_replica_files(c.replica_files);
  if (!c.state.empty()) writer.write_state(c.state);
  if (!c.quantization.empty()) {
    writer.create_tensors(file.get(), quantization_group, quantization_group, c.quantization);
  }
  // Metadata that HDF5 holds in temporary file space gets its real address at a flush: flushing before the
  // data keeps all of it ahead of the tensors.
  h5.check(H5Fflush(file.get(), H5F_SCOPE_LOCAL), "cannot flush the file");
  writer.write_data();
  // H5Fget_file_image copies the driver's bytes: the metadata cache must be written into them first.
  h5.check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "cannot flush the file");

  const ssize_t size = h5.check(H5Fget_file_image(file.get(), nullptr, 0), "cannot get the file image");
  std::vector<char> image(static_cast<std::size_t>(size));
  h5.check(H5Fget_file_image(file.get(), image.data(), image.size()), "cannot get the file image");
  h5.close(file, "cannot close the in-memory file");
  h5.close(fcpl, "cannot close a property list");
  h5.close(fapl, "cannot close a property list");
  return image;
}

// =========================================================================================================
// Reading: every failure is a core::InputError naming the checkpoint.

using hdf5::Dataset;

// The checks of a checkpoint being read: every refusal, and every failing HDF5 call, is a core::InputError naming
// the checkpoint. A truncated file is said to be so whatever else went wrong: naming the first tensor whose data
// is gone is the most useful thing to say, and otherwise the truncation is the news and what HDF5 tripped over in
// the missing part is detail.
class ReadChecker : public hdf5::Hdf5Checker {
 public:
  explicit ReadChecker(std::string path) : Hdf5Checker(std::move(path), core::ErrorKind::input) {}

  std::int64_t actual_size = 0;
  std::int64_t stored_eof = 0;  // > 0: the file is truncated and was opened from a padded image

  bool truncated() const { return stored_eof > 0; }
  std::string truncation_sizes() const {
    return "expected at least " + std::to_string(stored_eof) + " bytes, the file has " + std::to_string(actual_size);
  }

 protected:
  std::string error_text(const std::string& message) const override {
    if (!truncated()) return message;
    if (message.rfind("tensor '", 0) == 0) return message + " (the file is truncated: " + truncation_sizes() + ")";
    return "truncated: " + truncation_sizes() + " (" + message + ")";
  }
};

class CheckpointReader {
 public:
  explicit CheckpointReader(std::string path) : path_(std::move(path)), h5_(path_) { open(); }
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // Every refusal goes through here (see ReadChecker).
  [[noreturn]] void fail(const std::string& message) const { h5_.fail(message); }

  bool truncated() const { return h5_.truncated(); }

  // A truncated file is only probed, never read: the tensors are visited in the order a read would visit
  // them (`expected`: the model's order for params and buffers) and the first whose stored data reaches past
  // the real end of the file is named. Attributes and data are not read, so HDF5 is never asked to decode
  // the zero padding as strings or heaps (where a damaged global heap can make it loop).
  [[noreturn]] void diagnose_truncation(const CheckpointLayout* expected) const {
    const std::vector<TensorSpec>* params = expected != nullptr ? &expected->params : nullptr;
    probe_model(file(), "", expected);
    Handle easgd = open_group(file(), easgd_group, "/easgd", false);
    if (easgd.get() >= 0) {
      probe_tensors(easgd.get(), easgd_center_group, "easgd/center", params, false);
      probe_tensors(easgd.get(), easgd_center_buffers_group, "easgd/center_buffers",
                    expected != nullptr ? &expected->buffers : nullptr, false);
    }
    Handle replicas = open_group(file(), replicas_group, "/replicas", false);
    if (replicas.get() >= 0) {
      // The ranks present, in rank order: a cut listing may lack some, which is not the news here.
      std::vector<std::int64_t> ranks;
      for (const auto& name : list(replicas.get(), "/replicas")) {
        if (parse_rank(name) >= 0) ranks.push_back(parse_rank(name));
      }
      std::sort(ranks.begin(), ranks.end());
      for (const std::int64_t rank : ranks) {
        const std::string path = replica_path(static_cast<std::size_t>(rank));
        Handle replica = open_group(replicas.get(), std::to_string(rank), "/" + path, true);
        probe_model(replica.get(), path + "/", expected);
      }
    }
    // The missing part held no tensor data (free space, or metadata no probe reached).
    throw core::InputError("truncated: " + h5_.truncation_sizes(), path_);
  }

  // params, buffers and optimizer under `parent`; `prefix` is "" or "replicas/<rank>/".
  void probe_model(hid_t parent, const std::string& prefix, const CheckpointLayout* expected) const {
    const std::vector<TensorSpec>* params = expected != nullptr ? &expected->params : nullptr;
    probe_tensors(parent, params_group, prefix + params_group, params, false);
    probe_tensors(parent, buffers_group, prefix + buffers_group, expected != nullptr ? &expected->buffers : nullptr,
                  false);
    const std::string optimizer_path = prefix + optimizer_group;
    Handle optimizer = open_group(parent, optimizer_group, "/" + optimizer_path, false);
    if (optimizer.get() >= 0) {
      for (const auto& slot : list(optimizer.get(), "/" + optimizer_path)) {
        probe_tensors(optimizer.get(), slot.c_str(), optimizer_path + "/" + slot, params, true);
      }
    }
  }

  hid_t file() const { return file_.get(); }

  bool has_link(hid_t parent, const std::string& name, const std::string& label) const {
    return h5_.check(H5Lexists(parent, name.c_str(), H5P_DEFAULT), "cannot look up '" + label + "'") > 0;
  }

  H5O_type_t object_type(hid_t parent, const std::string& name, const std::string& what) const {
    H5O_info_t info{};
    h5_.check(H5Oget_info_by_name2(parent, name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT), what);
    return info.type;
  }

  // The group `path` ("params", "optimizer/momentum_buffer"), or an invalid handle when it does not exist.
  Handle open_group(hid_t parent, const std::string& name, const std::string& label, bool required) const {
    if (!has_link(parent, name, label)) {
      if (required) fail("missing group '" + label + "'");
      return Handle();
    }
    if (object_type(parent, name, "cannot open '" + label + "'") != H5O_TYPE_GROUP) {
      fail("'" + label + "' is not a group");
    }
    return h5_.own(H5Gopen2(parent, name.c_str(), H5P_DEFAULT), H5Gclose, "cannot open group '" + label + "'");
  }

  // Link names in the group's creation order when it tracks one (Tessera's and h5py's track_order files), else
  // in name order.
  std::vector<std::string> list(hid_t group, const std::string& label) const {
    const std::string what = "cannot list '" + label + "'";
    Handle gcpl = h5_.own(H5Gget_create_plist(group), H5Pclose, what);
    unsigned flags = 0;
    h5_.check(H5Pget_link_creation_order(gcpl.get(), &flags), what);
    const H5_index_t index = (flags & H5P_CRT_ORDER_INDEXED) != 0 ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
    std::vector<std::string> names;
    auto collect = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
      static_cast<std::vector<std::string>*>(data)->emplace_back(name);
      return 0;
    };
    h5_.check(H5Literate(group, index, H5_ITER_INC, nullptr, collect, &names), what);
    return names;
  }

  CheckpointMeta read_meta() const {
    if (!has_link(file(), meta_group, "/meta")) fail("not a Tessera checkpoint (no /meta group)");
    Handle meta = open_group(file(), meta_group, "/meta", true);
    const hid_t g = meta.get();
    const auto has_attribute = [&](const char* name) { return hdf5::has_attribute(h5_, g, name); };
    const auto read_string = [&](const char* name) { return hdf5::read_attribute<std::string>(h5_, g, name, "/meta"); };
    const auto read_int = [&](const char* name) { return hdf5::read_attribute<std::int64_t>(h5_, g, name, "/meta"); };
    const auto read_double = [&](const char* name) { return hdf5::read_attribute<double>(h5_, g, name, "/meta"); };
    if (!has_attribute("format")) fail("not a Tessera checkpoint (no 'format' attribute in /meta)");
    const std::string format = read_string("format");
    if (format != checkpoint_format_name) {
      fail("not a Tessera checkpoint (format attribute is '" + format + "', expected '" + checkpoint_format_name +
           "')");
    }
    CheckpointMeta m;
    m.version = read_int("version");
    if (m.version < 1) fail("invalid checkpoint format version " + std::to_string(m.version));
    if (m.version > checkpoint_format_version) {
      fail("checkpoint format version " + std::to_string(m.version) + " is newer than this Tessera reads (" +
           std::to_string(checkpoint_format_version) + ")");
    }
    m.architecture = read_string("architecture");
    if (m.architecture.empty()) fail("attribute 'architecture' in /meta is empty");
    m.input_size = read_int("input_size");
    if (m.input_size <= 0) {
      fail("attribute 'input_size' in /meta must be positive, got " + std::to_string(m.input_size));
    }
    m.num_classes = read_int("num_classes");
    if (m.num_classes <= 0) {
      fail("attribute 'num_classes' in /meta must be positive, got " + std::to_string(m.num_classes));
    }
    if (has_attribute("class_names")) {
      m.class_names = hdf5::read_attribute<std::vector<std::string>>(h5_, g, "class_names", "/meta");
      if (static_cast<std::int64_t>(m.class_names.size()) != m.num_classes) {
        fail("attribute 'class_names' in /meta has " + std::to_string(m.class_names.size()) + " names for " +
             std::to_string(m.num_classes) + " classes");
      }
    }
    if (has_attribute("mpp")) m.mpp = read_double("mpp");
    if (!(m.mpp >= 0.0) || !std::isfinite(m.mpp)) fail("attribute 'mpp' in /meta must be a finite number >= 0");
    auto optional_string = [&](const char* name, std::string& out) {
      if (has_attribute(name)) out = read_string(name);
    };
    auto optional_int = [&](const char* name, std::int64_t& out) {
      if (has_attribute(name)) out = read_int(name);
    };
    optional_string("stain_normalization", m.stain_normalization);
    optional_string("stain_target", m.stain_target);
    optional_string("config_yaml", m.config_yaml);
    optional_int("step", m.step);
    optional_int("epoch", m.epoch);
    optional_string("created", m.created);
    optional_string("tessera_version", m.tessera_version);
    // The tiling's tissue settings: all three or none (a checkpoint from before they were recorded).
    if (has_attribute("tissue_min_fraction") || has_attribute("tissue_mask_mpp") ||
        has_attribute("tissue_reject_pen_marks")) {
      TissueSettings tissue;
      tissue.min_fraction = read_double("tissue_min_fraction");
      if (!(tissue.min_fraction >= 0.0 && tissue.min_fraction <= 1.0)) {
        fail("attribute 'tissue_min_fraction' in /meta must be in [0, 1], got " + std::to_string(tissue.min_fraction));
      }
      tissue.mask_mpp = read_double("tissue_mask_mpp");
      if (!(tissue.mask_mpp > 0.0) || !std::isfinite(tissue.mask_mpp)) {
        fail("attribute 'tissue_mask_mpp' in /meta must be a finite number > 0, got " +
             std::to_string(tissue.mask_mpp));
      }
      const std::int64_t pen = read_int("tissue_reject_pen_marks");
      if (pen != 0 && pen != 1) {
        fail("attribute 'tissue_reject_pen_marks' in /meta must be 0 or 1, got " + std::to_string(pen));
      }
      tissue.reject_pen_marks = pen == 1;
      m.tissue = tissue;
    }
    // What the model was trained on: all five or none (a checkpoint from before it was recorded: unknown). The
    // counts decide; training_data must agree with them.
    if (has_attribute("training_data") || has_attribute("training_synthetic_slides") ||
        has_attribute("training_real_slides") || has_attribute("training_unknown_slides") ||
        has_attribute("training_shards")) {
      TrainingProvenance p;
      const auto count = [&](const char* name) {
        const std::int64_t value = read_int(name);
        if (value < 0) {
          fail("attribute '" + std::string(name) + "' in /meta must not be negative, got " + std::to_string(value));
        }
        return value;
      };
      p.synthetic_slides = count("training_synthetic_slides");
      p.real_slides = count("training_real_slides");
      p.unknown_slides = count("training_unknown_slides");
      p.shards = read_string("training_shards");
      const std::string data = read_string("training_data");
      if (data != to_string(p.data())) {
        fail("attribute 'training_data' in /meta is '" + data + "', but its slide counts (" +
             std::to_string(p.synthetic_slides) + " synthetic, " + std::to_string(p.real_slides) + " real, " +
             std::to_string(p.unknown_slides) + " unknown) make it '" + to_string(p.data()) + "'");
      }
      m.provenance = p;
    }
    // The Slurm job that wrote it: all six or none (written outside Slurm, or before it was recorded).
    if (has_attribute("slurm_job_id")) {
      SlurmJob job;
      job.job_id = read_string("slurm_job_id");
      job.array_job_id = read_string("slurm_array_job_id");
      job.array_task_id = read_string("slurm_array_task_id");
      job.nodelist = read_string("slurm_nodelist");
      job.ntasks = read_int("slurm_ntasks");
      job.restarts = read_int("slurm_restarts");
      m.slurm = job;
    }
    // The model's size: absent for architectures without one, and in files written before it was recorded.
    for (const auto& [name, size] :
         {std::pair{"width", &m.width}, std::pair{"classifier_width", &m.classifier_width}}) {
      if (!has_attribute(name)) continue;
      const std::int64_t value = read_int(name);
      if (value <= 0 || value > std::numeric_limits<int>::max()) {
        fail("attribute '" + std::string(name) + "' in /meta must be an integer in [1, " +
             std::to_string(std::numeric_limits<int>::max()) + "], got " + std::to_string(value));
      }
      *size = value;
    }
    return m;
  }

  // The usual way to get the layout wrong: one group per dot of the PyTorch name.
  void check_not_group(hid_t group, const std::string& group_path, const std::string& name) const {
    if (object_type(group, name, tensor_label(group_path, name) + ": cannot open") == H5O_TYPE_GROUP) {
      fail("'/" + group_path + "/" + name +
           "' is a group, not a tensor: tensor names keep their dots inside one dataset name "
           "(e.g. 'layer1.0.conv1.weight')");
    }
  }

  // Opens one tensor and checks that it is a dataset of float32 with a plausible shape.
  Dataset open_tensor(hid_t group, const std::string& group_path, const std::string& name) const {
    const std::string label = tensor_label(group_path, name);
    check_not_group(group, group_path, name);
    Dataset d = hdf5::open_dataset(h5_, group, name, label + ": cannot open");
    const std::string type_name = describe_type(d.type.get());
    if (type_name != "float32") fail(label + " has type " + type_name + ", expected float32");
    std::uint64_t n = 1;
    for (const hsize_t dim : d.dims) {
      if (dim != 0 && n > static_cast<std::uint64_t>(max_tensor_elements) / dim) {
        fail(label + " has an implausible shape " + hdf5::describe_dims(d.dims));
      }
      n *= dim;
    }
    return d;
  }

  // Reads the whole tensor after checking that its stored data lies inside the file and covers the shape.
  CheckpointTensor read_tensor(const Dataset& d, const std::string& label) const {
    CheckpointTensor tensor;
    tensor.shape.assign(d.dims.begin(), d.dims.end());
    const std::int64_t n = tensor.numel();
    if (n == 0) return tensor;
    check_storage(d, label, n);
    tensor.data = hdf5::read_dataset<float>(h5_, d, label + ": cannot read its data");
    return tensor;
  }

  // A NaN or an infinity in a tensor a model loads (weights, buffers, optimizer state, replicas) comes from a run
  // that diverged or from a damaged file; loaded, it turns every score into NaN, or into a confident 0 or 1,
  // without a word. A BatchNorm running variance (PyTorch's name "<layer>.running_var") must be above 0: the layer
  // divides by its square root. The checked read (predict, infer, train --resume) refuses such a checkpoint,
  // naming the tensor and the first bad element (C order); the free read returns the file's numbers as they are.
  void check_values(const CheckpointTensor& tensor, const std::string& name, const std::string& label) const {
    const auto bad = std::find_if(tensor.data.begin(), tensor.data.end(), [](float v) { return !std::isfinite(v); });
    const auto at = [&](std::vector<float>::const_iterator it) {
      return "element " + std::to_string(it - tensor.data.begin()) + " is " + fmt::format("{}", *it);
    };
    if (bad != tensor.data.end()) {
      fail(label + ": " + at(bad) +
           " (a checkpoint's numbers must be finite; the run that wrote it diverged or the file is damaged)");
    }
    if (name != "running_var" && !name.ends_with(".running_var")) return;
    const auto not_positive = std::find_if(tensor.data.begin(), tensor.data.end(), [](float v) { return !(v > 0.0f); });
    if (not_positive != tensor.data.end()) {
      fail(label + ": " + at(not_positive) + " (a BatchNorm running variance must be above 0)");
    }
  }

  // Opens each tensor of the group (in `order` first, when given) and checks where its data is stored.
  // `subset`: the group may lack tensors of `order` (optimizer state).
  void probe_tensors(hid_t parent, const char* name, const std::string& group_path,
                     const std::vector<TensorSpec>* order, bool subset) const {
    Handle group = open_group(parent, name, "/" + group_path, false);
    if (group.get() < 0) return;
    std::vector<std::string> names = list(group.get(), "/" + group_path);
    if (order != nullptr) {
      // HDF5 can list a group whose link messages were cut off without an error, just without those links:
      // a tensor the model expects and the listing lacks is the first bad one. (Optimizer state may cover
      // only some parameters, so it is not held to this.)
      std::vector<std::string> ordered;
      for (const auto& spec : *order) {
        if (std::find(names.begin(), names.end(), spec.name) != names.end()) {
          ordered.push_back(spec.name);
        } else if (!subset) {
          fail("tensor '" + spec.name + "' is missing from /" + group_path);
        }
      }
      for (const auto& n : names) {
        if (std::find(ordered.begin(), ordered.end(), n) == ordered.end()) ordered.push_back(n);
      }
      names = std::move(ordered);
    }
    for (const auto& tensor_name : names) {
      // A header cut by the truncation may still decode (zeros are valid values for many fields), so its
      // position is checked before anything it says is believed.
      const std::string label = tensor_label(group_path, tensor_name);
      H5O_info_t info{};
      h5_.check(
          H5Oget_info_by_name2(group.get(), tensor_name.c_str(), &info, H5O_INFO_BASIC | H5O_INFO_HDR, H5P_DEFAULT),
          label + ": cannot read its header");
      const auto limit = static_cast<std::uint64_t>(h5_.actual_size);
      if (info.addr > limit || info.hdr.space.total > limit - info.addr) {
        fail(label + ": its header (bytes " + std::to_string(info.addr) + ".." +
             std::to_string(info.addr + info.hdr.space.total) + ") lies beyond the end of the file");
      }
      const Dataset d = open_tensor(group.get(), group_path, tensor_name);
      std::int64_t n = 1;
      for (const hsize_t dim : d.dims) n *= static_cast<std::int64_t>(dim);
      if (n > 0) check_storage(d, label, n);
    }
  }

  TensorMap read_all_tensors(hid_t parent, const char* name, const std::string& group_path) const {
    TensorMap tensors;
    Handle group = open_group(parent, name, "/" + group_path, false);
    if (group.get() < 0) return tensors;
    for (const auto& tensor_name : list(group.get(), "/" + group_path)) {
      const Dataset d = open_tensor(group.get(), group_path, tensor_name);
      tensors.emplace(tensor_name, read_tensor(d, tensor_label(group_path, tensor_name)));
    }
    return tensors;
  }

  // The tensors of one group, checked against the model: in the model's order, each present with its shape;
  // then nothing else. With `subset`, tensors may be absent (optimizer state) but not foreign.
  TensorMap read_checked_tensors(hid_t parent, const char* name, const std::string& group_path,
                                 const std::vector<TensorSpec>& expected, bool subset) const {
    TensorMap tensors;
    Handle group = open_group(parent, name, "/" + group_path, false);
    const std::vector<std::string> names =
        group.get() >= 0 ? list(group.get(), "/" + group_path) : std::vector<std::string>{};
    const std::set<std::string> present(names.begin(), names.end());
    std::set<std::string> known;
    for (const auto& spec : expected) {
      known.insert(spec.name);
      const std::string label = tensor_label(group_path, spec.name);
      if (present.count(spec.name) == 0) {
        if (subset) continue;
        fail("tensor '" + spec.name + "' is missing from /" + group_path);
      }
      const Dataset d = open_tensor(group.get(), group_path, spec.name);
      const std::vector<std::int64_t> shape(d.dims.begin(), d.dims.end());
      if (shape != spec.shape) {
        fail(label + " has shape " + describe_shape(shape) + ", the model expects " + describe_shape(spec.shape));
      }
      CheckpointTensor tensor = read_tensor(d, label);
      check_values(tensor, spec.name, label);
      tensors.emplace(spec.name, std::move(tensor));
    }
    for (const auto& tensor_name : names) {
      if (known.count(tensor_name) == 0) {
        check_not_group(group.get(), group_path, tensor_name);
        fail(tensor_label(group_path, tensor_name) + " is not part of the model (" +
             (subset ? "no such parameter" : "unexpected tensor") + ")");
      }
    }
    return tensors;
  }

  // Optimizer state (the group `optimizer` in `parent`, at `path`: "optimizer" or "replicas/<rank>/optimizer"):
  // name and step attributes, one subgroup per state. `params` checks the tensors against the model's
  // parameters (nullptr: free-form).
  OptimizerState read_optimizer(hid_t parent, const std::string& path, const std::vector<TensorSpec>* params) const {
    OptimizerState state;
    const std::string label = "/" + path;
    Handle group = open_group(parent, optimizer_group, label, false);
    if (group.get() < 0) return state;
    state.name = hdf5::read_attribute<std::string>(h5_, group.get(), "name", label);
    if (state.name.empty()) fail("attribute 'name' in " + label + " is empty");
    state.step = hdf5::has_attribute(h5_, group.get(), "step")
                     ? hdf5::read_attribute<std::int64_t>(h5_, group.get(), "step", label)
                     : 0;
    for (const auto& slot : list(group.get(), label)) {
      const std::string slot_path = path + "/" + slot;
      if (object_type(group.get(), slot, "cannot open '/" + slot_path + "'") != H5O_TYPE_GROUP) {
        fail("'/" + slot_path + "' is not a group of per-parameter optimizer state (" + label +
             "/<state>/<parameter>)");
      }
      state.slots.emplace(slot, params != nullptr
                                    ? read_checked_tensors(group.get(), slot.c_str(), slot_path, *params, true)
                                    : read_all_tensors(group.get(), slot.c_str(), slot_path));
    }
    return state;
  }

  // /easgd: the centre and, in layout 2, its buffers; both empty when the file has none. The layout is checked before
  // anything is read: a file whose /easgd says layout 2 without /easgd/center_buffers (or with an empty one) is
  // damaged, not old. `expected` checks the tensors against the model (nullptr: free-form).
  std::pair<TensorMap, TensorMap> read_easgd(const CheckpointLayout* expected) const {
    Handle group = open_group(file(), easgd_group, "/easgd", false);
    if (group.get() < 0) return {};
    const bool present = has_link(group.get(), easgd_center_buffers_group, "/easgd/center_buffers");
    if (hdf5::has_attribute(h5_, group.get(), easgd_layout_key)) {
      const auto layout = hdf5::read_attribute<std::int64_t>(h5_, group.get(), easgd_layout_key, "/easgd");
      if (layout > easgd_layout_center_buffers) {
        fail("/easgd layout " + std::to_string(layout) + " is newer than this Tessera reads (" +
             std::to_string(easgd_layout_center_buffers) + ")");
      }
      if (layout < easgd_layout_center) fail("invalid /easgd layout " + std::to_string(layout));
      if (layout == easgd_layout_center_buffers && !present) {
        fail(
            "missing group '/easgd/center_buffers': its /easgd layout 2 says it holds the live EASGD centre's buffers");
      }
      if (layout == easgd_layout_center && present) {
        fail("'/easgd/center_buffers' is present, but its /easgd layout 1 says it holds none");
      }
    }
    if (!has_link(group.get(), easgd_center_group, "/easgd/center")) fail("missing group '/easgd/center'");
    const auto read = [&](const char* name, const std::string& path, const std::vector<TensorSpec>* specs) {
      return specs != nullptr ? read_checked_tensors(group.get(), name, path, *specs, false)
                              : read_all_tensors(group.get(), name, path);
    };
    std::pair<TensorMap, TensorMap> easgd{
        read(easgd_center_group, "easgd/center", expected != nullptr ? &expected->params : nullptr), {}};
    if (present) {
      easgd.second =
          read(easgd_center_buffers_group, "easgd/center_buffers", expected != nullptr ? &expected->buffers : nullptr);
      if (easgd.second.empty()) {
        fail("'/easgd/center_buffers' is empty: in /easgd layout 2 it holds the live EASGD centre's buffers");
      }
    }
    return easgd;
  }

  // The group /replicas, or an invalid handle when the file has none.
  Handle open_replicas() const { return open_group(file(), replicas_group, "/replicas", false); }

  // How many replicas /replicas holds, after checking that its members are exactly the groups "0".."n-1".
  // Only links and object headers are read (cheap: no tensor is opened).
  std::size_t count_replicas(hid_t replicas) const {
    std::vector<std::int64_t> ranks;
    for (const auto& name : list(replicas, "/replicas")) {
      const std::int64_t rank = parse_rank(name);
      const std::string label = "/replicas/" + name;
      if (rank < 0) fail("'" + label + "' is not a rank (replicas are /replicas/0, /replicas/1, ...)");
      if (object_type(replicas, name, "cannot open '" + label + "'") != H5O_TYPE_GROUP) {
        fail("'" + label + "' is not a group");
      }
      ranks.push_back(rank);
    }
    std::sort(ranks.begin(), ranks.end());  // link names are unique and ranks have no leading zeros: no repeats
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] == static_cast<std::int64_t>(i)) continue;
      constexpr std::size_t shown = 8;
      std::string found;
      for (std::size_t k = 0; k < ranks.size() && k < shown; ++k) {
        if (k > 0) found += ", ";
        found += std::to_string(ranks[k]);
      }
      if (ranks.size() > shown) found += ", ... (" + std::to_string(ranks.size()) + " ranks)";
      fail("/replicas has no rank " + std::to_string(i) + ": replicas must be ranks 0..n-1 without gaps (found " +
           found + ")");
    }
    return ranks.size();
  }

  // One rank's replica; `expected` checks it like /params, /buffers and /optimizer (nullptr: free-form).
  Replica read_replica(hid_t replicas, std::size_t rank, const CheckpointLayout* expected) const {
    const std::string path = replica_path(rank);
    Handle group = open_group(replicas, std::to_string(rank), "/" + path, true);
    const hid_t g = group.get();
    const std::string params_path = path + "/" + params_group;
    const std::string buffers_path = path + "/" + buffers_group;
    Replica replica;
    if (expected != nullptr) {
      replica.params = read_checked_tensors(g, params_group, params_path, expected->params, false);
      replica.buffers = read_checked_tensors(g, buffers_group, buffers_path, expected->buffers, false);
    } else {
      replica.params = read_all_tensors(g, params_group, params_path);
      replica.buffers = read_all_tensors(g, buffers_group, buffers_path);
    }
    replica.optimizer =
        read_optimizer(g, path + "/" + optimizer_group, expected != nullptr ? &expected->params : nullptr);
    return replica;
  }

  std::vector<Replica> read_replicas(const CheckpointLayout* expected) const {
    std::vector<Replica> replicas;
    Handle group = open_replicas();
    if (group.get() < 0) return replicas;
    const std::size_t count = count_replicas(group.get());
    replicas.reserve(count);
    for (std::size_t rank = 0; rank < count; ++rank) replicas.push_back(read_replica(group.get(), rank, expected));
    return replicas;
  }

  // /replica_files, or none.
  ReplicaFiles read_replica_files() const {
    ReplicaFiles files;
    Handle group = open_group(file(), replica_files_group, "/replica_files", false);
    if (group.get() < 0) return files;
    files.set = hdf5::read_attribute<std::string>(h5_, group.get(), "set", "/replica_files");
    files.bytes = hdf5::read_attribute<std::vector<std::int64_t>>(h5_, group.get(), "bytes", "/replica_files");
    if (!is_beside(files.set)) fail("/replica_files set '" + files.set + "' is not a folder beside the checkpoint");
    if (files.bytes.empty()) fail("/replica_files names no replica file");
    if (open_replicas().get() >= 0) fail("the checkpoint holds /replicas and names replica files: one or the other");
    return files;
  }

  StateMap read_state() const {
    StateMap state;
    Handle group = open_group(file(), state_group, "/state", false);
    if (group.get() < 0) return state;
    std::vector<std::string> names;
    auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
      static_cast<std::vector<std::string>*>(data)->emplace_back(name);
      return 0;
    };
    h5_.check(H5Aiterate2(group.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names), "cannot list /state");
    for (const auto& name : names) state.emplace(name, read_state_value(group.get(), name));
    return state;
  }

 private:
  void open() {
    struct stat info {};
    if (::stat(path_.c_str(), &info) != 0) {
      if (errno == ENOENT) throw core::FileNotFoundError(path_);
      throw core::InputError(std::string("cannot open: ") + std::strerror(errno), path_);
    }
    if (!S_ISREG(info.st_mode)) throw core::InputError("not a regular file", path_);
    h5_.actual_size = static_cast<std::int64_t>(info.st_size);
    if (h5_.actual_size == 0) throw core::InputError("empty file (0 bytes), not a checkpoint", path_);

    Handle fapl = hdf5::make_file_access(h5_);
    const hid_t id = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get());
    if (id >= 0) {
      file_ = Handle(id, H5Fclose);
      return;
    }
    const hdf5::Failure failure = hdf5::last_failure();
    if (failure.truncated.empty()) fail("not a readable HDF5 checkpoint: HDF5: " + failure.text());
    open_truncated(failure.truncated);
  }

  // HDF5 refuses a file shorter than the end address its superblock records ("truncated file: eof = <size>,
  // sblock->base_addr = <b>, stored_eof = <expected>") before any object can be named. To name the first
  // tensor whose data is gone, the file is opened from memory, padded with zeros to the recorded size; every
  // tensor's storage is then checked against the real size before it is read.
  void open_truncated(const std::string& desc) {
    const std::string key = "stored_eof = ";
    const auto at = desc.find(key);
    const unsigned long long expected =
        at == std::string::npos ? 0 : std::strtoull(desc.c_str() + at + key.size(), nullptr, 10);
    // Beyond a sane factor of the real size the recorded end is itself garbage: do not allocate it.
    constexpr std::int64_t max_padding = std::int64_t{1} << 31;
    if (expected == 0 || static_cast<std::int64_t>(expected) <= h5_.actual_size ||
        static_cast<std::int64_t>(expected) > h5_.actual_size + max_padding) {
      throw core::InputError(
          "truncated: the file has " + std::to_string(h5_.actual_size) + " bytes (HDF5: " + desc + ")", path_);
    }
    h5_.stored_eof = static_cast<std::int64_t>(expected);

    std::vector<char> image(static_cast<std::size_t>(h5_.stored_eof), '\0');
    std::ifstream in(path_, std::ios::binary);
    if (!in.read(image.data(), h5_.actual_size)) fail("cannot read the file");

    Handle fapl = h5_.own(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "cannot create a file access list");
    constexpr std::size_t core_increment = std::size_t{1} << 20;
    h5_.check(H5Pset_fapl_core(fapl.get(), core_increment, false), "cannot set the in-memory driver");
    h5_.check(H5Pset_file_image(fapl.get(), image.data(), image.size()), "cannot set the file image");
    // The in-memory driver refuses a name that exists on disk when given an image: use one that does not.
    const std::string image_name = path_ + ".padded-image-" + std::to_string(::getpid());
    file_ =
        h5_.own(H5Fopen(image_name.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose, "not a readable HDF5 checkpoint");
  }

  // Data past the real end of the file would read as the zero padding (or, for a damaged file, fail deep inside
  // HDF5): check each piece of storage explicitly.
  void check_storage(const Dataset& d, const std::string& label, std::int64_t n) const {
    const hid_t id = d.dataset.get();
    Handle dcpl = h5_.own(H5Dget_create_plist(id), H5Pclose, label + ": cannot read its layout");
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    const auto limit = static_cast<std::uint64_t>(h5_.actual_size);
    auto past_end = [&](std::uint64_t offset, std::uint64_t size) {
      fail(label + ": its data (bytes " + std::to_string(offset) + ".." + std::to_string(offset + size) +
           ") lies beyond the end of the file");
    };
    if (layout == H5D_CONTIGUOUS) {
      if (h5_.check(H5Pget_external_count(dcpl.get()), label + ": cannot read its layout") > 0) {
        fail(label + " is stored in an external file; checkpoints must be self-contained");
      }
      const haddr_t offset = H5Dget_offset(id);
      if (offset == HADDR_UNDEF) fail(label + " has no data in the file (never written)");
      const std::uint64_t bytes = H5Dget_storage_size(id);
      if (bytes != static_cast<std::uint64_t>(n) * sizeof(float)) {
        fail(label + " stores " + std::to_string(bytes) + " bytes, its shape needs " +
             std::to_string(static_cast<std::uint64_t>(n) * sizeof(float)));
      }
      if (offset > limit || bytes > limit - offset) past_end(offset, bytes);
    } else if (layout == H5D_CHUNKED) {
      const int rank = static_cast<int>(d.dims.size());
      std::vector<hsize_t> chunk(d.dims.size());
      h5_.check(H5Pget_chunk(dcpl.get(), rank, chunk.data()), label + ": cannot read its chunking");
      std::uint64_t expected = 1;
      for (std::size_t i = 0; i < chunk.size(); ++i) expected *= (d.dims[i] + chunk[i] - 1) / chunk[i];
      Handle space = h5_.own(H5Dget_space(id), H5Sclose, label + ": cannot read its shape");
      hsize_t count = 0;
      h5_.check(H5Dget_num_chunks(id, space.get(), &count), label + ": cannot count its chunks");
      if (count != expected) {
        fail(label + " has " + std::to_string(count) + " of its " + std::to_string(expected) +
             " chunks in the file (partly never written)");
      }
      for (hsize_t i = 0; i < count; ++i) {
        haddr_t address = HADDR_UNDEF;
        hsize_t size = 0;
        unsigned filters = 0;
        h5_.check(H5Dget_chunk_info(id, space.get(), i, nullptr, &filters, &address, &size),
                  label + ": cannot locate its chunks");
        if (address == HADDR_UNDEF || address > limit || size > limit - address) past_end(address, size);
      }
    } else if (layout != H5D_COMPACT) {  // compact data lives in the object header, which was just read
      fail(label + " uses a virtual dataset layout; checkpoints must hold their data");
    }
  }

  static std::string describe_type(hid_t type) {
    const H5T_class_t type_class = H5Tget_class(type);
    const std::size_t bits = H5Tget_size(type) * 8;
    switch (type_class) {
      case H5T_FLOAT:
        return "float" + std::to_string(bits);
      case H5T_INTEGER:
        return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
      case H5T_STRING:
        return "string";
      case H5T_COMPOUND:
        return "compound";
      case H5T_ENUM:
        return "enum";
      default:
        return "a non-numeric type";
    }
  }

  StateValue read_state_value(hid_t group, const std::string& name) const {
    const hdf5::Attribute a = hdf5::open_attribute(h5_, group, name, "/state");
    const bool scalar = a.space_class == H5S_SCALAR;
    if (!scalar && (a.space_class != H5S_SIMPLE || a.dims.size() != 1)) {
      fail(a.label + " must be a scalar or a one-dimensional array");
    }
    // A scalar's one value, or the array.
    const auto value = [&]<typename T>(std::vector<T> values) -> StateValue {
      if (scalar) return values.front();
      return values;
    };
    switch (a.type_class) {
      case H5T_INTEGER:
        if (H5Tget_sign(a.type.get()) == H5T_SGN_NONE) return value(hdf5::read_values<std::uint64_t>(h5_, a));
        return value(hdf5::read_values<std::int64_t>(h5_, a));
      case H5T_FLOAT:
        return value(hdf5::read_values<double>(h5_, a));
      case H5T_STRING:
        if (!scalar) fail(a.label + ": string arrays are not supported in /state");
        return hdf5::read_values<std::string>(h5_, a).front();
      default:
        fail(a.label + " must hold integers, floating-point numbers or a string");
    }
  }

  std::string path_;
  ReadChecker h5_;  // with the file's size, and the size it should have when it is truncated
  Handle file_;
};

}  // namespace

// =========================================================================================================

std::int64_t CheckpointTensor::numel() const {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

std::string describe_shape(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

namespace {

// Rank `rank`'s replica from its file, checked against the index of the checkpoint `path` (and, with `expected`,
// against the model).
Replica read_replica_file(const std::string& path, const ReplicaFiles& files, std::size_t rank,
                          const CheckpointLayout* expected) {
  const std::string file = replica_file(path, files.set, static_cast<int>(rank));
  std::error_code error;
  const auto bytes = std::filesystem::file_size(file, error);
  if (error) {
    throw core::InputError(fmt::format("the replica of rank {} ({}) cannot be read: {}; a checkpoint whose replicas "
                                       "are in files of their own is kept with its folder {}",
                                       rank, file, error.message(), files.set),
                           path);
  }
  if (static_cast<std::int64_t>(bytes) != files.bytes[rank]) {
    throw core::InputError(fmt::format("the replica file of rank {} has {} bytes, the checkpoint {} records {}: it "
                                       "belongs to another checkpoint or is damaged",
                                       rank, bytes, path, files.bytes[rank]),
                           file);
  }
  const Checkpoint c =
      expected != nullptr ? read_checkpoint(file, *expected, ReplicaRead::skip) : read_checkpoint(file);
  const auto rank_it = c.state.find(replica_rank_key);
  const auto set_it = c.state.find(replica_set_key);
  const auto* own_rank = rank_it == c.state.end() ? nullptr : std::get_if<std::int64_t>(&rank_it->second);
  const auto* own_set = set_it == c.state.end() ? nullptr : std::get_if<std::string>(&set_it->second);
  if (own_rank == nullptr || own_set == nullptr || *own_rank != static_cast<std::int64_t>(rank) ||
      *own_set != files.set) {
    throw core::InputError(
        fmt::format("not the replica of rank {} of set {} that the checkpoint {} names", rank, files.set, path), file);
  }
  return Replica{c.params, c.buffers, c.optimizer};
}

std::vector<Replica> read_replica_files(const std::string& path, const ReplicaFiles& files,
                                        const CheckpointLayout* expected) {
  std::vector<Replica> replicas;
  replicas.reserve(files.bytes.size());
  for (std::size_t rank = 0; rank < files.bytes.size(); ++rank) {
    replicas.push_back(read_replica_file(path, files, rank, expected));
  }
  return replicas;
}

std::filesystem::path replica_sets_folder(const std::string& path) {
  const std::filesystem::path checkpoint(path);
  return checkpoint.parent_path() / (checkpoint.stem().string() + ".replicas");
}

}  // namespace

std::string new_replica_set(const std::string& path, std::int64_t step) {
  // A fresh name for every checkpoint, also one of the same step written again (a resumed run, the epoch's end
  // after a checkpoint_every one): a published checkpoint's set is never written into.
  std::random_device entropy;
  const std::uint64_t nonce = (static_cast<std::uint64_t>(entropy()) << 32) ^ entropy() ^
                              static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  const std::filesystem::path root = replica_sets_folder(path);
  const std::string name = fmt::format("step-{:09d}-{:016x}", step, nonce);
  std::error_code error;
  std::filesystem::create_directories(root / name, error);
  if (error) {
    core::InternalError failure("cannot create the replica folder: " + error.message());
    failure.add_context("file", (root / name).string());
    throw failure;
  }
  // The new folder's entry, and the sets folder's, survive a crash before the checkpoint naming them is published.
  core::sync_folder_of((root / name).string());
  core::sync_folder_of(root.string());
  return (std::filesystem::path(root.filename()) / name).string();
}

std::string replica_file(const std::string& path, const std::string& set, int rank) {
  return (std::filesystem::path(path).parent_path() / set / fmt::format("rank-{:05d}.h5", rank)).string();
}

std::int64_t write_replica_file(const std::string& path, const std::string& set, int rank, const CheckpointMeta& meta,
                                const Replica& replica) {
  Checkpoint c;
  c.meta = meta;
  c.params = replica.params;
  c.buffers = replica.buffers;
  c.optimizer = replica.optimizer;
  c.state[replica_rank_key] = static_cast<std::int64_t>(rank);
  c.state[replica_set_key] = set;
  const std::string file = replica_file(path, set, rank);
  write_checkpoint(file, c);
  std::error_code error;
  const auto bytes = std::filesystem::file_size(file, error);
  if (error) {
    core::InternalError failure("cannot read the size of the replica file just written: " + error.message());
    failure.add_context("file", file);
    throw failure;
  }
  return static_cast<std::int64_t>(bytes);
}

void remove_other_replica_sets(const std::string& path, const std::string& keep) {
  const std::filesystem::path root = replica_sets_folder(path);
  const std::string kept = std::filesystem::path(keep).filename().string();
  std::error_code error;
  std::filesystem::directory_iterator it(root, error);
  if (error) return;  // no sets (yet)
  std::vector<std::filesystem::path> others;
  for (const auto& entry : it) {
    if (entry.path().filename() != kept) others.push_back(entry.path());
  }
  for (const auto& other : others) {
    // Nothing names these any more; a set that cannot be removed costs disk space, not correctness.
    std::filesystem::remove_all(other, error);
    if (error) spdlog::warn("cannot remove the replica set {}: {}", other.string(), error.message());
  }
}

void write_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  const WriteChecker h5(path);
  validate_checkpoint(h5, checkpoint);
  // The file is built in memory (HDF5's core driver), then written under core::temporary_name(path), synced and
  // renamed over `path` (core/atomic_file.h); failures name the checkpoint, as HDF5's own do.
  const std::vector<char> image = build_image(h5, core::temporary_name(path), checkpoint);
  try {
    core::write_file_atomic(path, std::string_view(image.data(), image.size()));
  } catch (core::Error& e) {
    e.add_context("file", path);
    throw;
  }
}

Checkpoint read_checkpoint(const std::string& path, ReplicaRead replicas) {
  QuietHdf5 quiet;
  const CheckpointReader r(path);
  if (r.truncated()) r.diagnose_truncation(nullptr);
  Checkpoint c;
  c.meta = r.read_meta();
  c.params = r.read_all_tensors(r.file(), params_group, params_group);
  c.buffers = r.read_all_tensors(r.file(), buffers_group, buffers_group);
  c.optimizer = r.read_optimizer(r.file(), optimizer_group, nullptr);
  std::tie(c.easgd_center, c.easgd_center_buffers) = r.read_easgd(nullptr);
  if (replicas == ReplicaRead::all) c.replicas = r.read_replicas(nullptr);
  c.replica_files = r.read_replica_files();
  c.state = r.read_state();
  c.quantization = r.read_all_tensors(r.file(), quantization_group, quantization_group);
  if (replicas == ReplicaRead::all && !c.replica_files.empty()) {
    c.replicas = read_replica_files(path, c.replica_files, nullptr);
  }
  return c;
}

Checkpoint read_checkpoint(const std::string& path, const CheckpointLayout& expected, ReplicaRead replicas) {
  QuietHdf5 quiet;
  const CheckpointReader r(path);
  if (r.truncated()) r.diagnose_truncation(&expected);
  Checkpoint c;
  c.meta = r.read_meta();
  c.params = r.read_checked_tensors(r.file(), params_group, params_group, expected.params, false);
  c.buffers = r.read_checked_tensors(r.file(), buffers_group, buffers_group, expected.buffers, false);
  c.optimizer = r.read_optimizer(r.file(), optimizer_group, &expected.params);
  std::tie(c.easgd_center, c.easgd_center_buffers) = r.read_easgd(&expected);
  if (replicas == ReplicaRead::all) c.replicas = r.read_replicas(&expected);
  c.replica_files = r.read_replica_files();
  c.state = r.read_state();
  c.quantization = r.read_all_tensors(r.file(), quantization_group, quantization_group);
  if (replicas == ReplicaRead::all && !c.replica_files.empty()) {
    c.replicas = read_replica_files(path, c.replica_files, &expected);
  }
  return c;
}

Replica read_checkpoint_replica(const std::string& path, int rank, const CheckpointLayout& expected) {
  if (rank < 0) {
    core::InternalError error("read_checkpoint_replica: negative rank " + std::to_string(rank));
    error.add_context("file", path);
    throw error;
  }
  QuietHdf5 quiet;
  const CheckpointReader r(path);
  if (r.truncated()) r.diagnose_truncation(&expected);
  (void)r.read_meta();  // the format and /meta are checked; the caller has them from read_checkpoint_meta
  const ReplicaFiles files = r.read_replica_files();
  if (!files.empty()) {
    if (static_cast<std::size_t>(rank) >= files.bytes.size()) {
      r.fail("no replica for rank " + std::to_string(rank) + ": /replica_files names ranks 0.." +
             std::to_string(files.bytes.size() - 1));
    }
    return read_replica_file(path, files, static_cast<std::size_t>(rank), &expected);
  }
  Handle replicas = r.open_replicas();
  const std::size_t count = replicas.get() < 0 ? 0 : r.count_replicas(replicas.get());
  if (count == 0) r.fail("no replica for rank " + std::to_string(rank) + ": the checkpoint holds no replicas");
  if (static_cast<std::size_t>(rank) >= count) {
    r.fail("no replica for rank " + std::to_string(rank) + ": /replicas holds ranks 0.." + std::to_string(count - 1));
  }
  return r.read_replica(replicas.get(), static_cast<std::size_t>(rank), &expected);
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  QuietHdf5 quiet;
  const CheckpointReader r(path);
  if (r.truncated()) r.diagnose_truncation(nullptr);
  return r.read_meta();
}

}  // namespace tessera::io
