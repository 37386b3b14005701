// Checkpoints: bit-exact round trips, the documented layout as plain HDF5 sees it, the PyTorch-made fixture,
// atomic writes (also when a write fails half-way), and one error naming the file and the first bad tensor for
// each kind of broken file (data-driven cases under tests/data/checkpoints/bad).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

// tessera_io_tests does not get HDF5's include folder (tessera_io links it privately); Debian's serial
// headers live under hdf5/serial and include each other with quotes, so this path works either way.
#if __has_include(<hdf5.h>)
#include <hdf5.h>
#else
#include <hdf5/serial/hdf5.h>
#endif

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/provenance.h"
#include "tests/testing/testing.h"

namespace {

namespace io = tessera::io;
namespace core = tessera::core;
namespace fs = std::filesystem;
using tessera::testing::TempDir;

// ---------------------------------------------------------------------------------------------------------
// Helpers.

struct H5Id {
  hid_t id;
  herr_t (*closer)(hid_t);
  ~H5Id() {
    if (id >= 0) closer(id);
  }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> folder_listing(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(folder)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::uint32_t bits_of(float v) {
  std::uint32_t b = 0;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

float from_bits(std::uint32_t b) {
  float v = 0.0f;
  std::memcpy(&v, &b, sizeof(v));
  return v;
}

// Bitwise equality of two tensor maps (operator== would call NaN unequal and -0 equal to 0).
void expect_bit_exact(const io::TensorMap& actual, const io::TensorMap& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (const auto& [name, tensor] : expected) {
    const auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << what << ": no " << name;
    EXPECT_EQ(it->second.shape, tensor.shape) << what << ": " << name;
    ASSERT_EQ(it->second.data.size(), tensor.data.size()) << what << ": " << name;
    for (std::size_t i = 0; i < tensor.data.size(); ++i) {
      ASSERT_EQ(bits_of(it->second.data[i]), bits_of(tensor.data[i])) << what << ": " << name << "[" << i << "]";
    }
  }
}

// Deterministic values that are different in every tensor and position.
io::CheckpointTensor make_tensor(std::vector<std::int64_t> shape, std::uint32_t seed) {
  io::CheckpointTensor t;
  t.shape = std::move(shape);
  t.data.resize(static_cast<std::size_t>(t.numel()));
  std::uint32_t state = seed * 2654435761u + 12345u;
  for (auto& v : t.data) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<std::int32_t>(state >> 8) - (1 << 23)) / static_cast<float>(1 << 20);
  }
  return t;
}

// A buffer like make_tensor's, but a BatchNorm running variance is above 0 as every checked read requires.
io::CheckpointTensor make_buffer(const std::string& name, std::vector<std::int64_t> shape, std::uint32_t seed) {
  io::CheckpointTensor t = make_tensor(std::move(shape), seed);
  if (name.ends_with("running_var")) {
    for (auto& v : t.data) v = std::fabs(v) + 0.5f;
  }
  return t;
}

io::CheckpointMeta make_meta() {
  io::CheckpointMeta m;
  m.architecture = "resnet18";
  m.input_size = 224;
  m.num_classes = 2;
  m.class_names = {"normal", "tumör"};
  m.mpp = 0.2425;  // no short binary form
  m.stain_normalization = "macenko";
  m.stain_target = "macenko: H (0.65, 0.70, 0.29), E (0.07, 0.99, 0.11), max (1.9, 1.0)";
  m.config_yaml = "train:\n  epochs: 3\n  lr: 0.1  # ünïcode\n";
  m.step = 12345;
  m.epoch = 3;
  m.created = "2024-05-01T12:00:00Z";
  m.tessera_version = "0.1.0";
  return m;
}

// A small model with ResNet names: a stem, one block's first conv, a downsample, a classifier.
io::CheckpointLayout small_layout() {
  io::CheckpointLayout layout;
  layout.params = {{"conv1.weight", {8, 3, 3, 3}},
                   {"bn1.weight", {8}},
                   {"bn1.bias", {8}},
                   {"layer1.0.conv1.weight", {8, 8, 3, 3}},
                   {"layer1.0.downsample.0.weight", {8, 8, 1, 1}},
                   {"fc.weight", {2, 8}},
                   {"fc.bias", {2}}};
  layout.buffers = {{"bn1.running_mean", {8}}, {"bn1.running_var", {8}}};
  return layout;
}

io::Checkpoint make_checkpoint(const io::CheckpointLayout& layout) {
  io::Checkpoint c;
  c.meta = make_meta();
  std::uint32_t seed = 1;
  for (const auto& spec : layout.params) c.params[spec.name] = make_tensor(spec.shape, seed++);
  for (const auto& spec : layout.buffers) c.buffers[spec.name] = make_buffer(spec.name, spec.shape, seed++);
  return c;
}

// The tiny CNN of tests/data/checkpoints/tiny_torch.h5 (scripts/torch_checkpoint.py, "tiny_cnn").
io::CheckpointLayout tiny_layout() {
  io::CheckpointLayout layout;
  layout.params = {
      {"conv1.weight", {4, 3, 3, 3}}, {"bn1.weight", {4}}, {"bn1.bias", {4}}, {"fc.weight", {2, 4}}, {"fc.bias", {2}}};
  layout.buffers = {{"bn1.running_mean", {4}}, {"bn1.running_var", {4}}};
  return layout;
}

fs::path checkpoint_data() { return tessera::testing::test_data_dir() / "checkpoints"; }

// The message of the core::InputError that `read` throws, checked to name `path`; empty (and a failure) if none.
template <typename Read>
std::string input_error(const std::string& path, Read read) {
  try {
    read();
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    return e.message();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a core::InputError: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no error for " << path;
  return {};
}

template <typename Write>
std::string internal_error(const std::string& path, Write write) {
  try {
    write();
  } catch (const core::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a core::InternalError: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no error for " << path;
  return {};
}

// [offset, offset + size) of a contiguous dataset's data in the file.
std::pair<std::uint64_t, std::uint64_t> data_extent(const std::string& path, const std::string& dataset) {
  H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  H5Id d{H5Dopen2(file.id, dataset.c_str(), H5P_DEFAULT), H5Dclose};
  EXPECT_GE(d.id, 0) << dataset;
  return {H5Dget_offset(d.id), H5Dget_storage_size(d.id)};
}

// [offset, offset + size) of a dataset's object header.
std::pair<std::uint64_t, std::uint64_t> header_extent(const std::string& path, const std::string& dataset) {
  H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  H5O_info_t info{};
  EXPECT_GE(H5Oget_info_by_name2(file.id, dataset.c_str(), &info, H5O_INFO_BASIC | H5O_INFO_HDR, H5P_DEFAULT), 0);
  return {info.addr, info.hdr.space.total};
}

// ---------------------------------------------------------------------------------------------------------
// Round trips.

TEST(Checkpoint, RoundTripIsBitExact) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  io::Checkpoint c = make_checkpoint(small_layout());
  // Values that a text or double detour would change: signed zero, denormals, infinities, NaN payloads, extremes.
  auto& w = c.params["conv1.weight"].data;
  w[0] = -0.0f;
  w[1] = std::numeric_limits<float>::denorm_min();
  w[2] = -std::numeric_limits<float>::infinity();
  w[3] = from_bits(0x7fc01234u);  // quiet NaN with a payload
  w[4] = std::numeric_limits<float>::max();
  w[5] = from_bits(0x00012345u);  // another denormal
  c.buffers["scalar_buffer"] = {{}, {42.5f}};
  c.buffers["empty_buffer"] = {{0, 3}, {}};
  c.optimizer.name = "sgd";
  c.optimizer.step = 12345;
  c.optimizer.slots["momentum_buffer"]["conv1.weight"] = make_tensor({8, 3, 3, 3}, 101);
  c.optimizer.slots["momentum_buffer"]["fc.bias"] = make_tensor({2}, 102);
  c.optimizer.slots["second_moment"]["fc.weight"] = make_tensor({2, 8}, 103);
  for (const auto& spec : small_layout().params) c.easgd_center[spec.name] = make_tensor(spec.shape, 200);
  for (const auto& spec : small_layout().buffers) {
    c.easgd_center_buffers[spec.name] = make_buffer(spec.name, spec.shape, 210);
  }
  c.state["rng"] = std::vector<std::uint64_t>{0, 1, 0xffffffffffffffffULL, 0x0123456789abcdefULL};
  c.state["rng_one"] = std::vector<std::uint64_t>{7};  // a one-element array stays an array
  c.state["seed"] = std::uint64_t{0xfedcba9876543210ULL};
  c.state["loader_position"] = std::int64_t{-5'000'000'000LL};
  c.state["positions"] = std::vector<std::int64_t>{3, -4};
  c.state["learning_rate"] = 0.1;
  c.state["losses"] = std::vector<double>{0.7, 0.25};
  c.state["empty"] = std::vector<double>{};
  c.state["sampler"] = std::string("balanced");
  c.meta.tissue = io::TissueSettings{0.3, 16.0, false};  // the tiling's, not the defaults
  io::write_checkpoint(path, c);

  const io::Checkpoint r = io::read_checkpoint(path);
  EXPECT_EQ(r.meta, c.meta);
  ASSERT_TRUE(r.meta.tissue.has_value());
  EXPECT_EQ(*r.meta.tissue, (io::TissueSettings{0.3, 16.0, false}));
  expect_bit_exact(r.params, c.params, "params");
  expect_bit_exact(r.buffers, c.buffers, "buffers");
  EXPECT_EQ(r.optimizer.name, "sgd");
  EXPECT_EQ(r.optimizer.step, 12345);
  ASSERT_EQ(r.optimizer.slots.size(), 2u);
  for (const auto& [slot, tensors] : c.optimizer.slots) expect_bit_exact(r.optimizer.slots.at(slot), tensors, slot);
  expect_bit_exact(r.easgd_center, c.easgd_center, "easgd");
  ASSERT_FALSE(c.easgd_center_buffers.empty());
  expect_bit_exact(r.easgd_center_buffers, c.easgd_center_buffers, "easgd centre buffers");
  EXPECT_EQ(r.state, c.state);
  EXPECT_EQ(r.state.at("rng_one").index(), c.state.at("rng_one").index());

  // Writing what was read gives the same checkpoint again.
  io::write_checkpoint(dir.file("again.h5"), r);
  const io::Checkpoint again = io::read_checkpoint(dir.file("again.h5"));
  expect_bit_exact(again.params, c.params, "params after a second round trip");
  EXPECT_EQ(again.state, c.state);
  EXPECT_EQ(read_text(path), read_text(dir.file("again.h5"))) << "same checkpoint, same bytes";
}

TEST(Checkpoint, CheckedReadReturnsTheModelTensors) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  const io::CheckpointLayout layout = small_layout();
  io::Checkpoint c = make_checkpoint(layout);
  c.optimizer.name = "sgd";
  c.optimizer.slots["momentum_buffer"]["fc.weight"] = make_tensor({2, 8}, 300);  // a subset is fine
  for (const auto& spec : layout.params) c.easgd_center[spec.name] = make_tensor(spec.shape, 400);
  for (const auto& spec : layout.buffers) c.easgd_center_buffers[spec.name] = make_buffer(spec.name, spec.shape, 410);
  io::write_checkpoint(path, c);
  const io::Checkpoint r = io::read_checkpoint(path, layout);
  expect_bit_exact(r.params, c.params, "params");
  expect_bit_exact(r.buffers, c.buffers, "buffers");
  expect_bit_exact(r.optimizer.slots.at("momentum_buffer"), c.optimizer.slots.at("momentum_buffer"), "momentum");
  expect_bit_exact(r.easgd_center, c.easgd_center, "easgd");
  expect_bit_exact(r.easgd_center_buffers, c.easgd_center_buffers, "easgd centre buffers");
  EXPECT_EQ(io::read_checkpoint_meta(path), c.meta);
}

TEST(Checkpoint, WriterFillsInCreatedAndLeavesOutEmptyOptionalParts) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  io::Checkpoint c = make_checkpoint(small_layout());
  c.meta.created.clear();
  c.meta.class_names.clear();
  c.meta.tessera_version.clear();
  io::write_checkpoint(path, c);
  const io::Checkpoint r = io::read_checkpoint(path);
  // "YYYY-MM-DDTHH:MM:SSZ"
  ASSERT_EQ(r.meta.created.size(), 20u) << r.meta.created;
  EXPECT_EQ(r.meta.created[4], '-');
  EXPECT_EQ(r.meta.created[10], 'T');
  EXPECT_EQ(r.meta.created[19], 'Z');
  EXPECT_TRUE(r.meta.class_names.empty());
  EXPECT_FALSE(r.meta.tissue.has_value()) << "no tissue settings recorded: none read back";
  EXPECT_TRUE(r.optimizer.empty());
  EXPECT_TRUE(r.easgd_center.empty());
  EXPECT_TRUE(r.state.empty());

  H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  for (const char* absent : {"optimizer", "easgd", "state"}) {
    EXPECT_EQ(H5Lexists(file.id, absent, H5P_DEFAULT), 0) << absent;
  }
  for (const char* absent : {"tissue_min_fraction", "tissue_mask_mpp", "tissue_reject_pen_marks"}) {
    EXPECT_EQ(H5Aexists_by_name(file.id, "meta", absent, H5P_DEFAULT), 0) << absent;
  }
}

// Attributes over 64 KiB need the dense storage of the 1.8 file format.
TEST(Checkpoint, LongJobYamlRoundTrips) {
  TempDir dir;
  io::Checkpoint c = make_checkpoint(small_layout());
  c.meta.config_yaml.clear();
  for (int i = 0; c.meta.config_yaml.size() < 200'000; ++i) {
    c.meta.config_yaml += "key_" + std::to_string(i) + ": value " + std::to_string(i * 7) + "\n";
  }
  io::write_checkpoint(dir.file("model.h5"), c);
  EXPECT_EQ(io::read_checkpoint_meta(dir.file("model.h5")).config_yaml, c.meta.config_yaml);
}

// ---------------------------------------------------------------------------------------------------------
// The layout as h5py or any HDF5 tool sees it.

TEST(Checkpoint, LayoutAsSeenByPlainHdf5) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  io::Checkpoint c = make_checkpoint(small_layout());
  c.optimizer.name = "sgd";
  c.optimizer.slots["momentum_buffer"]["layer1.0.conv1.weight"] = make_tensor({8, 8, 3, 3}, 9);
  c.easgd_center["fc.bias"] = make_tensor({2}, 10);
  c.state["rng"] = std::vector<std::uint64_t>{1, 2, 3};
  io::write_checkpoint(path, c);

  H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  ASSERT_GE(file.id, 0);
  // A dotted name is one dataset directly in /params: no group per dot.
  EXPECT_EQ(H5Lexists(file.id, "/params/layer1", H5P_DEFAULT), 0);
  for (const char* name : {"/params/layer1.0.conv1.weight", "/params/fc.bias", "/buffers/bn1.running_var",
                           "/optimizer/momentum_buffer/layer1.0.conv1.weight", "/easgd/center/fc.bias"}) {
    SCOPED_TRACE(name);
    H5Id d{H5Dopen2(file.id, name, H5P_DEFAULT), H5Dclose};
    ASSERT_GE(d.id, 0);
    H5Id type{H5Dget_type(d.id), H5Tclose};
    EXPECT_GT(H5Tequal(type.id, H5T_IEEE_F32LE), 0) << "little-endian float32";
    H5Id dcpl{H5Dget_create_plist(d.id), H5Pclose};
    EXPECT_EQ(H5Pget_layout(dcpl.id), H5D_CONTIGUOUS);
  }
  {
    H5Id d{H5Dopen2(file.id, "/params/layer1.0.conv1.weight", H5P_DEFAULT), H5Dclose};
    H5Id space{H5Dget_space(d.id), H5Sclose};
    hsize_t dims[4] = {};
    ASSERT_EQ(H5Sget_simple_extent_ndims(space.id), 4);
    H5Sget_simple_extent_dims(space.id, dims, nullptr);
    EXPECT_EQ(std::vector<hsize_t>(dims, dims + 4), (std::vector<hsize_t>{8, 8, 3, 3})) << "OIHW";
    // C order: element [o][i][h][w] at ((o·I + i)·3 + h)·3 + w.
    std::vector<float> values(8 * 8 * 3 * 3);
    ASSERT_GE(H5Dread(d.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    EXPECT_EQ(bits_of(values[((5 * 8 + 2) * 3 + 1) * 3 + 2]),
              bits_of(c.params["layer1.0.conv1.weight"].data[((5 * 8 + 2) * 3 + 1) * 3 + 2]));
  }
  auto string_attribute = [&](const char* object, const char* name) {
    H5Id a{H5Aopen_by_name(file.id, object, name, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    H5Id type{H5Aget_type(a.id), H5Tclose};
    char* value = nullptr;
    EXPECT_GE(H5Aread(a.id, type.id, &value), 0);
    std::string result = value != nullptr ? value : "";
    H5free_memory(value);
    return result;
  };
  auto int_attribute = [&](const char* object, const char* name) {
    H5Id a{H5Aopen_by_name(file.id, object, name, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    std::int64_t value = -1;
    EXPECT_GE(H5Aread(a.id, H5T_NATIVE_INT64, &value), 0);
    return value;
  };
  EXPECT_EQ(string_attribute("/meta", "format"), "tessera-checkpoint");
  EXPECT_EQ(int_attribute("/meta", "version"), io::checkpoint_format_version);
  EXPECT_EQ(string_attribute("/meta", "architecture"), "resnet18");
  EXPECT_EQ(int_attribute("/meta", "input_size"), 224);
  EXPECT_EQ(int_attribute("/meta", "num_classes"), 2);
  EXPECT_EQ(int_attribute("/meta", "step"), 12345);
  EXPECT_EQ(string_attribute("/meta", "stain_normalization"), "macenko");
  EXPECT_EQ(string_attribute("/optimizer", "name"), "sgd");
  {
    H5Id a{H5Aopen_by_name(file.id, "/state", "rng", H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    H5Id type{H5Aget_type(a.id), H5Tclose};
    EXPECT_GT(H5Tequal(type.id, H5T_STD_U64LE), 0);
    std::uint64_t words[3] = {};
    EXPECT_GE(H5Aread(a.id, H5T_NATIVE_UINT64, words), 0);
    EXPECT_EQ(words[2], 3u);
  }
}

// ---------------------------------------------------------------------------------------------------------
// The fixture written by PyTorch (scripts/torch_checkpoint.py fixture).

TEST(CheckpointTorch, FixtureLoadsWithTorchNamesShapesAndValues) {
  const std::string path = (checkpoint_data() / "tiny_torch.h5").string();
  const auto expected = nlohmann::json::parse(read_text((checkpoint_data() / "tiny_torch.expected.json").string()));
  const io::CheckpointLayout layout = tiny_layout();

  const io::Checkpoint free_form = io::read_checkpoint(path);
  const io::Checkpoint c = io::read_checkpoint(path, layout);
  EXPECT_EQ(free_form, c);
  EXPECT_EQ(c.meta.architecture, "tiny_cnn");
  EXPECT_EQ(c.meta.input_size, 8);
  EXPECT_EQ(c.meta.num_classes, 2);
  EXPECT_EQ(c.meta.class_names, (std::vector<std::string>{"normal", "tumor"}));
  EXPECT_EQ(c.meta.mpp, 0.5);
  EXPECT_EQ(c.meta.version, 1);
  EXPECT_EQ(c.meta.created, "2024-01-01T00:00:00Z");

  std::size_t count = 0;
  for (const auto& [group, specs, tensors] :
       {std::tuple{"params", layout.params, &c.params}, std::tuple{"buffers", layout.buffers, &c.buffers}}) {
    for (const auto& spec : specs) {
      SCOPED_TRACE(spec.name);
      const auto& t = expected.at("tensors").at(spec.name);
      EXPECT_EQ(t.at("group").get<std::string>(), group);
      EXPECT_EQ(t.at("shape").get<std::vector<std::int64_t>>(), spec.shape);
      const auto values = t.at("data").get<std::vector<double>>();
      const auto& data = tensors->at(spec.name).data;
      ASSERT_EQ(data.size(), values.size());
      // The JSON holds each float32 exactly as a double.
      for (std::size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], static_cast<float>(values[i])) << i;
      ++count;
    }
  }
  EXPECT_EQ(count, expected.at("tensors").size());

  // The documented fixed input, x[i] = float32(((i * 2654435761) mod 2^32) / 2^31 - 1), is what the model
  // was run on: tests of the model can make it themselves.
  const auto input = expected.at("input").get<std::vector<double>>();
  ASSERT_EQ(input.size(), 2u * 3 * 8 * 8);
  for (std::size_t i = 0; i < input.size(); ++i) {
    const std::uint64_t k = (static_cast<std::uint64_t>(i) * 2654435761ULL) % (std::uint64_t{1} << 32);
    ASSERT_EQ(static_cast<float>(static_cast<double>(k) / 2147483648.0 - 1.0), static_cast<float>(input[i])) << i;
  }
  EXPECT_EQ(expected.at("logits").size(), 4u);
}

// Tessera can write back what PyTorch wrote, unchanged.
TEST(CheckpointTorch, FixtureSurvivesATesseraRewrite) {
  TempDir dir;
  const std::string source = (checkpoint_data() / "tiny_torch.h5").string();
  const io::Checkpoint c = io::read_checkpoint(source, tiny_layout());
  io::write_checkpoint(dir.file("rewritten.h5"), c);
  const io::Checkpoint r = io::read_checkpoint(dir.file("rewritten.h5"), tiny_layout());
  EXPECT_EQ(r.meta, c.meta);
  expect_bit_exact(r.params, c.params, "params");
  expect_bit_exact(r.buffers, c.buffers, "buffers");
}

// ---------------------------------------------------------------------------------------------------------
// Atomic writes.

TEST(CheckpointAtomic, SuccessLeavesOnlyTheCheckpoint) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  io::Checkpoint c = make_checkpoint(small_layout());
  io::write_checkpoint(path, c);
  EXPECT_EQ(folder_listing(dir.path()), (std::vector<std::string>{"model.h5"}));
  c.meta.step = 99;
  io::write_checkpoint(path, c);  // replaces
  EXPECT_EQ(folder_listing(dir.path()), (std::vector<std::string>{"model.h5"}));
  EXPECT_EQ(io::read_checkpoint_meta(path).step, 99);
}

TEST(CheckpointAtomic, UnwritableFolderIsAnErrorNamingTheFile) {
  TempDir dir;
  // A regular file where the folder should be: refused for every user, root included (unlike permissions).
  std::ofstream(dir.file("not_a_folder")) << "x";
  const std::string path = dir.file("not_a_folder") + "/model.h5";
  const std::string message =
      internal_error(path, [&] { io::write_checkpoint(path, make_checkpoint(small_layout())); });
  EXPECT_NE(message.find("cannot create '" + path + ".tmp-"), std::string::npos) << message;
  EXPECT_NE(message.find("Not a directory"), std::string::npos) << message;
  EXPECT_EQ(folder_listing(dir.path()), (std::vector<std::string>{"not_a_folder"}));
}

// Sets RLIMIT_FSIZE for the scope: a write past `bytes` fails with EFBIG (SIGXFSZ ignored), like a full disk.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    previous_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    ok_ = setrlimit(RLIMIT_FSIZE, &limit) == 0;
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    signal(SIGXFSZ, previous_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  void (*previous_handler_)(int) = nullptr;
  bool ok_ = false;
};

TEST(CheckpointAtomic, WriteFailingHalfWayKeepsTheOldCheckpoint) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  io::Checkpoint old_checkpoint = make_checkpoint(small_layout());
  io::write_checkpoint(path, old_checkpoint);
  const std::string old_bytes = read_text(path);

  // 4 MiB of weights against a 256 KiB limit, like a disk that fills up: the temporary file is created and
  // written up to the limit, then a write fails in the middle of the tensors' data.
  io::Checkpoint big = make_checkpoint(small_layout());
  big.params["layer2.0.conv1.weight"] = make_tensor({128, 128, 8, 8}, 77);
  std::string message;
  {
    FileSizeLimit limit(256 * 1024);
    ASSERT_TRUE(limit.ok());
    message = internal_error(path, [&] { io::write_checkpoint(path, big); });
  }
  EXPECT_NE(message.find("cannot write '" + path + ".tmp-"), std::string::npos) << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0) << "no HDF5 file left open";
  EXPECT_EQ(folder_listing(dir.path()), (std::vector<std::string>{"model.h5"})) << "temporary file removed";
  EXPECT_EQ(read_text(path), old_bytes) << "old checkpoint untouched";
  expect_bit_exact(io::read_checkpoint(path).params, old_checkpoint.params, "old params");

  // Without the limit the same write succeeds.
  io::write_checkpoint(path, big);
  EXPECT_EQ(io::read_checkpoint(path).params.at("layer2.0.conv1.weight").shape,
            (std::vector<std::int64_t>{128, 128, 8, 8}));
}

TEST(CheckpointAtomic, FailedRenameRemovesTheTemporaryFile) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  fs::create_directory(path);
  std::ofstream(dir.file("model.h5/keep")) << "x";  // a non-empty folder cannot be replaced by a file
  const std::string message =
      internal_error(path, [&] { io::write_checkpoint(path, make_checkpoint(small_layout())); });
  EXPECT_NE(message.find("cannot rename"), std::string::npos) << message;
  EXPECT_EQ(folder_listing(dir.path()), (std::vector<std::string>{"model.h5"}));
  EXPECT_EQ(folder_listing(path), (std::vector<std::string>{"keep"}));
}

TEST(CheckpointAtomic, ArgumentMistakesAreRefusedBeforeAnythingIsWritten) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  io::write_checkpoint(path, make_checkpoint(small_layout()));
  const std::string old_bytes = read_text(path);
  struct Case {
    const char* what;
    void (*mutate)(io::Checkpoint&);
    const char* fragment;
  };
  const Case cases[] = {
      {"data size", [](io::Checkpoint& c) { c.params["fc.bias"].data.pop_back(); },
       "tensor 'fc.bias' in /params has 1 values but shape [2] needs 2"},
      {"slash",
       [](io::Checkpoint& c) {
         c.params["layer1/0.weight"] = {{1}, {1.0f}};
       },
       "invalid name 'layer1/0.weight'"},
      {"negative",
       [](io::Checkpoint& c) {
         c.buffers["x"] = {{-1}, {}};
       },
       "negative dimension"},
      {"architecture", [](io::Checkpoint& c) { c.meta.architecture.clear(); }, "architecture is empty"},
      {"class names",
       [](io::Checkpoint& c) {
         c.meta.class_names = {"a", "b", "c"};
       },
       "3 class names for 2 classes"},
      {"tissue fraction",
       [](io::Checkpoint& c) {
         c.meta.tissue = io::TissueSettings{1.5, 8.0, true};
       },
       "tissue min_fraction must be in [0, 1]"},
      {"tissue mask",
       [](io::Checkpoint& c) {
         c.meta.tissue = io::TissueSettings{0.5, 0.0, true};
       },
       "tissue mask_mpp must be a finite number > 0"},
      {"width", [](io::Checkpoint& c) { c.meta.width = 0; }, "width and classifier_width must be positive"},
      {"optimizer",
       [](io::Checkpoint& c) {
         c.optimizer.slots["m"]["fc.bias"] = {{2}, {1.0f, 2.0f}};
       },
       "optimizer state without an optimizer name"},
      {"state", [](io::Checkpoint& c) { c.state[""] = std::int64_t{1}; }, "invalid name ''"},
      {"replica data size",
       [](io::Checkpoint& c) {
         c.replicas.resize(2);
         c.replicas[1].params["fc.bias"] = {{2}, {1.0f}};
       },
       "tensor 'fc.bias' in /replicas/1/params has 1 values but shape [2] needs 2"},
      {"replica optimizer",
       [](io::Checkpoint& c) {
         c.replicas.resize(1);
         c.replicas[0].optimizer.slots["m"]["fc.bias"] = {{2}, {1.0f, 2.0f}};
       },
       "optimizer state without an optimizer name in /replicas/0/optimizer"},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.what);
    io::Checkpoint c = make_checkpoint(small_layout());
    k.mutate(c);
    const std::string message = internal_error(path, [&] { io::write_checkpoint(path, c); });
    EXPECT_NE(message.find(k.fragment), std::string::npos) << message;
    EXPECT_EQ(read_text(path), old_bytes);
    EXPECT_EQ(folder_listing(dir.path()), (std::vector<std::string>{"model.h5"}));
  }
}

// ---------------------------------------------------------------------------------------------------------
// Broken files: one core::InputError naming the file and the first bad tensor.

TEST(CheckpointErrors, CheckedReadNamesTheFirstBadTensorInModelOrder) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  io::write_checkpoint(path, make_checkpoint(small_layout()));

  // Two mismatches: the one the model lists first is named.
  io::CheckpointLayout layout = small_layout();
  layout.params[3].shape = {8, 4, 3, 3};  // layer1.0.conv1.weight
  layout.params[5].shape = {3, 8};        // fc.weight
  std::string message = input_error(path, [&] { io::read_checkpoint(path, layout); });
  EXPECT_EQ(message,
            "tensor 'layer1.0.conv1.weight' in /params has shape [8, 8, 3, 3], the model expects [8, 4, 3, 3]");

  // Missing from the file (the model has a tensor the file lacks).
  layout = small_layout();
  layout.buffers.push_back({"layer1.0.bn1.running_mean", {8}});
  message = input_error(path, [&] { io::read_checkpoint(path, layout); });
  EXPECT_EQ(message, "tensor 'layer1.0.bn1.running_mean' is missing from /buffers");

  // Extra in the file (the model lacks a tensor the file has): the first extra in the file's order.
  layout = small_layout();
  layout.params.erase(layout.params.begin() + 4, layout.params.begin() + 6);  // downsample, fc.weight
  message = input_error(path, [&] { io::read_checkpoint(path, layout); });
  EXPECT_NE(message.find("tensor 'fc.weight' in /params is not part of the model"), std::string::npos) << message;

  // The message is all there is: "file '<path>': tensor ...".
  try {
    io::read_checkpoint(path, layout);
  } catch (const core::InputError& e) {
    EXPECT_EQ(std::string(e.what()), "file '" + path + "': " + e.message());
  }
}

TEST(CheckpointErrors, OptimizerAndEasgdStateMustMatchTheParameters) {
  TempDir dir;
  const io::CheckpointLayout layout = small_layout();
  {
    const std::string path = dir.file("foreign_momentum.h5");
    io::Checkpoint c = make_checkpoint(layout);
    c.optimizer.name = "sgd";
    c.optimizer.slots["momentum_buffer"]["old_head.weight"] = make_tensor({2}, 1);
    io::write_checkpoint(path, c);
    EXPECT_EQ(io::read_checkpoint(path).optimizer.slots.at("momentum_buffer").size(), 1u) << "free-form: fine";
    EXPECT_EQ(input_error(path, [&] { io::read_checkpoint(path, layout); }),
              "tensor 'old_head.weight' in /optimizer/momentum_buffer is not part of the model (no such parameter)");
  }
  {
    const std::string path = dir.file("momentum_shape.h5");
    io::Checkpoint c = make_checkpoint(layout);
    c.optimizer.name = "sgd";
    c.optimizer.slots["momentum_buffer"]["fc.weight"] = make_tensor({8, 2}, 1);
    io::write_checkpoint(path, c);
    EXPECT_EQ(input_error(path, [&] { io::read_checkpoint(path, layout); }),
              "tensor 'fc.weight' in /optimizer/momentum_buffer has shape [8, 2], the model expects [2, 8]");
  }
  {
    const std::string path = dir.file("partial_center.h5");
    io::Checkpoint c = make_checkpoint(layout);
    for (const auto& spec : layout.params) c.easgd_center[spec.name] = make_tensor(spec.shape, 5);
    c.easgd_center.erase("bn1.bias");
    io::write_checkpoint(path, c);
    EXPECT_EQ(input_error(path, [&] { io::read_checkpoint(path, layout); }),
              "tensor 'bn1.bias' is missing from /easgd/center");
  }
}

TEST(CheckpointErrors, MissingFileAndFolder) {
  TempDir dir;
  EXPECT_THROW(io::read_checkpoint(dir.file("absent.h5")), core::FileNotFoundError);
  EXPECT_THROW(io::read_checkpoint_meta(dir.file("absent.h5")), core::FileNotFoundError);
  EXPECT_EQ(input_error(dir.path().string(), [&] { io::read_checkpoint(dir.path().string()); }), "not a regular file");
}

// Every cut of a checkpoint is refused, and a cut inside a tensor's data names the first tensor the model
// lists whose data is no longer all there.
TEST(CheckpointErrors, TruncatedAnywhereIsRefused) {
  TempDir dir;
  const std::string full = dir.file("full.h5");
  const io::CheckpointLayout layout = small_layout();
  io::write_checkpoint(full, make_checkpoint(layout));
  const auto size = fs::file_size(full);
  // The tensors in the order the checked read visits them, with where their header and data end.
  struct Extent {
    std::string name;  // "tensor 'x'"
    std::uint64_t offset;
    std::uint64_t bytes;
    std::uint64_t end;  // of header and data
  };
  std::vector<Extent> extents;
  for (const auto& [group, specs] : {std::pair{"params", layout.params}, std::pair{"buffers", layout.buffers}}) {
    for (const auto& spec : specs) {
      const std::string name = std::string("/") + group + "/" + spec.name;
      const auto [offset, bytes] = data_extent(full, name);
      const auto [header, header_bytes] = header_extent(full, name);
      extents.push_back({"tensor '" + spec.name + "'", offset, bytes, std::max(offset + bytes, header + header_bytes)});
    }
  }

  std::vector<std::uintmax_t> cuts;
  for (int k = 0; k < 24; ++k) cuts.push_back(size * static_cast<std::uintmax_t>(k) / 24);
  cuts.push_back(size - 1);
  for (const auto& e : extents) cuts.push_back(e.offset + e.bytes / 2);
  const std::string cut_path = dir.file("cut.h5");
  int named = 0;
  for (const auto cut : cuts) {
    SCOPED_TRACE("cut at " + std::to_string(cut) + " of " + std::to_string(size));
    fs::remove(cut_path);
    fs::copy_file(full, cut_path);
    fs::resize_file(cut_path, cut);
    const std::string message = input_error(cut_path, [&] { io::read_checkpoint(cut_path, layout); });
    EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0) << "every HDF5 id closed after the error";
    if (cut == 0) {
      EXPECT_EQ(message, "empty file (0 bytes), not a checkpoint");
      continue;
    }
    EXPECT_NE(message.find("truncated"), std::string::npos) << message;
    // A cut through the metadata may leave no tensor to name (the group listing is gone); whenever the
    // message names a tensor, it is the first one (in model order) whose header or data the cut reaches.
    std::string first_cut;
    for (const auto& e : extents) {
      if (e.end > cut) {
        first_cut = e.name;
        break;
      }
    }
    if (message.rfind("tensor '", 0) == 0) {
      EXPECT_EQ(message.find(first_cut), 0u) << message << " / expected " << first_cut;
      EXPECT_NE(message.find("(the file is truncated: expected at least " + std::to_string(size) +
                             " bytes, the file has " + std::to_string(cut) + ")"),
                std::string::npos)
          << message;
      ++named;
    } else {
      EXPECT_EQ(message.find("truncated: expected at least " + std::to_string(size) + " bytes"), 0u) << message;
    }
  }
  // Tessera writes all metadata before the data, so at least every cut made inside a tensor's data names one.
  EXPECT_GE(named, static_cast<int>(extents.size())) << "every cut inside a tensor's data names a tensor";
}

// ---------------------------------------------------------------------------------------------------------
// Per-rank replicas (/replicas/<rank>/...): each rank's own model and optimizer state under EASGD-type
// strategies.

// A replica of `layout` whose values differ from every other replica's (and the centre's): `rank` seeds them.
io::Replica make_replica(const io::CheckpointLayout& layout, int rank, bool with_optimizer) {
  io::Replica r;
  std::uint32_t seed = 1000u * static_cast<std::uint32_t>(rank + 1);
  for (const auto& spec : layout.params) r.params[spec.name] = make_tensor(spec.shape, seed++);
  for (const auto& spec : layout.buffers) r.buffers[spec.name] = make_buffer(spec.name, spec.shape, seed++);
  if (with_optimizer) {
    r.optimizer.name = "sgd";
    r.optimizer.step = 100 + rank;
    for (const auto& spec : layout.params)
      r.optimizer.slots["momentum_buffer"][spec.name] = make_tensor(spec.shape, seed++);
  }
  return r;
}

io::Checkpoint make_checkpoint_with_replicas(const io::CheckpointLayout& layout, int ranks, bool with_optimizer) {
  io::Checkpoint c = make_checkpoint(layout);
  c.optimizer.name = "sgd";
  c.optimizer.step = 99;
  c.optimizer.slots["momentum_buffer"]["fc.weight"] = make_tensor({2, 8}, 500);
  for (int rank = 0; rank < ranks; ++rank) c.replicas.push_back(make_replica(layout, rank, with_optimizer));
  return c;
}

void expect_replicas_bit_exact(const std::vector<io::Replica>& actual, const std::vector<io::Replica>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t rank = 0; rank < expected.size(); ++rank) {
    const std::string what = "replica " + std::to_string(rank);
    expect_bit_exact(actual[rank].params, expected[rank].params, what + " params");
    expect_bit_exact(actual[rank].buffers, expected[rank].buffers, what + " buffers");
    EXPECT_EQ(actual[rank].optimizer.name, expected[rank].optimizer.name) << what;
    EXPECT_EQ(actual[rank].optimizer.step, expected[rank].optimizer.step) << what;
    ASSERT_EQ(actual[rank].optimizer.slots.size(), expected[rank].optimizer.slots.size()) << what;
    for (const auto& [slot, tensors] : expected[rank].optimizer.slots) {
      expect_bit_exact(actual[rank].optimizer.slots.at(slot), tensors, what + " " + slot);
    }
  }
}

TEST(CheckpointReplicas, RoundTripIsBitExactWithAndWithoutOptimizerState) {
  const io::CheckpointLayout layout = small_layout();
  for (const bool with_optimizer : {true, false}) {
    SCOPED_TRACE(with_optimizer ? "with optimizer state" : "without optimizer state");
    TempDir dir;
    const std::string path = dir.file("model.h5");
    io::Checkpoint c = make_checkpoint_with_replicas(layout, 3, with_optimizer);
    c.replicas[1].params["conv1.weight"].data[0] = -0.0f;
    c.replicas[2].buffers["bn1.running_var"].data[3] = from_bits(0x00012345u);  // a denormal
    io::write_checkpoint(path, c);

    const io::Checkpoint free_form = io::read_checkpoint(path);
    expect_replicas_bit_exact(free_form.replicas, c.replicas);
    expect_bit_exact(free_form.params, c.params, "centre params");
    expect_bit_exact(free_form.optimizer.slots.at("momentum_buffer"), c.optimizer.slots.at("momentum_buffer"),
                     "centre momentum");
    const io::Checkpoint checked = io::read_checkpoint(path, layout);
    expect_replicas_bit_exact(checked.replicas, c.replicas);
    EXPECT_EQ(checked.replicas, free_form.replicas);

    // The documented layout, as plain HDF5 sees it.
    H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
    ASSERT_GE(file.id, 0);
    {
      H5Id d{H5Dopen2(file.id, "/replicas/2/params/fc.weight", H5P_DEFAULT), H5Dclose};
      ASSERT_GE(d.id, 0);
      H5Id type{H5Dget_type(d.id), H5Tclose};
      EXPECT_GT(H5Tequal(type.id, H5T_IEEE_F32LE), 0);
      H5Id space{H5Dget_space(d.id), H5Sclose};
      hsize_t dims[2] = {};
      ASSERT_EQ(H5Sget_simple_extent_ndims(space.id), 2);
      H5Sget_simple_extent_dims(space.id, dims, nullptr);
      EXPECT_EQ(std::vector<hsize_t>(dims, dims + 2), (std::vector<hsize_t>{2, 8}));
      std::vector<float> values(16);
      ASSERT_GE(H5Dread(d.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
      EXPECT_EQ(bits_of(values[11]), bits_of(c.replicas[2].params["fc.weight"].data[11]));
    }
    EXPECT_GT(H5Lexists(file.id, "/replicas/0/buffers/bn1.running_mean", H5P_DEFAULT), 0);
    EXPECT_EQ(H5Lexists(file.id, "/replicas/3", H5P_DEFAULT), 0);
    if (with_optimizer) {
      EXPECT_GT(H5Lexists(file.id, "/replicas/1/optimizer/momentum_buffer/layer1.0.conv1.weight", H5P_DEFAULT), 0);
      H5Id a{H5Aopen_by_name(file.id, "/replicas/1/optimizer", "step", H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
      std::int64_t step = -1;
      EXPECT_GE(H5Aread(a.id, H5T_NATIVE_INT64, &step), 0);
      EXPECT_EQ(step, 101);
      EXPECT_GT(H5Aexists_by_name(file.id, "/replicas/1/optimizer", "name", H5P_DEFAULT), 0);
    } else {
      EXPECT_EQ(H5Lexists(file.id, "/replicas/1/optimizer", H5P_DEFAULT), 0) << "no empty optimizer group";
    }

    // Writing what was read gives the same bytes.
    io::write_checkpoint(dir.file("again.h5"), free_form);
    EXPECT_EQ(read_text(path), read_text(dir.file("again.h5")));
  }
}

TEST(CheckpointReplicas, FilesWithoutReplicasReadWithNone) {
  // Written by PyTorch before replicas existed.
  const std::string fixture = (checkpoint_data() / "tiny_torch.h5").string();
  EXPECT_TRUE(io::read_checkpoint(fixture).replicas.empty());
  EXPECT_TRUE(io::read_checkpoint(fixture, tiny_layout()).replicas.empty());
  EXPECT_EQ(input_error(fixture, [&] { io::read_checkpoint_replica(fixture, 0, tiny_layout()); }),
            "no replica for rank 0: the checkpoint holds no replicas");

  // Written by Tessera without replicas: no /replicas group at all.
  TempDir dir;
  const std::string path = dir.file("model.h5");
  io::write_checkpoint(path, make_checkpoint(small_layout()));
  EXPECT_TRUE(io::read_checkpoint(path, small_layout()).replicas.empty());
  H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  EXPECT_EQ(H5Lexists(file.id, "/replicas", H5P_DEFAULT), 0);
}

TEST(CheckpointReplicas, OneRankReadsOnlyItsOwnReplica) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  const io::CheckpointLayout layout = small_layout();
  const io::Checkpoint c = make_checkpoint_with_replicas(layout, 3, true);
  io::write_checkpoint(path, c);
  for (int rank = 0; rank < 3; ++rank) {
    const io::Replica r = io::read_checkpoint_replica(path, rank, layout);
    expect_replicas_bit_exact({r}, {c.replicas[static_cast<std::size_t>(rank)]});
  }
  const io::Checkpoint skipped = io::read_checkpoint(path, layout, io::ReplicaRead::skip);
  EXPECT_TRUE(skipped.replicas.empty());
  expect_bit_exact(skipped.params, c.params, "centre params");
  EXPECT_EQ(skipped.optimizer, c.optimizer);

  EXPECT_EQ(input_error(path, [&] { io::read_checkpoint_replica(path, 3, layout); }),
            "no replica for rank 3: /replicas holds ranks 0..2");
  internal_error(path, [&] { io::read_checkpoint_replica(path, -1, layout); });

  // Another rank's broken replica is neither read nor checked by this rank's read (nor by a skipping read);
  // the full checked read refuses it.
  {
    H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
    ASSERT_GE(H5Ldelete(file.id, "/replicas/2/params/fc.bias", H5P_DEFAULT), 0);
  }
  expect_replicas_bit_exact({io::read_checkpoint_replica(path, 1, layout)}, {c.replicas[1]});
  EXPECT_TRUE(io::read_checkpoint(path, layout, io::ReplicaRead::skip).replicas.empty());
  EXPECT_EQ(input_error(path, [&] { io::read_checkpoint(path, layout); }),
            "tensor 'fc.bias' is missing from /replicas/2/params");
  EXPECT_EQ(input_error(path, [&] { io::read_checkpoint_replica(path, 2, layout); }),
            "tensor 'fc.bias' is missing from /replicas/2/params");
}

// Replica files (io/checkpoint.h "Replica files"): every rank writes its own into a new set beside the checkpoint,
// and the checkpoint names the set.
io::Checkpoint write_checkpoint_with_replica_files(const std::string& path, const io::CheckpointLayout& layout,
                                                   int ranks, std::vector<io::Replica>& replicas) {
  io::Checkpoint c = make_checkpoint(layout);
  c.meta.step = 7;
  c.replica_files.set = io::new_replica_set(path, c.meta.step);
  replicas.clear();
  for (int rank = 0; rank < ranks; ++rank) {
    replicas.push_back(make_replica(layout, rank, true));
    c.replica_files.bytes.push_back(io::write_replica_file(path, c.replica_files.set, rank, c.meta, replicas.back()));
  }
  io::write_checkpoint(path, c);
  return c;
}

TEST(CheckpointReplicaFiles, EveryRanksFileBesideTheIndexReadsBackBitExact) {
  TempDir dir;
  const std::string path = dir.file("checkpoint.h5");
  const io::CheckpointLayout layout = small_layout();
  std::vector<io::Replica> replicas;
  const io::Checkpoint c = write_checkpoint_with_replica_files(path, layout, 3, replicas);

  // The layout: <stem>.replicas/step-<step>-<hex>/rank-<r>.h5, each rank's file a checkpoint of its replica.
  EXPECT_TRUE(c.replica_files.set.starts_with("checkpoint.replicas/step-000000007-")) << c.replica_files.set;
  EXPECT_EQ(folder_listing(fs::path(dir.file(c.replica_files.set))),
            (std::vector<std::string>{"rank-00000.h5", "rank-00001.h5", "rank-00002.h5"}));
  EXPECT_EQ(io::replica_file(path, c.replica_files.set, 2), dir.file(c.replica_files.set + "/rank-00002.h5"));
  const io::Checkpoint own = io::read_checkpoint(io::replica_file(path, c.replica_files.set, 1), layout);
  expect_bit_exact(own.params, replicas[1].params, "rank 1's file");
  // The checkpoint holds no replica itself: the index, and the centre.
  {
    H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
    EXPECT_EQ(H5Lexists(file.id, "/replicas", H5P_DEFAULT), 0);
    EXPECT_GT(H5Aexists_by_name(file.id, "/replica_files", "set", H5P_DEFAULT), 0);
    EXPECT_GT(H5Aexists_by_name(file.id, "/replica_files", "bytes", H5P_DEFAULT), 0);
  }
  EXPECT_LT(fs::file_size(path), fs::file_size(io::replica_file(path, c.replica_files.set, 0)) * 2);

  // Free-form and checked reads follow the index; one rank reads its own file only; inference reads none.
  const io::Checkpoint free_form = io::read_checkpoint(path);
  expect_replicas_bit_exact(free_form.replicas, replicas);
  EXPECT_EQ(free_form.replica_files, c.replica_files);
  expect_replicas_bit_exact(io::read_checkpoint(path, layout).replicas, replicas);
  for (int rank = 0; rank < 3; ++rank) {
    expect_replicas_bit_exact({io::read_checkpoint_replica(path, rank, layout)},
                              {replicas[static_cast<std::size_t>(rank)]});
  }
  EXPECT_EQ(input_error(path, [&] { io::read_checkpoint_replica(path, 3, layout); }),
            "no replica for rank 3: /replica_files names ranks 0..2");
  fs::remove_all(dir.file("checkpoint.replicas"));
  const io::Checkpoint model = io::read_checkpoint(path, layout, io::ReplicaRead::skip);
  expect_bit_exact(model.params, c.params, "the centre, without its replicas");
  const std::string missing = input_error(path, [&] { io::read_checkpoint_replica(path, 1, layout); });
  EXPECT_TRUE(missing.starts_with("the replica of rank 1 (" + io::replica_file(path, c.replica_files.set, 1) +
                                  ") cannot be read"))
      << missing;
  EXPECT_NE(missing.find("kept with its folder " + c.replica_files.set), std::string::npos) << missing;
}

TEST(CheckpointReplicaFiles, AFileOfAnotherRankSetOrSizeIsRefusedNamingIt) {
  TempDir dir;
  const std::string path = dir.file("checkpoint.h5");
  const io::CheckpointLayout layout = small_layout();
  std::vector<io::Replica> replicas;
  const io::Checkpoint c = write_checkpoint_with_replica_files(path, layout, 2, replicas);
  const std::string file0 = io::replica_file(path, c.replica_files.set, 0);
  const std::string file1 = io::replica_file(path, c.replica_files.set, 1);

  // Rank 0's file in rank 1's place (same size: only its own record tells).
  fs::copy_file(file1, dir.file("saved"));
  fs::copy_file(file0, file1, fs::copy_options::overwrite_existing);
  ASSERT_EQ(fs::file_size(file0), fs::file_size(dir.file("saved")));
  EXPECT_EQ(input_error(file1, [&] { io::read_checkpoint_replica(path, 1, layout); }),
            "not the replica of rank 1 of set " + c.replica_files.set + " that the checkpoint " + path + " names");

  // A file of another set (an older checkpoint's) in its place.
  io::Checkpoint other = c;
  other.replica_files.set = io::new_replica_set(path, 3);
  io::write_replica_file(path, other.replica_files.set, 1, c.meta, replicas[1]);
  fs::copy_file(io::replica_file(path, other.replica_files.set, 1), file1, fs::copy_options::overwrite_existing);
  EXPECT_EQ(input_error(file1, [&] { io::read_checkpoint(path, layout); }),
            "not the replica of rank 1 of set " + c.replica_files.set + " that the checkpoint " + path + " names");

  // Cut short: the size the index records tells first.
  fs::copy_file(dir.file("saved"), file1, fs::copy_options::overwrite_existing);
  expect_replicas_bit_exact({io::read_checkpoint_replica(path, 1, layout)}, {replicas[1]});
  fs::resize_file(file1, fs::file_size(file1) - 100);
  EXPECT_EQ(input_error(file1, [&] { io::read_checkpoint(path); }),
            fmt::format("the replica file of rank 1 has {} bytes, the checkpoint {} records {}: it belongs to another "
                        "checkpoint or is damaged",
                        fs::file_size(file1), path, c.replica_files.bytes[1]));
}

TEST(CheckpointReplicaFiles, OnlyTheNamedSetIsKeptAndTheIndexIsChecked) {
  TempDir dir;
  const std::string path = dir.file("checkpoint.h5");
  const io::CheckpointLayout layout = small_layout();
  std::vector<io::Replica> replicas;
  const io::Checkpoint first = write_checkpoint_with_replica_files(path, layout, 2, replicas);
  const io::Checkpoint second = write_checkpoint_with_replica_files(path, layout, 2, replicas);
  ASSERT_NE(first.replica_files.set, second.replica_files.set) << "a new set for every checkpoint, also of one step";
  const std::string unnamed = io::new_replica_set(path, 9);  // what a job killed before publishing leaves
  // Another checkpoint's sets in the same folder are its own.
  std::vector<io::Replica> epoch_replicas;
  const io::Checkpoint epoch =
      write_checkpoint_with_replica_files(dir.file("checkpoint-epoch-001.h5"), layout, 2, epoch_replicas);
  EXPECT_EQ(folder_listing(dir.file("checkpoint.replicas")).size(), 3u);
  io::remove_other_replica_sets(path, second.replica_files.set);
  EXPECT_EQ(folder_listing(dir.file("checkpoint.replicas")),
            (std::vector<std::string>{fs::path(second.replica_files.set).filename().string()}));
  expect_replicas_bit_exact(io::read_checkpoint(path, layout).replicas, replicas);
  expect_replicas_bit_exact(io::read_checkpoint(dir.file("checkpoint-epoch-001.h5"), layout).replicas, epoch_replicas);
  EXPECT_FALSE(fs::exists(dir.file(unnamed)));
  (void)epoch;

  // The writer refuses an index that is not one, before writing anything.
  io::Checkpoint both = make_checkpoint_with_replicas(layout, 1, false);
  both.replica_files = second.replica_files;
  const std::string other = dir.file("other.h5");
  EXPECT_NE(internal_error(other, [&] { io::write_checkpoint(other, both); })
                .find("a checkpoint holds its replicas in the file or names replica files, not both"),
            std::string::npos);
  io::Checkpoint outside = make_checkpoint(layout);
  outside.replica_files = {"../elsewhere", {10}};
  EXPECT_NE(internal_error(other, [&] { io::write_checkpoint(other, outside); })
                .find("/replica_files set '../elsewhere' is not a folder beside the checkpoint"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(other));
}

TEST(CheckpointReplicas, CheckedReadNamesTheBadTensorAndItsReplica) {
  TempDir dir;
  const io::CheckpointLayout layout = small_layout();
  struct Case {
    const char* what;
    void (*mutate)(io::Checkpoint&);
    int rank;
    const char* message;
  };
  const Case cases[] = {
      {"shape",
       [](io::Checkpoint& c) {
         c.replicas[1].params["fc.weight"] = make_tensor({8, 2}, 1);
       },
       1, "tensor 'fc.weight' in /replicas/1/params has shape [8, 2], the model expects [2, 8]"},
      {"missing buffer", [](io::Checkpoint& c) { c.replicas[2].buffers.erase("bn1.running_var"); }, 2,
       "tensor 'bn1.running_var' is missing from /replicas/2/buffers"},
      {"extra param", [](io::Checkpoint& c) { c.replicas[0].params["old_head.weight"] = make_tensor({2}, 1); }, 0,
       "tensor 'old_head.weight' in /replicas/0/params is not part of the model (unexpected tensor)"},
      {"momentum shape",
       [](io::Checkpoint& c) { c.replicas[1].optimizer.slots["momentum_buffer"]["fc.bias"] = make_tensor({3}, 1); }, 1,
       "tensor 'fc.bias' in /replicas/1/optimizer/momentum_buffer has shape [3], the model expects [2]"},
      {"foreign momentum",
       [](io::Checkpoint& c) {
         c.replicas[2].optimizer.slots["momentum_buffer"]["old_head.weight"] = make_tensor({2}, 1);
       },
       2,
       "tensor 'old_head.weight' in /replicas/2/optimizer/momentum_buffer is not part of the model (no such "
       "parameter)"},
      {"nan momentum",
       [](io::Checkpoint& c) {
         c.replicas[1].optimizer.slots["momentum_buffer"]["fc.bias"].data[1] = std::numeric_limits<float>::quiet_NaN();
       },
       1,
       "tensor 'fc.bias' in /replicas/1/optimizer/momentum_buffer: element 1 is nan (a checkpoint's numbers must be "
       "finite; the run that wrote it diverged or the file is damaged)"},
      {"infinite replica weight",
       [](io::Checkpoint& c) { c.replicas[2].params["fc.weight"].data[3] = std::numeric_limits<float>::infinity(); }, 2,
       "tensor 'fc.weight' in /replicas/2/params: element 3 is inf (a checkpoint's numbers must be finite; the run "
       "that wrote it diverged or the file is damaged)"},
      {"negative replica variance", [](io::Checkpoint& c) { c.replicas[0].buffers["bn1.running_var"].data[0] = -1.0f; },
       0,
       "tensor 'bn1.running_var' in /replicas/0/buffers: element 0 is -1 (a BatchNorm running variance must be "
       "above 0)"},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.what);
    const std::string path = dir.file(std::string(k.what) + ".h5");
    io::Checkpoint c = make_checkpoint_with_replicas(layout, 3, true);
    k.mutate(c);
    io::write_checkpoint(path, c);
    EXPECT_EQ(io::read_checkpoint(path).replicas.size(), 3u) << "free-form: fine";
    EXPECT_EQ(input_error(path, [&] { io::read_checkpoint(path, layout); }), k.message);
    EXPECT_EQ(input_error(path, [&] { io::read_checkpoint_replica(path, k.rank, layout); }), k.message);
    const int other = (k.rank + 1) % 3;
    expect_replicas_bit_exact({io::read_checkpoint_replica(path, other, layout)},
                              {c.replicas[static_cast<std::size_t>(other)]});
  }
}

TEST(CheckpointReplicas, RanksMustBeZeroToNMinusOneWithoutGaps) {
  TempDir dir;
  const io::CheckpointLayout layout = small_layout();
  const std::string source = dir.file("source.h5");
  io::write_checkpoint(source, make_checkpoint_with_replicas(layout, 3, false));
  struct Case {
    const char* what;
    void (*mutate)(hid_t file);
    const char* message;
  };
  const Case cases[] = {
      {"gap", [](hid_t f) { ASSERT_GE(H5Ldelete(f, "/replicas/1", H5P_DEFAULT), 0); },
       "/replicas has no rank 1: replicas must be ranks 0..n-1 without gaps (found 0, 2)"},
      {"no rank 0", [](hid_t f) { ASSERT_GE(H5Ldelete(f, "/replicas/0", H5P_DEFAULT), 0); },
       "/replicas has no rank 0: replicas must be ranks 0..n-1 without gaps (found 1, 2)"},
      {"not a number",
       [](hid_t f) { ASSERT_GE(H5Lmove(f, "/replicas/2", f, "/replicas/two", H5P_DEFAULT, H5P_DEFAULT), 0); },
       "'/replicas/two' is not a rank (replicas are /replicas/0, /replicas/1, ...)"},
      {"leading zero",
       [](hid_t f) { ASSERT_GE(H5Lmove(f, "/replicas/2", f, "/replicas/02", H5P_DEFAULT, H5P_DEFAULT), 0); },
       "'/replicas/02' is not a rank (replicas are /replicas/0, /replicas/1, ...)"},
      {"not a group",
       [](hid_t f) {
         ASSERT_GE(H5Ldelete(f, "/replicas/1", H5P_DEFAULT), 0);
         H5Id space{H5Screate(H5S_SCALAR), H5Sclose};
         H5Id d{H5Dcreate2(f, "/replicas/1", H5T_IEEE_F32LE, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                H5Dclose};
         ASSERT_GE(d.id, 0);
       },
       "'/replicas/1' is not a group"},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.what);
    const std::string path = dir.file(std::string(k.what) + ".h5");
    fs::copy_file(source, path);
    {
      H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
      ASSERT_GE(file.id, 0);
      k.mutate(file.id);
    }
    if (HasFatalFailure()) return;
    EXPECT_EQ(input_error(path, [&] { io::read_checkpoint(path); }), k.message);
    EXPECT_EQ(input_error(path, [&] { io::read_checkpoint(path, layout); }), k.message);
    // A rank reading its own replica still sees that the set of ranks is broken.
    EXPECT_EQ(input_error(path, [&] { io::read_checkpoint_replica(path, 0, layout); }), k.message);
    EXPECT_TRUE(io::read_checkpoint(path, layout, io::ReplicaRead::skip).replicas.empty());
  }
}

// A cut inside a replica's tensor data names the first tensor, in the order a read visits them (the centre's,
// then rank 0's params, buffers and optimizer state, then rank 1's, ...), whose data the cut reaches.
TEST(CheckpointReplicas, TruncatedFileNamesTheReplicaTensor) {
  TempDir dir;
  const std::string full = dir.file("full.h5");
  const io::CheckpointLayout layout = small_layout();
  io::Checkpoint c = make_checkpoint_with_replicas(layout, 3, true);
  c.optimizer = {};
  io::write_checkpoint(full, c);
  const auto size = fs::file_size(full);
  struct Extent {
    std::string label;  // "tensor 'x' in /replicas/1/params"
    std::uint64_t offset;
    std::uint64_t bytes;
    std::uint64_t end;
  };
  std::vector<Extent> extents;
  auto add = [&](const std::string& group, const std::vector<io::TensorSpec>& specs) {
    for (const auto& spec : specs) {
      const std::string name = "/" + group + "/" + spec.name;
      const auto [offset, bytes] = data_extent(full, name);
      const auto [header, header_bytes] = header_extent(full, name);
      extents.push_back(
          {"tensor '" + spec.name + "' in /" + group, offset, bytes, std::max(offset + bytes, header + header_bytes)});
    }
  };
  add("params", layout.params);
  add("buffers", layout.buffers);
  for (int rank = 0; rank < 3; ++rank) {
    const std::string prefix = "replicas/" + std::to_string(rank) + "/";
    add(prefix + "params", layout.params);
    add(prefix + "buffers", layout.buffers);
    add(prefix + "optimizer/momentum_buffer", layout.params);
  }
  const std::string cut_path = dir.file("cut.h5");
  int replica_named = 0;
  for (const auto& cut_in : extents) {
    if (cut_in.label.find("/replicas/") == std::string::npos) continue;
    const std::uint64_t cut = cut_in.offset + cut_in.bytes / 2;
    SCOPED_TRACE("cut inside " + cut_in.label + " at " + std::to_string(cut));
    fs::remove(cut_path);
    fs::copy_file(full, cut_path);
    fs::resize_file(cut_path, cut);
    std::string first_cut;
    for (const auto& e : extents) {
      if (e.end > cut) {
        first_cut = e.label;
        break;
      }
    }
    const std::string tail = " (the file is truncated: expected at least " + std::to_string(size) +
                             " bytes, the file has " + std::to_string(cut) + ")";
    for (const auto& message : {input_error(cut_path, [&] { io::read_checkpoint(cut_path, layout); }),
                                input_error(cut_path, [&] { io::read_checkpoint_replica(cut_path, 0, layout); })}) {
      EXPECT_EQ(message.rfind(first_cut + ": its data (bytes ", 0), 0u) << message << " / expected " << first_cut;
      EXPECT_NE(message.find("lies beyond the end of the file" + tail), std::string::npos) << message;
    }
    EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0) << "every HDF5 id closed after the error";
    if (first_cut.find("/replicas/") != std::string::npos) ++replica_named;
  }
  EXPECT_GE(replica_named, 3) << "cuts in the replicas' data name replica tensors";
}

// A case: tests/data/checkpoints/bad/<name>/case.txt ("mutation: ...", "read: checked|free|both") applied to
// a copy of tiny_torch.h5, or an input.h5 of its own; expected.txt lists fragments the message must contain.
struct BadCase {
  std::string mutation;
  std::string read = "checked";
};

BadCase parse_case(const std::string& text) {
  BadCase c;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto colon = line.find(": ");
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, colon);
    const std::string value = line.substr(colon + 2);
    if (key == "mutation") c.mutation = value;
    if (key == "read") c.read = value;
  }
  return c;
}

std::vector<hsize_t> parse_dims(const std::string& text) {
  std::vector<hsize_t> dims;
  std::istringstream in(text);
  for (std::string part; std::getline(in, part, ',');) dims.push_back(std::stoull(part));
  return dims;
}

// HDF5 prints its error stack for calls that are expected to fail (H5Lexists on a path through a missing group).
class QuietHdf5Errors {
 public:
  QuietHdf5Errors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5Errors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietHdf5Errors(const QuietHdf5Errors&) = delete;
  QuietHdf5Errors& operator=(const QuietHdf5Errors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// Applies one mutation with plain HDF5 calls (or a cut); fails the test if it cannot.
void apply_mutation(const std::string& path, const std::string& mutation) {
  QuietHdf5Errors quiet;
  std::istringstream in(mutation);
  std::string verb;
  std::string target;
  in >> verb >> target;
  if (verb == "truncate") {
    fs::resize_file(path, std::stoull(target));
    return;
  }
  if (verb == "truncate-inside") {
    const auto [offset, bytes] = data_extent(path, "/" + target);
    ASSERT_GT(bytes, 4u);
    fs::resize_file(path, offset + bytes / 2);
    return;
  }
  H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
  ASSERT_GE(file.id, 0);
  auto replace_dataset = [&](const std::string& name, hid_t type, const std::vector<hsize_t>& dims) {
    if (H5Lexists(file.id, name.c_str(), H5P_DEFAULT) > 0) {
      ASSERT_GE(H5Ldelete(file.id, name.c_str(), H5P_DEFAULT), 0);
    }
    H5Id space{H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose};
    H5Id lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
    H5Pset_create_intermediate_group(lcpl.id, 1);
    H5Id d{H5Dcreate2(file.id, name.c_str(), type, space.id, lcpl.id, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
    ASSERT_GE(d.id, 0) << name;
    hsize_t n = 1;
    for (const auto dim : dims) n *= dim;
    const std::vector<double> values(n, 0.25);
    ASSERT_GE(H5Dwrite(d.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  };
  auto dims_of = [&](const std::string& name) {
    H5Id d{H5Dopen2(file.id, name.c_str(), H5P_DEFAULT), H5Dclose};
    H5Id space{H5Dget_space(d.id), H5Sclose};
    std::vector<hsize_t> dims(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space.id)));
    H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
    return dims;
  };
  std::string argument;
  std::string value;
  if (verb == "delete") {
    ASSERT_GE(H5Ldelete(file.id, target.c_str(), H5P_DEFAULT), 0);
  } else if (verb == "add-group") {
    H5Id group{H5Gcreate2(file.id, target.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
    ASSERT_GE(group.id, 0) << target;
  } else if (verb == "delete-attribute") {
    in >> argument;
    ASSERT_GE(H5Adelete_by_name(file.id, target.c_str(), argument.c_str(), H5P_DEFAULT), 0);
  } else if (verb == "set-string" || verb == "set-int") {
    in >> argument >> value;
    if (H5Aexists_by_name(file.id, target.c_str(), argument.c_str(), H5P_DEFAULT) > 0) {
      ASSERT_GE(H5Adelete_by_name(file.id, target.c_str(), argument.c_str(), H5P_DEFAULT), 0);
    }
    H5Id space{H5Screate(H5S_SCALAR), H5Sclose};
    if (verb == "set-int") {
      const std::int64_t number = std::stoll(value);
      H5Id a{H5Acreate_by_name(file.id, target.c_str(), argument.c_str(), H5T_STD_I64LE, space.id, H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT),
             H5Aclose};
      ASSERT_GE(H5Awrite(a.id, H5T_NATIVE_INT64, &number), 0);
    } else {
      H5Id type{H5Tcopy(H5T_C_S1), H5Tclose};
      H5Tset_size(type.id, H5T_VARIABLE);
      H5Id a{H5Acreate_by_name(file.id, target.c_str(), argument.c_str(), type.id, space.id, H5P_DEFAULT, H5P_DEFAULT,
                               H5P_DEFAULT),
             H5Aclose};
      const char* text = value.c_str();
      ASSERT_GE(H5Awrite(a.id, type.id, &text), 0);
    }
  } else if (verb == "reshape") {
    in >> value;
    replace_dataset(target, H5T_IEEE_F32LE, parse_dims(value));
  } else if (verb == "retype") {
    in >> value;
    ASSERT_EQ(value, "float64");
    replace_dataset(target, H5T_IEEE_F64LE, dims_of(target));
  } else if (verb == "add") {
    in >> value;
    replace_dataset(target, H5T_IEEE_F32LE, parse_dims(value));
  } else if (verb == "set-value") {
    // set-value <dataset> <flat index> <number: also nan, inf, -inf>: one element changed in place.
    std::size_t index = 0;
    in >> index >> value;
    H5Id d{H5Dopen2(file.id, target.c_str(), H5P_DEFAULT), H5Dclose};
    ASSERT_GE(d.id, 0) << target;
    hsize_t n = 1;
    for (const auto dim : dims_of(target)) n *= dim;
    ASSERT_LT(index, n) << mutation;
    std::vector<float> values(n);
    ASSERT_GE(H5Dread(d.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    values[index] = std::strtof(value.c_str(), nullptr);
    ASSERT_GE(H5Dwrite(d.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  } else {
    FAIL() << "unknown mutation '" << mutation << "'";
  }
}

TEST(CheckpointErrors, DataDrivenBrokenFiles) {
  const fs::path root = checkpoint_data() / "bad";
  ASSERT_TRUE(fs::is_directory(root)) << root;
  std::vector<fs::path> cases;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) cases.push_back(entry.path());
  }
  std::sort(cases.begin(), cases.end());
  ASSERT_GE(cases.size(), 12u);
  TempDir dir;
  for (const auto& folder : cases) {
    SCOPED_TRACE(folder.filename().string());
    const BadCase c = parse_case(read_text((folder / "case.txt").string()));
    std::vector<std::string> expected;
    std::istringstream lines(read_text((folder / "expected.txt").string()));
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) expected.push_back(line);
    }
    ASSERT_FALSE(expected.empty()) << "expected.txt is empty";

    std::string path;
    if (fs::exists(folder / "input.h5")) {
      path = (folder / "input.h5").string();
    } else {
      ASSERT_FALSE(c.mutation.empty()) << "case.txt has no mutation and there is no input.h5";
      path = dir.file(folder.filename().string() + ".h5");
      fs::copy_file(checkpoint_data() / "tiny_torch.h5", path, fs::copy_options::overwrite_existing);
      apply_mutation(path, c.mutation);
      if (HasFatalFailure()) return;
    }
    ASSERT_TRUE(c.read == "checked" || c.read == "free" || c.read == "both") << c.read;
    std::vector<std::string> messages;
    if (c.read != "free") messages.push_back(input_error(path, [&] { io::read_checkpoint(path, tiny_layout()); }));
    if (c.read != "checked") messages.push_back(input_error(path, [&] { io::read_checkpoint(path); }));
    for (const auto& message : messages) {
      for (const auto& part : expected) EXPECT_NE(message.find(part), std::string::npos) << message;
    }
    EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0) << "every HDF5 id closed after the error";
  }
}

// /easgd's layout attribute tells a checkpoint written before /easgd/center_buffers (read without it: the live centre's
// buffers are /buffers) from one that lost it (refused, naming the file and the group).
TEST(CheckpointErrors, EasgdCentreBuffersLostFromALayout2FileAreAnErrorNotAnOldFile) {
  TempDir dir;
  const io::CheckpointLayout layout = small_layout();
  io::Checkpoint c = make_checkpoint(layout);
  for (const auto& spec : layout.params) c.easgd_center[spec.name] = make_tensor(spec.shape, 500);
  for (const auto& spec : layout.buffers) c.easgd_center_buffers[spec.name] = make_buffer(spec.name, spec.shape, 510);
  const std::string written = dir.file("written.h5");
  io::write_checkpoint(written, c);
  const auto edited = [&](const std::string& name, const std::vector<std::string>& mutations) {
    const std::string path = dir.file(name);
    fs::copy_file(written, path);
    for (const auto& mutation : mutations) apply_mutation(path, mutation);
    return path;
  };
  const auto refused = [&](const std::string& path, const std::vector<std::string>& parts) {
    for (const auto& message : {input_error(path, [&] { io::read_checkpoint(path, layout); }),
                                input_error(path, [&] { io::read_checkpoint(path); })}) {
      for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  };

  refused(edited("lost.h5", {"delete /easgd/center_buffers"}), {"missing group '/easgd/center_buffers'", "layout 2"});
  const std::string damaged = edited("damaged.h5", {"delete /easgd/center_buffers/bn1.running_var"});
  EXPECT_NE(input_error(damaged, [&] { io::read_checkpoint(damaged, layout); }).find("'bn1.running_var'"),
            std::string::npos);
  // The free-form read (tessera quantize's) keeps what is there; written back, the file is still layout 2 and the
  // checked read still refuses it.
  io::Checkpoint kept = io::read_checkpoint(damaged);
  ASSERT_FALSE(kept.easgd_center_buffers.empty());
  EXPECT_EQ(kept.easgd_center_buffers.count("bn1.running_var"), 0u);
  EXPECT_EQ(kept.easgd_center_buffers.size(), c.easgd_center_buffers.size() - 1);
  const std::string rewritten = dir.file("rewritten.h5");
  io::write_checkpoint(rewritten, kept);
  EXPECT_NE(input_error(rewritten, [&] { io::read_checkpoint(rewritten, layout); }).find("'bn1.running_var'"),
            std::string::npos);
  refused(edited("empty.h5", {"delete /easgd/center_buffers", "add-group /easgd/center_buffers"}),
          {"/easgd/center_buffers"});
  const std::string empty = dir.file("empty.h5");
  EXPECT_NE(input_error(empty, [&] { io::read_checkpoint(empty); }).find("'/easgd/center_buffers' is empty"),
            std::string::npos);
  refused(edited("string.h5", {"set-string /easgd layout 2"}), {"'layout'", "must be an integer"});
  // The layout is checked before /easgd/center is read.
  refused(edited("newer-without-centre.h5", {"set-int /easgd layout 3", "delete /easgd/center"}),
          {"/easgd layout 3 is newer than this Tessera reads (2)"});
  refused(edited("newer.h5", {"set-int /easgd layout 3"}), {"/easgd layout 3 is newer than this Tessera reads (2)"});
  refused(edited("invalid.h5", {"set-int /easgd layout 0"}), {"invalid /easgd layout 0"});
  refused(edited("contradicts.h5", {"set-int /easgd layout 1"}), {"'/easgd/center_buffers' is present", "layout 1"});

  // Written before the attribute: without the group an old checkpoint (none), with it one of the files written between
  // the two changes.
  for (const std::string& path : {edited("old.h5", {"delete /easgd/center_buffers", "delete-attribute /easgd layout"}),
                                  edited("unmarked.h5", {"delete-attribute /easgd layout"})}) {
    SCOPED_TRACE(path);
    const io::Checkpoint r = io::read_checkpoint(path, layout);
    expect_bit_exact(r.easgd_center, c.easgd_center, "easgd");
    if (path.ends_with("old.h5")) {
      EXPECT_TRUE(r.easgd_center_buffers.empty());
    } else {
      expect_bit_exact(r.easgd_center_buffers, c.easgd_center_buffers, "easgd centre buffers");
    }
  }
  // A centre without buffers is written as layout 1 and read back with none.
  c.easgd_center_buffers.clear();
  const std::string none = dir.file("none.h5");
  io::write_checkpoint(none, c);
  EXPECT_TRUE(io::read_checkpoint(none, layout).easgd_center_buffers.empty());
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0) << "every HDF5 id closed after the errors";
}

// ---------------------------------------------------------------------------------------------------------
// Provenance: what the model was trained on (io/provenance.h).

TEST(CheckpointProvenance, RoundTripsAsPlainAttributesOfMeta) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  io::Checkpoint c = make_checkpoint(small_layout());
  c.meta.provenance = io::TrainingProvenance{6, 0, 0, "/data/demo/shards"};
  io::write_checkpoint(path, c);
  const io::CheckpointMeta meta = io::read_checkpoint_meta(path);
  EXPECT_EQ(meta, c.meta);
  ASSERT_TRUE(meta.provenance.has_value());
  EXPECT_EQ(meta.provenance->data(), io::TrainingData::synthetic);

  // What h5py sees: f["meta"].attrs["training_data"] and the counts.
  H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  H5Id a{H5Aopen_by_name(file.id, "/meta", "training_data", H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  H5Id type{H5Aget_type(a.id), H5Tclose};
  char* value = nullptr;
  ASSERT_GE(H5Aread(a.id, type.id, &value), 0);
  EXPECT_STREQ(value, "synthetic");
  H5free_memory(value);
  for (const auto& [name, expected] : std::vector<std::pair<const char*, std::int64_t>>{
           {"training_synthetic_slides", 6}, {"training_real_slides", 0}, {"training_unknown_slides", 0}}) {
    H5Id count{H5Aopen_by_name(file.id, "/meta", name, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    std::int64_t n = -1;
    ASSERT_GE(H5Aread(count.id, H5T_NATIVE_INT64, &n), 0) << name;
    EXPECT_EQ(n, expected) << name;
  }
}

// A checkpoint written before provenance was recorded (the PyTorch fixture has none) loads, with the training data
// unknown, and calls for no caution on any slide.
TEST(CheckpointProvenance, ACheckpointWithoutItLoadsAsUnknownAndClaimsNothing) {
  const std::string fixture = (checkpoint_data() / "tiny_torch.h5").string();
  const io::CheckpointMeta meta = io::read_checkpoint_meta(fixture);
  EXPECT_FALSE(meta.provenance.has_value());
  EXPECT_EQ(io::training_data(meta.provenance), io::TrainingData::unknown);
  EXPECT_STREQ(io::to_string(io::training_data(meta.provenance)), "unknown");
  EXPECT_EQ(io::describe(meta.provenance), "unknown (the checkpoint records no provenance)");
  EXPECT_EQ(io::model_caution(meta.provenance, /*slide_is_synthetic=*/false), "");
  EXPECT_EQ(io::model_caution(meta.provenance, /*slide_is_synthetic=*/true), "");

  // Rewritten by Tessera, it still records none.
  TempDir dir;
  io::write_checkpoint(dir.file("again.h5"), io::read_checkpoint(fixture));
  H5Id file{H5Fopen(dir.file("again.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  for (const char* absent : {"training_data", "training_synthetic_slides", "training_real_slides",
                             "training_unknown_slides", "training_shards"}) {
    EXPECT_EQ(H5Aexists_by_name(file.id, "meta", absent, H5P_DEFAULT), 0) << absent;
  }
}

// The training data follows from the counts, and only a model trained on synthetic slides alone, scoring a slide
// tessera synth did not make, calls for the caution.
TEST(CheckpointProvenance, TrainingDataAndCautionFollowFromTheCounts) {
  struct Case {
    io::TrainingProvenance provenance;
    io::TrainingData data;
    bool caution_on_a_real_slide;
  };
  const std::vector<Case> cases = {
      {{6, 0, 0, "s"}, io::TrainingData::synthetic, true},
      {{0, 4, 0, "s"}, io::TrainingData::real, false},
      {{3, 1, 0, "s"}, io::TrainingData::mixed, false},
      {{3, 0, 1, "s"}, io::TrainingData::unknown, false},  // one slide of unknown origin: no claim
      {{0, 0, 0, "s"}, io::TrainingData::unknown, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(io::describe(c.provenance));
    EXPECT_EQ(c.provenance.data(), c.data);
    EXPECT_EQ(io::model_caution(c.provenance, false), c.caution_on_a_real_slide ? io::kSyntheticModelCaution : "");
    EXPECT_EQ(io::model_caution(c.provenance, true), "") << "a synthetic slide never gets the caution";
  }
  EXPECT_EQ(std::string(io::kSyntheticModelCaution), "model trained on synthetic slides \u2014 demonstration only");
  EXPECT_EQ(io::describe(io::TrainingProvenance{6, 0, 0, "/data/shards"}),
            "synthetic slides only (6 training slide(s): 6 made by tessera synth, 0 not; shards /data/shards)");
  EXPECT_EQ(io::describe(io::TrainingProvenance{3, 1, 2, "/s"}),
            "slides of unknown origin (6 training slide(s): 3 made by tessera synth, 1 not, 2 of unknown origin; "
            "shards /s)");
}

// The model's size (/meta width, classifier_width) round-trips as an int64 attribute; a file without it (every file
// written before it, the PyTorch fixture) reads as not recorded, and a size below 1 or beyond an int is refused.
TEST(CheckpointModelSize, RoundTripsAndIsAbsentFromOlderFiles) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  io::Checkpoint c = make_checkpoint(small_layout());
  c.meta.width = 8;
  io::write_checkpoint(path, c);
  const io::CheckpointMeta meta = io::read_checkpoint_meta(path);
  EXPECT_EQ(meta, c.meta);
  EXPECT_EQ(meta.width, std::optional<std::int64_t>(8));
  EXPECT_FALSE(meta.classifier_width.has_value());
  {
    H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
    H5Id a{H5Aopen_by_name(file.id, "/meta", "width", H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    std::int64_t width = 0;
    ASSERT_GE(H5Aread(a.id, H5T_NATIVE_INT64, &width), 0);
    EXPECT_EQ(width, 8);
    EXPECT_EQ(H5Aexists_by_name(file.id, "meta", "classifier_width", H5P_DEFAULT), 0);
  }

  const io::CheckpointMeta old = io::read_checkpoint_meta((checkpoint_data() / "tiny_torch.h5").string());
  EXPECT_FALSE(old.width.has_value());
  EXPECT_FALSE(old.classifier_width.has_value());

  apply_mutation(path, "set-int meta classifier_width 0");
  EXPECT_EQ(input_error(path, [&] { io::read_checkpoint_meta(path); }),
            "attribute 'classifier_width' in /meta must be an integer in [1, 2147483647], got 0");
  apply_mutation(path, "set-int meta classifier_width 2147483648");
  EXPECT_NE(input_error(path, [&] { io::read_checkpoint_meta(path); }).find("got 2147483648"), std::string::npos);
}

// Counts that contradict training_data, or a negative count, are refused naming the attribute; the writer refuses
// negative counts before writing anything.
TEST(CheckpointProvenance, AttributesThatContradictEachOtherAreRefused) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  io::Checkpoint c = make_checkpoint(small_layout());
  c.meta.provenance = io::TrainingProvenance{2, 0, 0, "/shards"};
  io::write_checkpoint(path, c);
  apply_mutation(path, "set-string meta training_data real");
  EXPECT_EQ(input_error(path, [&] { io::read_checkpoint_meta(path); }),
            "attribute 'training_data' in /meta is 'real', but its slide counts (2 synthetic, 0 real, 0 unknown) make "
            "it 'synthetic'");
  apply_mutation(path, "set-int meta training_real_slides -1");
  EXPECT_NE(input_error(path, [&] { io::read_checkpoint_meta(path); })
                .find("attribute 'training_real_slides' in /meta must not be negative, got -1"),
            std::string::npos);

  c.meta.provenance->synthetic_slides = -1;
  EXPECT_NE(internal_error(dir.file("negative.h5"), [&] { io::write_checkpoint(dir.file("negative.h5"), c); })
                .find("training slide counts must not be negative"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir.file("negative.h5")));
}

}  // namespace
