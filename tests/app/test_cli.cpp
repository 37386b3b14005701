// The `tessera` program as a user runs it: output, files and exit codes.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

using testing::contains;
using testing::run;
using testing::run_mpi;

TEST(Cli, VersionNamesTesseraAndItsLibraries) {
  const auto r = run("--version");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "tessera 0.1.0")) << r.out;
  EXPECT_TRUE(contains(r.out, "OpenSlide 3.4")) << r.out;
  EXPECT_TRUE(contains(r.out, "oneDNN 2.")) << r.out;
}

TEST(Cli, HelpListsOnlyTheVerbsThatExist) {
  const auto r = run("--help");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* verb : {"synth", "info", "bench"}) EXPECT_TRUE(contains(r.out, verb)) << verb << "\n" << r.out;
  EXPECT_TRUE(contains(r.out, "Exit codes")) << r.out;
}

TEST(Cli, EveryVerbHasHelp) {
  for (const char* verb : {"synth", "info", "bench", "bench peak"}) {
    const auto r = run(std::string(verb) + " --help");
    EXPECT_EQ(r.code, 0) << verb << ": " << r.err;
    EXPECT_TRUE(contains(r.out, "Usage")) << verb << ": " << r.out;
  }
}

TEST(Cli, UnknownVerbSuggestsTheClosestAndExitsWithUsageCode) {
  const auto r = run("inf slide.svs");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "unknown verb 'inf'; did you mean 'info'?")) << r.err;
  EXPECT_FALSE(contains(r.err, "terminate")) << r.err;
}

TEST(Cli, AMalformedFaultInjectionIsRefusedBeforeAnyWork) {
  for (const std::string spec : {"", "after=2", "train.step after=0", "train.step times=0", "train.step after=two",
                                 "train.step do=explode", "train.step when=now"}) {
    if (spec.empty()) continue;
    const auto r = testing::run_script("TESSERA_FAULT='" + spec + "' $TESSERA --version");
    EXPECT_EQ(r.code, 2) << spec;
    EXPECT_TRUE(contains(r.err, "TESSERA_FAULT='" + spec + "'")) << r.err;
  }
  for (const std::string action : {"kill", "stop", "enospc", "eio"}) {
    const auto ok =
        testing::run_script("TESSERA_FAULT='train.step after=2 rank=1 do=" + action + "' $TESSERA --version");
    EXPECT_EQ(ok.code, 0) << action << ": " << ok.err;
  }
}

TEST(Cli, MissingArgumentIsAUsageError) {
  const auto r = run("info");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "slides is required")) << r.err;
}

class CliInfo : public ::testing::Test {
 protected:
  void SetUp() override {
    io::TiffWriterOptions aperio;
    aperio.flavor = io::TiffFlavor::aperio;
    aperio.mpp = 0.25;
    aperio.objective_power = 40;
    aperio.level_factor = 4;
    testing::write_pattern_slide(aperio_path_, 3000, 2100, aperio);
    io::TiffWriterOptions generic;
    generic.mpp = 0.5;
    generic.level_factor = 2;
    testing::write_pattern_slide(generic_path_, 1500, 1100, generic);
  }
  testing::TempDir dir_;
  std::string aperio_path_ = dir_.file("aperio.svs");
  std::string generic_path_ = dir_.file("generic.tif");
};

TEST_F(CliInfo, DescribesBothFlavours) {
  const auto r = run(aperio_path_ + " " + generic_path_);  // verb missing on purpose: usage error
  EXPECT_EQ(r.code, 2);

  const auto a = run("info " + aperio_path_);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_TRUE(contains(a.out, "vendor       aperio")) << a.out;
  EXPECT_TRUE(contains(a.out, "3000 x 2100 px")) << a.out;
  EXPECT_TRUE(contains(a.out, "0.2500 x 0.2500 um/px, from openslide.mpp-x")) << a.out;
  EXPECT_TRUE(contains(a.out, "objective    40x")) << a.out;
  EXPECT_TRUE(contains(a.out, "thumbnail")) << a.out;

  // Started on its own, every verb but `tile` runs as an MPI singleton (core/comm.h).
  const auto g = testing::run_alone("info --log-level debug " + generic_path_);
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_FALSE(contains(g.err, "without MPI")) << g.err;
  EXPECT_TRUE(contains(g.out, "vendor       generic-tiff")) << g.out;
  EXPECT_TRUE(contains(g.out, "0.5000 x 0.5000 um/px, from the TIFF resolution tags")) << g.out;
  EXPECT_TRUE(contains(g.out, "objective    not recorded")) << g.out;
}

TEST_F(CliInfo, JsonListsLevelsWithDownsamples) {
  const auto r = run("info --json " + aperio_path_);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc.size(), 1u);
  const auto& levels = doc[0]["levels"];
  // 3000x2100, then /4 = 750x525 (a side still above min_level_size 512), then 188x132.
  ASSERT_EQ(levels.size(), 3u) << r.out;
  EXPECT_EQ(levels[0]["width"], 3000);
  EXPECT_EQ(levels[1]["width"], 750);
  EXPECT_EQ(levels[2]["width"], 188);
  EXPECT_EQ(levels[2]["height"], 132);
  EXPECT_NEAR(levels[1]["downsample"].get<double>(), 4.0, 0.01);
  EXPECT_NEAR(levels[2]["downsample"].get<double>(), 3000.0 / 188.0, 0.05);
  EXPECT_EQ(doc[0]["mpp_source"], "openslide_property");
}

TEST_F(CliInfo, BadSlidesFailAloneAndAreListedAtTheEnd) {
  const std::string missing = dir_.file("nope.svs");
  const std::string text = dir_.file("notes.svs");
  std::ofstream(text) << "not a slide";
  const auto r = run("info " + missing + " " + aperio_path_ + " " + text);
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(contains(r.out, "vendor       aperio")) << r.out;  // the good slide is still described
  EXPECT_TRUE(contains(r.err, "2 of 3 slides could not be read")) << r.err;
  EXPECT_TRUE(contains(r.err, "nope.svs': file not found")) << r.err;
  EXPECT_TRUE(contains(r.err, "notes.svs")) << r.err;
  EXPECT_FALSE(contains(r.err, "terminate")) << r.err;
}

TEST(CliConfig, PrintConfigShowsEveryKeyWithItsDoc) {
  const auto r = run("synth --print-config --set slides.count=3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "slides:")) << r.out;
  EXPECT_TRUE(contains(r.out, "# Number of slides")) << r.out;
  EXPECT_TRUE(contains(r.out, "count: 3")) << r.out;
  EXPECT_TRUE(contains(r.out, "jpeg_quality: 85")) << r.out;
}

TEST(CliConfig, UnknownKeyNamesFileLineAndSuggestion) {
  testing::TempDir dir;
  const std::string job = dir.file("job.yaml");
  std::ofstream(job) << "output: out\nslides:\n  cont: 4\n";
  const auto r = run("synth " + job);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "job.yaml', line 3, key 'slides.cont'")) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean 'slides.count'?")) << r.err;
}

TEST(CliConfig, OutOfRangeOverrideIsRejected) {
  const auto r = run("synth --set slides.count=0 --print-config");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--set")) << r.err;
  EXPECT_TRUE(contains(r.err, "slides.count")) << r.err;
}

TEST(CliConfig, WrongTypeIsRejected) {
  testing::TempDir dir;
  const std::string job = dir.file("job.yaml");
  std::ofstream(job) << "seed: many\n";
  const auto r = run("synth " + job);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "line 1, key 'seed'")) << r.err;
  EXPECT_TRUE(contains(r.err, "expected an integer")) << r.err;
}

// One vocabulary (docs/ARCHITECTURE.md, "Jobs are YAML"): the slides are input.* in every verb; the old names of
// infer's and evaluate's keys still read, for one release, with a warning naming the new key.
TEST(CliConfig, RenamedKeysStillReadWithAWarningNamingTheNewKey) {
  testing::TempDir dir;
  const std::string infer_job = dir.file("infer.yaml");
  std::ofstream(infer_job) << "slides: [data.csv]\nsplits: [test]\n";
  auto r = run("infer " + infer_job + " --print-config");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "input:\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "  slides: [data.csv]\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "  splits: [test]\n")) << r.out;
  EXPECT_TRUE(contains(r.err, "'slides' is the old name of 'input.slides'")) << r.err;
  EXPECT_TRUE(contains(r.err, "'splits' is the old name of 'input.splits'")) << r.err;

  const std::string evaluate_job = dir.file("evaluate.yaml");
  std::ofstream(evaluate_job) << "dataset: d.csv\nslides:\n  assume_mpp: 0.25\n";
  r = run("evaluate " + evaluate_job + " --print-config");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "csv: d.csv\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "assume_mpp: 0.25\n")) << r.out;
  EXPECT_TRUE(contains(r.err, "evaluate.yaml:1: 'dataset' is the old name of 'input.csv'")) << r.err;
  EXPECT_TRUE(contains(r.err, "evaluate.yaml:3: 'slides.assume_mpp' is the old name of 'input.assume_mpp'")) << r.err;

  // Both names at once is one error naming both.
  std::ofstream(evaluate_job) << "dataset: d.csv\ninput:\n  csv: e.csv\n";
  r = run("evaluate " + evaluate_job + " --print-config");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "'dataset' and 'input.csv' are the same key")) << r.err;
}

// Flags set their keys as given, never through YAML text: a path with ": ", "#" or "," stays one path, lists split
// at commas, and switches set booleans.
TEST(CliConfig, FlagsSetTheirKeysAsGiven) {
  auto r =
      run("infer --out 'odd: name #1' --checkpoint 'c, d.h5' --slides 'a.svs, b*.svs' --splits test,val "
          "--tta flips --print-config");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "output: \"odd: name #1\"\n") || contains(r.out, "output: 'odd: name #1'\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "checkpoint: c, d.h5\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "  slides: [a.svs, b*.svs]\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "  splits: [test, val]\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "tta: flips\n")) << r.out;
  r = run("evaluate --include-itc --dataset d.csv --print-config");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "include_itc: true\n")) << r.out;
  r = run("tile --on-corrupt-tile skip --csv d.csv --print-config");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "on_corrupt_tile: skip\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "csv: d.csv\n")) << r.out;
  // Giving the slides one way on the command line takes the place of the job's other way.
  testing::TempDir dir;
  const std::string job = dir.file("infer.yaml");
  std::ofstream(job) << "input:\n  csv: d.csv\n";
  r = run("infer " + job + " --slides a.svs --print-config");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "  slides: [a.svs]\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "  csv: \"\"\n")) << r.out;
  std::ofstream(job) << "input:\n  slides: [a.svs]\n";
  r = run("tile " + job + " --csv d.csv --print-config");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "  slides: []\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "  csv: d.csv\n")) << r.out;
  r = run("infer --slides a.svs --csv d.csv --print-config");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--slides and --csv cannot both be given")) << r.err;
  // A bad value is the key's error, naming the flag.
  r = run("infer --tta sideways --print-config");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--tta: expected one of: none, flips, d8, got 'sideways'")) << r.err;
  r = run("tile --on-corrupt-tile ignore --print-config");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--on-corrupt-tile: expected one of: fail, skip")) << r.err;
}

TEST(CliBench, PeakPrintsGflopsForOneThreadAndAll) {
  const auto r = run("bench peak --size 256 --seconds 0.05");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "GFLOP/s")) << r.out;
  // Two rows (1 thread and all cores) unless the machine has one core.
  EXPECT_TRUE(contains(r.out, "\n       1  ")) << r.out;
}

// Every job shipped in configs/ reads without error in the verb its name starts with (an unknown or mistyped key
// would be refused), so the README's commands start.
TEST(Configs, EveryShippedJobReads) {
  const std::filesystem::path configs = testing::test_data_dir().parent_path().parent_path() / "configs";
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(configs)) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string name = entry.path().filename().string();
    const std::string verb = name.substr(0, name.find('-'));
    ASSERT_TRUE(verb == "synth" || verb == "tile" || verb == "import" || verb == "train" || verb == "infer" ||
                verb == "evaluate")
        << name << ": which verb is it for?";
    const auto r = testing::run(verb + " " + entry.path().string() + " --print-config");
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
    EXPECT_FALSE(contains(r.err, "old name")) << name << " uses a renamed key: " << r.err;
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// A command line that one rank cannot parse (its job file is missing on that rank's host; here an MPMD launch gives
// rank 1 another file) stops every rank, with that rank's message: none waits in a collective for it.
TEST(CliMpi, ARankThatCannotParseStopsTheJobNamingItself) {
  testing::TempDir dir;
  const std::string job = dir.file("job.yaml");
  std::ofstream(job) << "input:\n  csv: none.csv\n";
  const std::string missing = dir.file("missing/job.yaml");
  const auto r = testing::run_script("$MPIEXEC -n 1 $TESSERA evaluate " + job + " : -n 1 $TESSERA evaluate " + missing);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "tessera: rank 1: ")) << r.err;
  EXPECT_TRUE(contains(r.err, missing)) << r.err;
}

}  // namespace
}  // namespace tessera
