// Numbers that cannot be right are refused, and the numbers Tessera makes are right: infer's probabilities stay in
// [0, 1] on slides the model never saw (unseen synthetic seeds and a real scan) and `evaluate` accepts every file
// infer and predict write; every numeric flag of every verb is checked as its YAML key is, and the error names
// the flag (or the `--set key=value` it came from).
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <hdf5.h>
#include <nlohmann/json.hpp>

#include "io/heatmap.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::run;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// The shared real slides (../shared/data/real-slides beside the repository; not committed).
fs::path real_slides() { return testing::shared_data_dir() / "real-slides"; }

// Every probability infer wrote for a slide: the heatmap's scored cells, the detections' first column and the
// report's slide score. Each must lie in [0, 1]; returns how many were checked.
std::size_t expect_probabilities(const fs::path& out, const std::string& id) {
  std::size_t checked = 0;
  const io::Heatmap map = io::read_heatmap((out / (id + ".heatmap.h5")).string());
  for (std::size_t i = 0; i < map.prob.size(); ++i) {
    const float p = map.prob[i];
    if (std::isnan(p)) continue;  // a cell without tissue
    EXPECT_TRUE(p >= 0.0f && p <= 1.0f) << id << ": heatmap cell " << i << " has P " << p;
    ++checked;
  }
  std::ifstream detections(out / (id + ".detections.csv"));
  EXPECT_TRUE(detections.good()) << id << ".detections.csv";
  for (std::string line; std::getline(detections, line);) {
    const double p = std::stod(line.substr(0, line.find(',')));
    EXPECT_TRUE(p >= 0.0 && p <= 1.0) << id << ".detections.csv: " << line;
    ++checked;
  }
  const json report = read_json(out / (id + ".report.json"));
  if (!report["slide_score"].is_null()) {
    const double score = report["slide_score"].get<double>();
    EXPECT_TRUE(score >= 0.0 && score <= 1.0) << id << ": slide score " << score;
  }
  return checked;
}

// The tiny CNN trained briefly on four synthetic slides (seed 5): a model, not a good one. Made once.
class Probabilities : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    auto r = run("synth --out " + dir_->file("synth") +
                 " --slides 4 --size 2048 --seed 5 --set preview.enabled=false --set tumour.max_regions=3"
                 " --set split.train=0.5 --set split.val=0.5");
    ASSERT_EQ(r.code, 0) << r.err;
    std::ofstream(dir_->file("tile.yaml")) << "input:\n  csv: " << dir_->file("synth/dataset.csv") << "\n"
                                           << "output: " << dir_->file("shards") << "\n"
                                           << "tile:\n  size: 32\n  mpp: 1.0\n"
                                           << "tissue:\n  min_fraction: 0.3\n";
    r = run("tile " + dir_->file("tile.yaml"));
    ASSERT_EQ(r.code, 0) << r.err;
    std::ofstream(dir_->file("train.yaml"))
        << "data:\n  shards: " << dir_->file("shards") << "\n  block_size: 16\n  shuffle_buffer: 256\n"
        << "model:\n  architecture: tiny_cnn\n"
        << "train:\n  batch_size: 16\n  seed: 5\n"
        << "optimizer:\n  name: sgd\n  lr: 0.1\n  momentum: 0.9\n";
    r = run("train " + dir_->file("train.yaml") + " --out " + dir_->file("run") + " --epochs 2");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string checkpoint() { return dir_->file("run/checkpoint.h5"); }

  static testing::TempDir* dir_;
};
testing::TempDir* Probabilities::dir_ = nullptr;

// Slides of seeds the model never saw, through every output of infer and into evaluate, which refuses any
// probability outside [0, 1]; and predict's scores of the training shards into evaluate's patch AUC.
TEST_F(Probabilities, InferOnUnseenSeedsWritesWhatEvaluateAccepts) {
  for (const int seed : {61, 62}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::string synth = dir_->file("unseen" + std::to_string(seed));
    auto r = run("synth --out " + synth + " --slides 2 --size 2048 --seed " + std::to_string(seed) +
                 " --set preview.enabled=false --set split.train=0 --set split.val=0");
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string out = synth + "/infer";
    r = run("infer --checkpoint " + checkpoint() + " --slides " + synth + "/dataset.csv --out " + out +
            " --set outputs=[]");
    ASSERT_EQ(r.code, 0) << r.err;
    const json summary = read_json(out + "/infer.json");
    ASSERT_EQ(summary["slides"].size(), 2u) << summary.dump(2);
    for (const auto& slide : summary["slides"]) {
      EXPECT_GT(expect_probabilities(out, slide["id"].get<std::string>()), 0u) << slide.dump();
    }
    const auto e =
        run("evaluate --dataset " + synth + "/dataset.csv --detections " + out + " --out " + synth + "/evaluation");
    EXPECT_EQ(e.code, 0) << e.out << e.err;
    EXPECT_FALSE(contains(e.err, "outside [0, 1]")) << e.err;
    EXPECT_TRUE(fs::exists(synth + "/evaluation/evaluation.json"));
  }

  const std::string predictions = dir_->file("predictions.csv");
  auto r = run("predict --checkpoint " + checkpoint() + " --shards " + dir_->file("shards") + " --out " + predictions);
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("evaluate --dataset " + dir_->file("synth/dataset.csv") + " --predictions " + predictions + " --out " +
          dir_->file("patch-evaluation"));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

// A real scan (no ground truth): every probability infer writes for it is in [0, 1].
TEST_F(Probabilities, InferOnARealSlideWritesProbabilitiesOnly) {
  const fs::path slide = real_slides() / "cmu-1-small-region.svs";
  if (!fs::exists(slide)) GTEST_SKIP() << "no real slide at " << slide << " (../shared/data is not in this checkout)";
  const std::string out = dir_->file("real");
  const auto r = run("infer --checkpoint " + checkpoint() + " --slides " + slide.string() + " --out " + out +
                     " --set outputs=[heatmap.h5,detections.csv,report.json]");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_GT(expect_probabilities(out, "cmu-1-small-region"), 100u);
}

// Writes `value` over element `index` of the float dataset `name` (a checkpoint tensor) or the integer dataset
// (a shard's labels), in place, with plain HDF5.
void overwrite(const std::string& path, const std::string& name, std::size_t index, double value) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0) << path;
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  ASSERT_GE(dataset, 0) << name;
  const hid_t space = H5Dget_space(dataset);
  std::vector<double> values(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)));
  ASSERT_LT(index, values.size());
  EXPECT_GE(H5Dread(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  values[index] = value;
  EXPECT_GE(H5Dwrite(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Sclose(space);
  H5Dclose(dataset);
  H5Fclose(file);
}

// A checkpoint whose numbers cannot be right is refused by every verb that loads one, naming the file and the
// tensor, before any output is written.
TEST_F(Probabilities, ACheckpointWithImpossibleNumbersIsRefusedEverywhere) {
  struct Case {
    std::string tensor;
    double value;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"params/conv1.weight", std::nan(""), "tensor 'conv1.weight' in /params: element 1 is nan"},
      {"params/fc.bias", -HUGE_VAL, "tensor 'fc.bias' in /params: element 1 is -inf"},
      {"buffers/bn1.running_var", 0.0,
       "tensor 'bn1.running_var' in /buffers: element 1 is 0 (a BatchNorm running variance must be above 0)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.tensor);
    const std::string bad = dir_->file("bad-" + std::to_string(&c - cases.data()) + ".h5");
    fs::copy_file(checkpoint(), bad, fs::copy_options::overwrite_existing);
    overwrite(bad, c.tensor, 1, c.value);
    if (HasFatalFailure()) return;
    const std::string expected = "input error: file '" + bad + "': " + c.message;
    const std::string out = dir_->file("refused");
    const std::vector<std::string> commands = {
        "predict --checkpoint " + bad + " --shards " + dir_->file("shards") + " --out " + out + "/preds.csv",
        "infer --checkpoint " + bad + " --slides " + dir_->file("synth/dataset.csv") + " --out " + out,
        "train " + dir_->file("train.yaml") + " --out " + out + "/train --resume " + bad + " --epochs 3"};
    for (const auto& command : commands) {
      const auto r = run(command);
      EXPECT_EQ(r.code, 3) << command << "\n" << r.err;
      EXPECT_TRUE(contains(r.err, expected)) << command << "\n" << r.err;
    }
    EXPECT_FALSE(fs::exists(out + "/preds.csv"));
  }
}

// Shards whose labels are not 0/1, or whose manifest counts disagree with them, are bad input naming the file for
// predict and train alike (not an AUC of nan, not an internal error).
TEST_F(Probabilities, ShardsWithImpossibleLabelsAreRefused) {
  const std::string shards = dir_->file("mislabelled");
  fs::copy(dir_->file("shards"), shards, fs::copy_options::recursive);
  const std::string shard = shards + "/shard-00000.h5";
  ASSERT_TRUE(fs::exists(shard));
  overwrite(shard, "labels", 4, 2.0);
  if (HasFatalFailure()) return;
  const std::string expected = "input error: file '" + shard + "': labels[4] = 2 is not 0 (normal) or 1 (tumour)";
  auto r = run("predict --checkpoint " + checkpoint() + " --shards " + shards + " --out " + shards + "/preds.csv");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, expected)) << r.err;
  r = run("train " + dir_->file("train.yaml") + " --shards " + shards + " --out " + shards + "/run --epochs 1");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, expected)) << r.err;

  // Labels flipped between the classes: each label is valid, the manifest's counts are not what the shard holds.
  fs::remove_all(shards);
  fs::copy(dir_->file("shards"), shards, fs::copy_options::recursive);
  const json manifest = read_json(shards + "/manifest.json");
  const auto& first = manifest["shards"][0];
  ASSERT_GT(first["normal"].get<int>(), 0) << first.dump();
  const std::string flipped = shards + "/" + first["file"].get<std::string>();
  r = run("predict --checkpoint " + checkpoint() + " --shards " + shards + " --out " + shards + "/preds.csv");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream preds(shards + "/preds.csv");
  std::string header, row;
  std::getline(preds, header);
  std::getline(preds, row);  // the first tile of the first shard: its label is the fourth column
  std::vector<std::string> fields;
  std::stringstream split(row);
  for (std::string field; std::getline(split, field, ',');) fields.push_back(field);
  ASSERT_GE(fields.size(), 4u) << row;
  overwrite(flipped, "labels", 0, fields[3] == "1" ? 0.0 : 1.0);
  if (HasFatalFailure()) return;
  r = run("predict --checkpoint " + checkpoint() + " --shards " + shards + " --out " + shards + "/preds2.csv");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "file '" + flipped + "': its labels hold ")) << r.err;
  EXPECT_TRUE(contains(r.err, "but '" + shards + "/manifest.json' lists ")) << r.err;
}

// ---------------------------------------------------------------------------------------------------------
// Numeric flags

struct BadFlag {
  std::string verb;  // with the arguments the verb needs to get as far as reading its job
  std::string flag;  // as given
  std::string value;
  std::string expected;  // the message after "<flag>: "
  std::string named;     // the name the error gives the flag, when not `flag` (CLI11 gives the long name)
};

std::string case_name(const ::testing::TestParamInfo<BadFlag>& info) {
  std::string name =
      info.param.verb.substr(0, info.param.verb.find(' ')) + "_" + info.param.flag + "_" + info.param.value;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name + "_" + std::to_string(info.index);
}

BadFlag bad(std::string verb, std::string flag, std::string value, std::string expected, std::string named = "") {
  return {std::move(verb), std::move(flag), std::move(value), std::move(expected), std::move(named)};
}

class NumericFlags : public ::testing::TestWithParam<BadFlag> {};

// Every bad value is a configuration error (exit 2) that names the flag, with the same words as the YAML key's
// error, before any work: --print-config is never reached.
TEST_P(NumericFlags, BadValuesAreRefusedNamingTheFlag) {
  const BadFlag& c = GetParam();
  for (const std::string& form : {c.flag + " " + c.value, c.flag + "=" + c.value}) {
    if (c.flag.size() == 2 && form == c.flag + "=" + c.value) continue;  // "-n=5" is not how short options go
    SCOPED_TRACE(form);
    const auto r = run(c.verb + " " + form + " --print-config");
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    const std::string named = c.named.empty() ? c.flag : c.named;
    EXPECT_TRUE(contains(r.err, "config error: " + named + ": " + c.expected)) << r.err;
    EXPECT_FALSE(contains(r.err, "file '--set'")) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

const char* kNotInteger = "expected an integer, got ";
const char* kNotNumber = "expected a number, got ";

INSTANTIATE_TEST_SUITE_P(EveryVerb, NumericFlags,
                         ::testing::Values(bad("infer", "--batch", "0", "must be between 1 and 65536, got 0"),
                                           bad("infer", "--batch", "-5", "must be between 1 and 65536, got -5"),
                                           bad("infer", "--batch", "many", std::string(kNotInteger) + "'many'"),
                                           bad("infer", "--batch", "2.5", std::string(kNotInteger) + "'2.5'"),
                                           bad("infer", "--stride", "-1", "must be between 0"),
                                           bad("infer", "--stride", "wide", std::string(kNotInteger) + "'wide'"),
                                           bad("infer", "--threads", "-1", "must be between 0 and 1024, got -1"),
                                           bad("infer", "--threads", "all", std::string(kNotInteger) + "'all'"),
                                           bad("infer", "--threshold", "-5", "must be between 0 and 1, got -5"),
                                           bad("infer", "--threshold", "1.5", "must be between 0 and 1, got 1.5"),
                                           bad("infer", "--threshold", "half", std::string(kNotNumber) + "'half'"),
                                           bad("infer", "--threshold", "nan", std::string(kNotNumber) + "'nan'"),
                                           bad("predict", "--batch", "0", "must be between 1 and 65536, got 0"),
                                           bad("predict", "--batch", "-5", "must be between 1 and 65536, got -5"),
                                           bad("predict", "--threads", "-1", "must be between 0 and 1024, got -1"),
                                           bad("predict", "--threads", "x", std::string(kNotInteger) + "'x'"),
                                           bad("train", "--epochs", "0", "must be between 1 and 100000, got 0"),
                                           bad("train", "--epochs", "-5", "must be between 1 and 100000, got -5"),
                                           bad("train", "--epochs", "ten", std::string(kNotInteger) + "'ten'"),
                                           bad("synth", "--slides", "0", "must be between 1 and 100000, got 0"),
                                           bad("synth", "-n", "-5", "must be between 1 and 100000, got -5", "--slides"),
                                           bad("synth", "--size", "0", "must be between 512"),
                                           bad("synth", "--size", "-5", "must be between 512"),
                                           bad("synth", "--size", "big", std::string(kNotInteger) + "'big'"),
                                           bad("synth", "--seed", "-5", "must be between 0"),
                                           bad("synth", "--seed", "lucky", std::string(kNotInteger) + "'lucky'"),
                                           bad("evaluate", "--assume-mpp", "-5", "must be between 0 and 100, got -5"),
                                           bad("evaluate", "--assume-mpp", "fine", std::string(kNotNumber) + "'fine'")),
                         case_name);

// Good values still reach the config, from the flag and not from a default.
TEST(NumericFlagValues, ReachTheirKeys) {
  auto r = run("infer --batch 7 --stride 0 --threads 2 --threshold 0.25 --print-config");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "batch_size: 7\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "threads: 2\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "threshold: 0.25\n")) << r.out;
  r = run("synth --size 1024 -n 3 --seed 0 --print-config");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "width: 1024\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "height: 1024\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "count: 3\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "seed: 0\n")) << r.out;
  // A flag wins over --set for the same key.
  r = run("predict --set predict.batch_size=9 --batch 4 --print-config");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "batch_size: 4\n")) << r.out;
}

// Verbs without a job (info) and bench's own options are checked by the command line parser: exit 2, the flag named.
TEST(NumericFlagValues, VerbsWithoutAJobNameTheFlagToo) {
  for (const std::string value : {"0", "-5", "wide", "1e999"}) {
    const auto r = run("info --assume-mpp " + value + " nothing.svs");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "--assume-mpp: must be a number above 0 and at most 100, got '" + value + "'"))
        << r.err;
  }
  const auto r = run("bench peak --size 0");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--size: ")) << r.err;
}

// An error from `--set` names the whole override, not a file called '--set'.
TEST(NumericFlagValues, SetErrorsNameTheOverride) {
  const auto r = run("infer --set infer.batch_size=0 --print-config");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--set infer.batch_size=0: must be between 1 and 65536, got 0")) << r.err;
  EXPECT_FALSE(contains(r.err, "file '--set")) << r.err;
}

}  // namespace
}  // namespace tessera
