// Outputs off the happy path, end to end: a second job on a locked output folder is refused (every verb that writes
// a folder), an output that cannot be written is a usage error before any work (a file in the way, a read-only mount,
// a folder of another user), a full disk ends the job with the error and never a signal (injected at the shard,
// heatmap and checkpoint writes, and a real full tmpfs), and a killed `tile` or `infer` keeps what it finished.
// Kills and full disks happen at fault-injection points (core/fault.h), never after a timer.
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/output_dir.h"
#include "io/heatmap.h"
#include "io/shard.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::run;
using testing::run_mpi;
using testing::run_script;

// Two small synthetic slides, tiled at 32 px into shards of at most 50 tiles, and a tiny model trained one epoch on
// them; made once for the suite.
class Outputs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    auto r = run("synth --out " + dir_->file("synth") +
                 " --slides 2 --size 2048 --seed 3 --set preview.enabled=false --set tumour.max_regions=2");
    ASSERT_EQ(r.code, 0) << r.err;
    r = run("tile " + tile_job() + " --out " + dir_->file("shards"));
    ASSERT_EQ(r.code, 0) << r.err;
    std::ofstream(dir_->file("train.yaml"))
        << "data:\n  shards: " << dir_->file("shards") << "\n  block_size: 16\n  shuffle_buffer: 64\n"
        << "model:\n  architecture: tiny_cnn\n"
        << "train:\n  batch_size: 16\n  seed: 3\n";
    r = run("train " + dir_->file("train.yaml") + " --out " + dir_->file("run") + " --epochs 1");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::string tile_job() {
    const std::string path = dir_->file("tile.yaml");
    if (!fs::exists(path)) {
      std::ofstream(path) << "input:\n  csv: " << dir_->file("synth/dataset.csv") << "\n"
                          << "tile:\n  size: 32\n  mpp: 1.0\n"
                          << "tissue:\n  min_fraction: 0.3\n"
                          << "shards:\n  tiles_per_shard: 50\n  write_batch: 16\n";
    }
    return path;
  }
  static std::string checkpoint() { return dir_->file("run/checkpoint.h5"); }

  // The command line of `verb` writing its outputs to `out` (the whole job; it fails at the output or succeeds).
  static std::string verb_line(const std::string& verb, const std::string& out) {
    if (verb == "synth") return "synth --out " + out + " --slides 1 --size 512 --set preview.enabled=false";
    if (verb == "tile") return "tile " + tile_job() + " --out " + out;
    if (verb == "train") return "train " + dir_->file("train.yaml") + " --out " + out + " --epochs 1";
    if (verb == "infer") {
      return "infer -c " + checkpoint() + " --slides " + dir_->file("synth/dataset.csv") + " --out " + out +
             " --set outputs=[heatmap.h5]";
    }
    if (verb == "evaluate") {
      return "evaluate --dataset " + dir_->file("synth/dataset.csv") + " --predictions " +
             dir_->file("predictions.csv") + " --out " + out;
    }
    if (verb == "predict") return "predict -c " + checkpoint() + " --shards " + dir_->file("shards") + " --out " + out;
    ADD_FAILURE() << "no command line for " << verb;
    return verb;
  }

  static testing::TempDir* dir_;
};
testing::TempDir* Outputs::dir_ = nullptr;

const std::vector<std::string> kFolderVerbs = {"synth", "tile", "train", "infer", "evaluate"};

std::set<std::string> names_in(const fs::path& folder) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(folder)) names.insert(e.path().filename().string());
  return names;
}

bool is_final_shard_name(const std::string& name) {
  return name.rfind("shard-", 0) == 0 && name.size() == std::strlen("shard-00000.h5") && name.ends_with(".h5");
}

// A run through `sh`: the exit status as the shell sees it ("rc=N" on stdout; a signal is 128 + N).
int shell_status(const testing::Run& r) {
  const auto at = r.out.rfind("rc=");
  return at == std::string::npos ? -1 : std::stoi(r.out.substr(at + 3));
}

ino_t inode_of(const fs::path& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 ? info.st_ino : 0;
}

// A mount made for a test, unmounted when it ends. `error` says why it could not be made (then skip).
class ScopedMount {
 public:
  ScopedMount(const std::string& source, const std::string& target, const char* type, unsigned long flags,
              const char* data) {
    if (::mount(source.c_str(), target.c_str(), type, flags, data) != 0) {
      error_ = std::strerror(errno);
      return;
    }
    target_ = target;
    // A read-only bind mount takes a second step: bind, then remount the binding read-only.
    if ((flags & MS_BIND) != 0 &&
        ::mount("none", target.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
      error_ = std::strerror(errno);
    }
  }
  ~ScopedMount() {
    if (!target_.empty()) ::umount2(target_.c_str(), MNT_DETACH);
  }
  const std::string& error() const { return error_; }

 private:
  std::string target_;
  std::string error_;
};

// ------------------------------------------------------------------------------------------------ the lock

TEST_F(Outputs, ASecondJobOnALockedFolderIsRefusedNamingTheHolderInEveryVerb) {
  for (const auto& verb : kFolderVerbs) {
    SCOPED_TRACE(verb);
    const std::string out = dir_->file("locked-" + verb);
    // This test process is the "first job": it holds the lock through the same API the verbs use.
    core::OutputLock first = core::OutputLock::acquire(out, "test");
    const auto r = run(verb_line(verb, out));
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "output folder '" + out + "' is in use by another Tessera job (tessera test, pid " +
                                    std::to_string(::getpid()) + " on host "))
        << r.err;
    EXPECT_EQ(names_in(out), std::set<std::string>{core::output_lock_name}) << "nothing written by the refused job";
  }
  // Once the first job lets go, the folder is free (the refusal was the lock's).
  const std::string out = dir_->file("locked-tile");
  const auto r = run(verb_line("tile", out));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out + "/manifest.json"));
}

TEST_F(Outputs, ALockHeldByAnotherProcessRefusesATwoRankJob) {
  if (std::system("command -v flock >/dev/null 2>&1") != 0) GTEST_SKIP() << "flock (util-linux) is not installed";
  const std::string out = dir_->file("flocked");
  fs::create_directories(out);
  // util-linux's flock holds the same flock(2) lock while the job runs under it.
  const auto r =
      run_script("flock " + out + "/.tessera.lock $MPIEXEC -n 2 $TESSERA " + verb_line("tile", out) + "\necho rc=$?\n");
  EXPECT_EQ(shell_status(r), 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "output folder '" + out + "' is in use by another Tessera job")) << r.err;
  EXPECT_FALSE(fs::exists(out + "/.tessera-tile-state.json")) << "refused before any work";
}

// ------------------------------------------------------------------------------------------------ unwritable

TEST_F(Outputs, AnOutputPathThatIsAFileIsAUsageErrorInEveryVerb) {
  const std::string file = dir_->file("a-file");
  std::ofstream(file) << "not a folder";
  for (const auto& verb : kFolderVerbs) {
    SCOPED_TRACE(verb);
    const auto r = run(verb_line(verb, file));
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "output folder '" + file + "' is a file, not a folder")) << r.err;
  }
  // predict writes a file: a folder in its place, or a file where its folder should be.
  auto r = run(verb_line("predict", dir_->path().string()));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "output file '" + dir_->path().string() + "' is a folder, not a file")) << r.err;
  r = run(verb_line("predict", file + "/predictions.csv"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "cannot write the output file '" + file + "/predictions.csv'")) << r.err;
}

TEST_F(Outputs, AReadOnlyMountIsAUsageErrorFoundBeforeAnyWork) {
  const std::string source = dir_->file("ro-source");
  const std::string target = dir_->file("ro");
  fs::create_directories(source);
  fs::create_directories(target);
  const ScopedMount mount(source, target, nullptr, MS_BIND, nullptr);
  if (!mount.error().empty()) GTEST_SKIP() << "cannot make a read-only bind mount here: " << mount.error();
  for (const auto& verb : kFolderVerbs) {
    SCOPED_TRACE(verb);
    auto r = run(verb_line(verb, target));
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "output folder '" + target + "' is not writable: Read-only file system")) << r.err;
    r = run(verb_line(verb, target + "/new"));
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "cannot create the output folder '" + target + "/new': Read-only file system"))
        << r.err;
  }
  // predict fails before it loads the model or scores a tile: with a checkpoint that does not exist, the output
  // is what it reports (exit 2), not the missing checkpoint (exit 3).
  const auto r = run("predict -c " + dir_->file("missing.h5") + " --shards " + dir_->file("shards") + " --out " +
                     target + "/predictions.csv");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "cannot write the output file '" + target + "/predictions.csv': output folder '" +
                                  target + "' is not writable: Read-only file system"))
      << r.err;
  EXPECT_TRUE(names_in(source).empty()) << "nothing written";
}

TEST_F(Outputs, AFolderTheUserMayNotWriteIsAUsageError) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the job as another user (root ignores file modes)";
  if (std::system("command -v setpriv >/dev/null 2>&1") != 0) GTEST_SKIP() << "setpriv (util-linux) is not installed";
  if (run_script("setpriv --reuid 65534 --regid 65534 --clear-groups $TESSERA --version >/dev/null 2>&1").code != 0) {
    GTEST_SKIP() << "user 65534 cannot run the tessera binary here (a folder on its path is closed to others)";
  }
  // Root's folder, readable by everyone, writable by root only; the job runs as nobody (65534).
  const std::string out = dir_->file("root-only");
  fs::create_directories(out);
  fs::permissions(out, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                           fs::perms::others_exec);
  fs::permissions(dir_->path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                    fs::perms::others_read | fs::perms::others_exec);
  for (const auto& verb : kFolderVerbs) {
    SCOPED_TRACE(verb);
    const auto r = run_script("setpriv --reuid 65534 --regid 65534 --clear-groups $TESSERA " + verb_line(verb, out) +
                              "\necho rc=$?\n");
    EXPECT_EQ(shell_status(r), 2) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "output folder '" + out + "' is not writable: Permission denied")) << r.err;
  }
  const auto r = run_script("setpriv --reuid 65534 --regid 65534 --clear-groups $TESSERA " +
                            verb_line("predict", out + "/p.csv") + "\necho rc=$?\n");
  EXPECT_EQ(shell_status(r), 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "output folder '" + out + "' is not writable: Permission denied")) << r.err;
  EXPECT_TRUE(names_in(out).empty()) << "nothing written";
}

// ------------------------------------------------------------------------------------------------ full disk

// TESSERA_FAULT makes the fourth block of tiles of one rank fail with ENOSPC, as a full disk does.
void expect_disk_full_during_tile(int ranks, const std::string& out, const std::string& tile_line) {
  SCOPED_TRACE(std::to_string(ranks) + " rank(s)");
  const std::string fault = ranks == 1 ? "shard.write after=4 do=enospc" : "shard.write after=4 rank=1 do=enospc";
  const std::string launcher = ranks == 1 ? "" : "$MPIEXEC -n 2 ";
  const auto r = run_script("TESSERA_FAULT='" + fault + "' " + launcher + "$TESSERA " + tile_line + "\necho rc=$?\n");
  const int status = shell_status(r);
  EXPECT_TRUE(status == 1 || status == 3) << "exit status " << status << " (128 + N is signal N)\n" << r.err;
  EXPECT_TRUE(contains(r.err, "No space left on device")) << r.err;
  EXPECT_TRUE(contains(r.err, "file '" + out + "/shard-0000")) << "names the shard\n" << r.err;
  EXPECT_FALSE(contains(r.err, "Segmentation fault")) << r.err;
  EXPECT_FALSE(fs::exists(out + "/manifest.json")) << "no manifest claiming tiles that are not there";
  for (const auto& name : names_in(out)) {
    EXPECT_FALSE(is_final_shard_name(name)) << name << ": a shard under its final name";
    EXPECT_FALSE(contains(name, ".tmp-") && ranks == 1) << name << ": a temporary left by a process that ended";
  }
}

TEST_F(Outputs, DiskFullDuringTileOnOneRankEndsWithTheErrorNeverASignal) {
  const std::string out = dir_->file("enospc-1");
  expect_disk_full_during_tile(1, out, verb_line("tile", out));
}

TEST_F(Outputs, DiskFullDuringTileOnOneOfTwoRanksEndsWithTheErrorNeverASignal) {
  const std::string out = dir_->file("enospc-2");
  expect_disk_full_during_tile(2, out, verb_line("tile", out));
}

TEST_F(Outputs, ARealFullDiskDuringTileEndsWithTheErrorNeverASignal) {
  const std::string target = dir_->file("tmpfs");
  fs::create_directories(target);
  // 200 kB: the shards of this job need about 550 kB.
  const ScopedMount mount("tmpfs", target, "tmpfs", 0, "size=200k");
  if (!mount.error().empty()) GTEST_SKIP() << "cannot mount a small tmpfs here: " << mount.error();
  const std::string out = target + "/shards";
  const auto r = run_script("$TESSERA " + verb_line("tile", out) + "\necho rc=$?\n");
  EXPECT_EQ(shell_status(r), 1) << "128 + N is signal N\n" << r.err;
  EXPECT_TRUE(contains(r.err, "No space left on device")) << r.err;
  EXPECT_TRUE(contains(r.err, "file '" + out + "/shard-0000")) << r.err;
  EXPECT_FALSE(fs::exists(out + "/manifest.json"));
  for (const auto& name : names_in(out)) {
    EXPECT_FALSE(is_final_shard_name(name)) << name;
    EXPECT_FALSE(contains(name, ".tmp-")) << name;
  }
}

TEST_F(Outputs, AFullDiskWritingAHeatmapOrACheckpointEndsWithTheError) {
  const std::string heatmaps = dir_->file("enospc-infer");
  auto r =
      run_script("TESSERA_FAULT='heatmap.write do=enospc' $TESSERA " + verb_line("infer", heatmaps) + "\necho rc=$?\n");
  EXPECT_EQ(shell_status(r), 1) << r.err;
  EXPECT_TRUE(contains(r.err, "cannot write dataset '/prob': No space left on device")) << r.err;
  for (const auto& name : names_in(heatmaps)) EXPECT_FALSE(contains(name, ".heatmap.h5")) << name;

  const std::string run_folder = dir_->file("enospc-train");
  r = run_script("TESSERA_FAULT='checkpoint.write do=enospc' $TESSERA " + verb_line("train", run_folder) +
                 "\necho rc=$?\n");
  EXPECT_EQ(shell_status(r), 1) << r.err;
  EXPECT_TRUE(contains(r.err, "No space left on device")) << r.err;
  EXPECT_FALSE(fs::exists(run_folder + "/checkpoint.h5"));
}

// ------------------------------------------------------------------------------------------------ resume

TEST_F(Outputs, TileKilledAfterAShardKeepsItAndRedoesOnlyTheRest) {
  const std::string whole = dir_->file("tile-whole");
  ASSERT_EQ(run(verb_line("tile", whole)).code, 0);

  const std::string out = dir_->file("tile-killed");
  auto r = run_script("TESSERA_FAULT='tile.shard-finished after=1 do=kill' $TESSERA " + verb_line("tile", out) +
                      "\necho rc=$?\n");
  ASSERT_EQ(shell_status(r), 128 + 9) << "killed by the fault hook\n" << r.err;
  ASSERT_TRUE(fs::exists(out + "/shard-00000.h5.unchecked")) << "the first shard was finished";
  EXPECT_FALSE(fs::exists(out + "/shard-00001.h5.unchecked"));
  EXPECT_FALSE(fs::exists(out + "/manifest.json"));
  const ino_t finished = inode_of(out + "/shard-00000.h5.unchecked");

  r = run(verb_line("tile", out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "shard-00000.h5: kept from an earlier run of this job")) << r.err;
  EXPECT_FALSE(contains(r.err, "shard-00001.h5: kept")) << r.err;
  EXPECT_EQ(inode_of(out + "/shard-00000.h5"), finished) << "the finished shard was put in place, not rewritten";
  EXPECT_TRUE(testing::shard_tiles(out) == testing::shard_tiles(whole)) << "the same tiles as an uninterrupted run";
  for (const auto& name : names_in(out)) EXPECT_FALSE(name.ends_with(".unchecked")) << name;
}

TEST_F(Outputs, TileKilledOnOneOfTwoRanksKeepsEveryShardFinishedWithItsRecord) {
  const std::string out = dir_->file("tile-killed-2");
  auto r = run_script("TESSERA_FAULT='tile.shard-finished after=1 rank=1 do=kill' $MPIEXEC -n 2 $TESSERA " +
                      verb_line("tile", out) + "\necho rc=$?\n");
  ASSERT_NE(shell_status(r), 0) << r.err;
  ASSERT_FALSE(fs::exists(out + "/manifest.json"));
  // Rank 1 was killed right after its first shard and that shard's record; rank 0, ended by mpirun at some point,
  // may have finished shards too. Every shard finished with its record is kept by the rerun, as it is.
  std::map<std::string, ino_t> finished;
  for (const auto& name : names_in(out)) {
    if (!name.ends_with(".h5.unchecked")) continue;
    const std::string shard = name.substr(0, name.size() - std::strlen(".unchecked"));
    if (fs::exists(out + "/.tessera-tile-shards/" + shard + ".json")) finished[shard] = inode_of(out + "/" + name);
  }
  ASSERT_FALSE(finished.empty()) << "rank 1's first shard";
  r = run_mpi(2, verb_line("tile", out));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const auto& [shard, inode] : finished) {
    EXPECT_TRUE(contains(r.err, shard + ": kept from an earlier run of this job")) << shard << "\n" << r.err;
    EXPECT_EQ(inode_of(out + "/" + shard), inode) << shard;
  }
  EXPECT_TRUE(testing::shard_tiles(out) == testing::shard_tiles(dir_->file("shards")))
      << "the same tiles as an uninterrupted run";
}

TEST_F(Outputs, AKeptShardWhosePixelsChangedIsExtractedAgain) {
  const std::string out = dir_->file("tile-damaged");
  auto r = run_script("TESSERA_FAULT='tile.shard-finished after=1 do=kill' $TESSERA " + verb_line("tile", out) +
                      "\necho rc=$?\n");
  ASSERT_EQ(shell_status(r), 128 + 9) << r.err;
  // One pixel of the finished shard changes (as a bad disk or another program might): its record no longer holds.
  const std::string shard = out + "/shard-00000.h5.unchecked";
  const auto offset = io::ShardFile::open(shard).images_offset();
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(static_cast<std::streamoff>(offset));
    const char byte = static_cast<char>(file.get() ^ 0x5a);
    file.seekp(static_cast<std::streamoff>(offset));
    file.put(byte);
  }
  r = run(verb_line("tile", out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "its pixels do not match its record")) << r.err;
  EXPECT_FALSE(contains(r.err, "kept from an earlier run")) << r.err;
  EXPECT_TRUE(testing::shard_tiles(out) == testing::shard_tiles(dir_->file("shards")));
}

TEST_F(Outputs, UpToDateNeedsTheStateTheManifestAndTheShardsToAgree) {
  const std::string out = dir_->file("tile-agree");
  ASSERT_EQ(run(verb_line("tile", out)).code, 0);
  const auto before = testing::shard_tiles(out);
  auto r = run(verb_line("tile", out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "up to date")) << r.err;

  // A manifest of another job (its config_hash differs) beside this job's state file.
  json manifest;
  std::ifstream(out + "/manifest.json") >> manifest;
  manifest["config_hash"] = "0123456789abcdef";
  std::ofstream(out + "/manifest.json") << manifest.dump(2);
  r = run(verb_line("tile", out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "was written by another job")) << r.err;
  EXPECT_FALSE(contains(r.err, "up to date")) << r.err;
  EXPECT_TRUE(testing::shard_tiles(out) == before);

  // A shard that is not the one the manifest lists (another shard copied over it).
  fs::copy_file(out + "/shard-00001.h5", out + "/shard-00000.h5", fs::copy_options::overwrite_existing);
  r = run(verb_line("tile", out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "up to date")) << r.err;
  EXPECT_TRUE(testing::shard_tiles(out) == before);
}

TEST_F(Outputs, InferSkipsFinishedSlidesRemovesAKilledRunsTemporariesAndRedoesOnForce) {
  const std::string whole = dir_->file("infer-whole");
  auto r = run(verb_line("infer", whole));
  ASSERT_EQ(r.code, 0) << r.err;
  json summary;
  std::ifstream(whole + "/infer.json") >> summary;
  ASSERT_EQ(summary["slides"].size(), 2u);
  const std::string first = summary["slides"][0]["id"];
  const std::string second = summary["slides"][1]["id"];

  const std::string out = dir_->file("infer-killed");
  r = run_script("TESSERA_FAULT='infer.slide-finished after=1 do=kill' $TESSERA " + verb_line("infer", out) +
                 "\necho rc=$?\n");
  ASSERT_EQ(shell_status(r), 128 + 9) << r.err;
  ASSERT_TRUE(fs::exists(out + "/" + first + ".heatmap.h5"));
  const ino_t finished = inode_of(out + "/" + first + ".heatmap.h5");
  // What a run killed while writing a pyramid TIFF leaves: the file and a level under temporary names.
  const std::string leftover = out + "/" + second + ".heatmap.tif.tmp-999999";
  std::ofstream(leftover) << "half";
  std::ofstream(leftover + ".level1") << "half";

  r = run(verb_line("infer", out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "slide 1/2 " + first + ": up to date")) << r.err;
  EXPECT_FALSE(contains(r.err, "slide 2/2 " + second + ": up to date")) << r.err;
  EXPECT_EQ(inode_of(out + "/" + first + ".heatmap.h5"), finished) << "the finished slide was not redone";
  EXPECT_FALSE(fs::exists(leftover));
  EXPECT_FALSE(fs::exists(leftover + ".level1"));
  for (const auto& id : {first, second}) {
    const auto a = io::read_heatmap(out + "/" + id + ".heatmap.h5").prob;
    const auto b = io::read_heatmap(whole + "/" + id + ".heatmap.h5").prob;
    EXPECT_TRUE(a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0)
        << id << ": the same map as an uninterrupted run, bit for bit";
  }
  json resumed;
  std::ifstream(out + "/infer.json") >> resumed;
  EXPECT_EQ(resumed["slides"].size(), 2u) << "the summary lists the kept slide too";

  // Other settings: nothing is up to date. --force: everything is redone.
  r = run(verb_line("infer", out) + " --threshold 0.7");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "up to date")) << r.err;
  r = run(verb_line("infer", out) + " --threshold 0.7");
  EXPECT_TRUE(contains(r.err, "slide 2/2 " + second + ": up to date")) << r.err;
  const ino_t before_force = inode_of(out + "/" + first + ".heatmap.h5");
  r = run(verb_line("infer", out) + " --threshold 0.7 --force");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "up to date")) << r.err;
  EXPECT_NE(inode_of(out + "/" + first + ".heatmap.h5"), before_force);
}

}  // namespace
}  // namespace tessera
