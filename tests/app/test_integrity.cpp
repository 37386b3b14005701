// Slide integrity end to end: damaged pixels are an error, never data. A slide with a damaged JPEG tile (bytes
// scrambled inside its coded data, which libjpeg only warns about) fails `tile` and `infer` alone, listed with the
// error, while the other slides go on; `tile --on-corrupt-tile skip` leaves the damaged tiles out and counts them
// in the manifest. A slide that may not be read says "permission denied" (checked as an unprivileged user, since
// root reads any file), a symlink loop says so, and a real file whose tiles are all damaged is named as such.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/shard.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::damage_tiles;
using testing::run;
using testing::run_mpi;
using testing::run_script;
using testing::TileDamage;

// Tiles of 32 px at 0.5 µm/px come from level 1 of the 2048-px synthetic slides (0.25 µm/px; levels 2048, 1024,
// 512 px, TIFF tiles of 256 px), the tissue mask from level 2: damage in level 1 lets the slide open and plan.
constexpr int kTile = 32;
constexpr double kMpp = 0.5;
constexpr double kSlideMpp = 0.25;
constexpr int kTiffTile = 256;
// The damaged TIFF tile of level 1 (column, row): inside the tissue of tumor_001.
constexpr std::uint32_t kColumn = 1;
constexpr std::uint32_t kRow = 1;

using TileKey = testing::ShardTileKey;  // slide, x, y, label

// Whether a tile at level-0 (x, y) reads pixels of the damaged TIFF tile of level 1.
bool on_damaged_tile(std::int64_t x, std::int64_t y) {
  const double to_level1 = 0.5;  // level 1's downsample is 2
  const double side = kTile * kMpp / kSlideMpp * to_level1;
  const double lx = static_cast<double>(x) * to_level1;
  const double ly = static_cast<double>(y) * to_level1;
  return lx < (kColumn + 1) * kTiffTile && lx + side > kColumn * kTiffTile && ly < (kRow + 1) * kTiffTile &&
         ly + side > kRow * kTiffTile;
}

// Two synthetic slides (tumor_001 as Aperio .svs, normal_001 as generic .tif), intact and as a copy in which level 1
// of tumor_001 has one scrambled TIFF tile; made once for the suite.
class Integrity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const auto r = run("synth --out " + dir_->file("intact") +
                       " --slides 2 --size 2048 --seed 7 --set preview.enabled=false --set slides.flavour=mixed");
    ASSERT_EQ(r.code, 0) << r.err;
    fs::copy(dir_->file("intact"), dir_->file("damaged"), fs::copy_options::recursive);
    ASSERT_EQ(damage_tiles(
                  dir_->file("damaged/slides/tumor_001.svs"), 1,
                  [](std::uint32_t column, std::uint32_t row) { return column == kColumn && row == kRow; },
                  TileDamage::scramble),
              1);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // A tiling job over one of the two sets.
  static std::string job(const std::string& set, const std::string& out) {
    const std::string path = dir_->file(out + ".yaml");
    std::ofstream(path) << "input:\n  csv: " << dir_->file(set + "/dataset.csv") << "\n"
                        << "output: " << dir_->file(out) << "\n"
                        << "tile:\n  size: " << kTile << "\n  mpp: " << kMpp << "\n"
                        << "tissue:\n  min_fraction: 0.3\n"
                        << "shards:\n  tiles_per_shard: 100\n";
    return path;
  }

  static testing::TempDir* dir_;
};
testing::TempDir* Integrity::dir_ = nullptr;

TEST_F(Integrity, DamagedTileFailsItsSlideAloneAndTheOtherIsTiledAsFromIntactFiles) {
  const auto intact = run("tile " + job("intact", "intact-tiles"));
  ASSERT_EQ(intact.code, 0) << intact.err;
  const auto reference = testing::shard_tiles(dir_->file("intact-tiles"));

  const auto r = run("tile " + job("damaged", "fail-tiles"));
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "1 of 2 slides failed")) << r.err;
  const auto manifest = io::read_manifest(dir_->file("fail-tiles/manifest.json"));
  ASSERT_EQ(manifest.failures.size(), 1u);
  EXPECT_EQ(manifest.failures[0].slide, "tumor_001");
  const std::string& error = manifest.failures[0].error;
  EXPECT_TRUE(contains(error, "tumor_001.svs")) << error;
  EXPECT_TRUE(contains(error, "level 1")) << error;
  EXPECT_TRUE(contains(error, "cannot decode tile 5 (column 1, row 1) of level 1")) << error;
  EXPECT_TRUE(contains(error, "Corrupt JPEG data")) << error;
  ASSERT_EQ(manifest.slides.size(), 1u);
  EXPECT_EQ(manifest.slides[0].id, "normal_001");
  EXPECT_EQ(manifest.slides[0].corrupt_tiles, 0);

  // The other slide's tiles are exactly those of the intact run.
  std::map<TileKey, std::uint64_t> expected;
  for (const auto& [key, sum] : reference) {
    if (std::get<0>(key) == "normal_001") expected[key] = sum;
  }
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(testing::shard_tiles(dir_->file("fail-tiles")), expected);

  // The reading threads read a batch's tiles before its tiles' outcomes are taken in order: an error that is not the
  // input's (fault point tile.read, do=eio: a failing disk) on the tile after the slide's damaged one ends nothing,
  // as one thread reading in order would never read that tile; on a tile of the intact slide it ends the job. One
  // thread and three give the same outcome. The whole job is one batch, so that both tiles are read together. (Here
  // rather than in a test of its own, which would pay for the suite's slides again.)
  std::vector<std::tuple<std::string, std::int64_t, std::int64_t>> order;  // the job's tiles in order
  for (int index = 0;; ++index) {
    const std::string path = dir_->file("intact-tiles") + "/" + fmt::format("shard-{:05d}.h5", index);
    if (!fs::exists(path)) break;
    const auto shard = io::ShardFile::open(path);
    for (std::size_t i = 0; i < static_cast<std::size_t>(shard.size()); ++i) {
      order.emplace_back(shard.slides()[shard.slide_indices()[i]], shard.coords()[2 * i], shard.coords()[2 * i + 1]);
    }
  }
  std::size_t damaged = order.size(), intact_tile = order.size();
  for (std::size_t k = 0; k < order.size(); ++k) {
    const auto& [slide, x, y] = order[k];
    if (slide == "tumor_001" && on_damaged_tile(x, y) && damaged == order.size()) damaged = k;
    if (slide == "normal_001" && intact_tile == order.size()) intact_tile = k;
  }
  ASSERT_LT(damaged + 1, order.size());
  ASSERT_EQ(std::get<0>(order[damaged + 1]), "tumor_001") << "the tile after the damaged one is of its slide";
  ASSERT_LT(intact_tile, order.size());
  const auto tile = [&](std::size_t fault_tile, int threads, const std::string& out) {
    // tile.read counts the tiles read, in order: tile k is its (k + 1)-th hit.
    return testing::run_script("TESSERA_FAULT='tile.read after=" + std::to_string(fault_tile + 1) +
                               " do=eio' $TESSERA tile " + job("damaged", out) +
                               " --set shards.tiles_per_shard=100000 --set shards.write_batch=65536 "
                               "--set tile.threads=" +
                               std::to_string(threads));
  };
  for (const int threads : {1, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " thread(s)");
    const std::string out = "after-failure-" + std::to_string(threads);
    const auto after = tile(damaged + 1, threads, out);
    EXPECT_EQ(after.code, 3) << after.err;
    const auto m = io::read_manifest(dir_->file(out + "/manifest.json"));
    ASSERT_EQ(m.failures.size(), 1u);
    EXPECT_EQ(m.failures[0].slide, "tumor_001");
    EXPECT_TRUE(contains(m.failures[0].error, "Corrupt JPEG data")) << m.failures[0].error;
    EXPECT_EQ(testing::shard_tiles(dir_->file(out)), expected);
  }
  // The count is the one assumed above: a fault on the damaged tile itself (its slide not failed yet) ends the job.
  const auto on_damaged = tile(damaged, 3, "on-damaged");
  EXPECT_EQ(on_damaged.code, 1) << on_damaged.err;
  EXPECT_TRUE(contains(on_damaged.err, "fault injected at tile.read")) << on_damaged.err;
  const auto ended = tile(intact_tile, 3, "ended");
  EXPECT_EQ(ended.code, 1) << ended.err;
  EXPECT_TRUE(contains(ended.err, "Input/output error (fault injected at tile.read)")) << ended.err;
  EXPECT_FALSE(fs::exists(dir_->file("ended/manifest.json")));
}

TEST_F(Integrity, SkipLeavesTheDamagedTilesOutAndCountsThem) {
  const auto intact = run("tile " + job("intact", "intact-tiles-2"));
  ASSERT_EQ(intact.code, 0) << intact.err;
  const auto reference = testing::shard_tiles(dir_->file("intact-tiles-2"));
  std::map<TileKey, std::uint64_t> expected;
  std::int64_t damaged = 0;
  for (const auto& [key, sum] : reference) {
    const auto& [slide, x, y, label] = key;
    if (slide == "tumor_001" && on_damaged_tile(x, y)) {
      ++damaged;
    } else {
      expected[key] = sum;
    }
  }
  ASSERT_GT(damaged, 0) << "the damaged TIFF tile holds no tissue tile: the test would show nothing";

  // The flag, one rank and two (the damaged tiles then fall in shards of either rank).
  for (const int ranks : {1, 2}) {
    SCOPED_TRACE(std::to_string(ranks) + " rank(s)");
    const std::string out = "skip-tiles-" + std::to_string(ranks);
    const std::string line = "tile " + job("damaged", out) + " --on-corrupt-tile skip";
    const auto r = ranks == 1 ? run(line) : run_mpi(ranks, line);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(contains(r.err + r.out, "slide tumor_001: skipped")) << r.err;
    const auto manifest = io::read_manifest(dir_->file(out + "/manifest.json"));
    EXPECT_TRUE(manifest.failures.empty());
    ASSERT_EQ(manifest.slides.size(), 2u);
    for (const auto& s : manifest.slides) {
      EXPECT_EQ(s.corrupt_tiles, s.id == "tumor_001" ? damaged : 0) << s.id;
    }
    EXPECT_EQ(testing::shard_tiles(dir_->file(out)),
              expected);  // no damaged tile, every intact one as from the intact file
    for (const auto& e : fs::directory_iterator(dir_->file(out))) {
      EXPECT_FALSE(contains(e.path().string(), ".unchecked")) << e.path();
    }
  }
  // The YAML key does the same as the flag; a value other than fail or skip is refused, naming it.
  const auto key = run("tile " + job("damaged", "skip-key") + " --set tile.on_corrupt_tile=skip");
  EXPECT_EQ(key.code, 0) << key.err;
  const auto flag = run("tile " + job("damaged", "skip-bad") + " --on-corrupt-tile ignore");
  EXPECT_EQ(flag.code, 2) << flag.err;
  EXPECT_TRUE(contains(flag.err, "--on-corrupt-tile")) << flag.err;
  const auto bad_key = run("tile " + job("damaged", "skip-bad") + " --set tile.on_corrupt_tile=ignore");
  EXPECT_EQ(bad_key.code, 2) << bad_key.err;
  EXPECT_TRUE(contains(bad_key.err, "tile.on_corrupt_tile")) << bad_key.err;
}

TEST_F(Integrity, SkipFailsASlideWhoseTilesAreAllDamaged) {
  fs::copy(dir_->file("intact"), dir_->file("all-damaged"), fs::copy_options::recursive);
  ASSERT_EQ(damage_tiles(
                dir_->file("all-damaged/slides/tumor_001.svs"), 1, [](std::uint32_t, std::uint32_t) { return true; },
                TileDamage::zeros),
            16);
  const auto r = run("tile " + job("all-damaged", "all-damaged-tiles") + " --on-corrupt-tile skip");
  EXPECT_EQ(r.code, 3) << r.err;
  const auto manifest = io::read_manifest(dir_->file("all-damaged-tiles/manifest.json"));
  ASSERT_EQ(manifest.failures.size(), 1u);
  EXPECT_EQ(manifest.failures[0].slide, "tumor_001");
  EXPECT_TRUE(contains(manifest.failures[0].error, "tumor_001.svs")) << manifest.failures[0].error;
  EXPECT_TRUE(contains(manifest.failures[0].error, "of its tiles are damaged")) << manifest.failures[0].error;
  ASSERT_EQ(manifest.slides.size(), 1u);
  EXPECT_EQ(manifest.slides[0].id, "normal_001");
  for (const auto& [key, sum] : testing::shard_tiles(dir_->file("all-damaged-tiles"))) {
    EXPECT_EQ(std::get<0>(key), "normal_001");
  }
}

TEST_F(Integrity, InferListsTheDamagedSlideAsFailedAndScoresTheOther) {
  // A committed 8-px model at 0.5 µm/px: it reads level 1, the damaged one.
  const std::string checkpoint = (testing::test_data_dir() / "checkpoints" / "tiny_torch.h5").string();
  const std::string slides =
      dir_->file("damaged/slides/tumor_001.svs") + "," + dir_->file("damaged/slides/normal_001.tif");
  const auto r = run("infer --checkpoint " + checkpoint + " --slides " + slides + " --out " + dir_->file("infer") +
                     " --set outputs=[heatmap.h5] --set infer.stride=8");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "1 of 2 slides failed")) << r.err;
  EXPECT_TRUE(contains(r.err, "tumor_001.svs") && contains(r.err, "Corrupt JPEG data")) << r.err;
  EXPECT_FALSE(fs::exists(dir_->file("infer/tumor_001.heatmap.h5")));
  EXPECT_TRUE(fs::exists(dir_->file("infer/normal_001.heatmap.h5")));
  std::ifstream in(dir_->file("infer/infer.json"));
  const json summary = json::parse(in);
  ASSERT_EQ(summary["failures"].size(), 1u) << summary.dump(2);
  EXPECT_EQ(summary["failures"][0]["id"], "tumor_001");
}

TEST_F(Integrity, SymlinkLoopSaysSo) {
  const std::string a = dir_->file("loop-a.svs");
  const std::string b = dir_->file("loop-b.svs");
  fs::create_symlink(b, a);
  fs::create_symlink(a, b);
  const auto info = run("info " + a);
  EXPECT_EQ(info.code, 3) << info.err;
  EXPECT_TRUE(contains(info.err, "too many levels of symbolic links (a symlink loop)")) << info.err;
  EXPECT_TRUE(contains(info.err, "loop-a.svs")) << info.err;
  EXPECT_FALSE(contains(info.err, "not found")) << info.err;
  const auto tile = run("tile --set input.slides=[" + a + "," + dir_->file("intact/slides/normal_001.tif") + "] -o " +
                        dir_->file("loop-tiles") + " --set tile.size=32 --set tile.mpp=0.5");
  EXPECT_EQ(tile.code, 3) << tile.err;
  EXPECT_TRUE(contains(tile.err, "1 of 2 slides failed")) << tile.err;
  EXPECT_TRUE(contains(tile.err, "symlink loop")) << tile.err;
}

// Root reads any file whatever its mode: the commands run as user and group 65534 (nobody) through util-linux's
// setpriv, on a slide in a folder only root may enter and on a slide only root may read.
TEST_F(Integrity, PermissionDeniedSaysSo) {
  std::string as_user;
  if (::geteuid() == 0) {
    if (run_script("command -v setpriv").code != 0) GTEST_SKIP() << "setpriv (util-linux) is not installed";
    as_user = "setpriv --reuid 65534 --regid 65534 --clear-groups ";
    if (run_script(as_user + "$TESSERA --version >/dev/null 2>&1").code != 0) {
      GTEST_SKIP() << "user 65534 cannot run the tessera binary here (a folder on its path is closed to others)";
    }
  }
  const fs::path base = dir_->file("permissions");
  fs::create_directories(base / "closed");
  fs::copy_file(dir_->file("intact/slides/normal_001.tif"), base / "closed" / "in-closed-folder.tif");
  fs::copy_file(dir_->file("intact/slides/normal_001.tif"), base / "unreadable.tif");
  fs::create_directories(base / "out");
  // The suite's folder was made by this user with the default mode; the unprivileged user needs to enter it and
  // write the tiling's output.
  fs::permissions(dir_->path(), fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  fs::permissions(base, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  fs::permissions(base / "out", fs::perms::all);
  // Run as root, the commands' user is another one: the owner keeps its rights. Run as any other user, the
  // commands run as the owner, who loses them (and gets them back at the end, so the folder can be removed).
  const bool owner_keeps = !as_user.empty();
  fs::permissions(base / "closed", owner_keeps ? fs::perms::owner_all : fs::perms::none);
  fs::permissions(base / "unreadable.tif",
                  owner_keeps ? fs::perms::owner_read | fs::perms::owner_write : fs::perms::none);
  struct Restore {
    fs::path base;
    ~Restore() {
      std::error_code ec;
      fs::permissions(base / "closed", fs::perms::owner_all, ec);
      fs::permissions(base / "unreadable.tif", fs::perms::owner_read | fs::perms::owner_write, ec);
    }
  } restore{base};

  for (const std::string name : {"closed/in-closed-folder.tif", "unreadable.tif"}) {
    SCOPED_TRACE(name);
    const std::string slide = (base / name).string();
    const auto info = run_script(as_user + "\"$TESSERA\" info " + slide);
    EXPECT_EQ(info.code, 3) << info.err;
    EXPECT_TRUE(contains(info.err, "permission denied")) << info.err;
    EXPECT_TRUE(contains(info.err, slide)) << info.err;
    EXPECT_FALSE(contains(info.err, "unsupported slide format")) << info.err;
    EXPECT_FALSE(contains(info.err, "not found")) << info.err;
  }
  const auto tile =
      run_script(as_user + "\"$TESSERA\" tile --set 'input.slides=[" + (base / "unreadable.tif").string() + "]' -o " +
                 (base / "out").string() + " --set tile.size=32 --set tile.mpp=0.5");
  EXPECT_EQ(tile.code, 3) << tile.err;
  EXPECT_TRUE(contains(tile.err, "unreadable.tif") && contains(tile.err, "permission denied")) << tile.err;
}

// A real Aperio file whose every tile is damaged ("Bogus marker length"): its header is sound, so only reading
// pixels tells; `info` and `tile` both name it with the decoder's message.
TEST_F(Integrity, RealUnreadableSlideIsNamedWithTheDecodersMessage) {
  const fs::path slide = testing::shared_data_dir() / "real-slides" / "unreadable.svs";
  if (!fs::exists(slide)) GTEST_SKIP() << "no real data at " << slide << " (../shared/data is absent)";
  const auto info = run("info " + slide.string());
  EXPECT_EQ(info.code, 3) << info.err;
  EXPECT_TRUE(contains(info.err, "unreadable.svs") && contains(info.err, "Bogus marker length")) << info.err;
  const auto tile = run("tile --set input.slides=[" + slide.string() + "] -o " + dir_->file("real-unreadable") +
                        " --set tile.size=16 --set tile.mpp=0.5");
  EXPECT_EQ(tile.code, 3) << tile.err;
  EXPECT_TRUE(contains(tile.err, "unreadable.svs") && contains(tile.err, "Bogus marker length")) << tile.err;
  const auto manifest = io::read_manifest(dir_->file("real-unreadable/manifest.json"));
  ASSERT_EQ(manifest.failures.size(), 1u);
  EXPECT_EQ(manifest.failures[0].slide, "unreadable");
}

}  // namespace
}  // namespace tessera
