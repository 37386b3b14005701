// `tessera import` end to end: patches (a CSV or a folder by class) → shards, splits by group, bad patches listed and
// skipped, resume after a kill, and the real IDC patches of ../shared/data.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "io/shard.h"
#include "preprocessing/stain.h"
#include "preprocessing/stain_norm.h"
#include "preprocessing/tile_resume.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::run;

// A patch of side w×h whose pixels encode its number (so a shard's tile can be traced to its file).
cv::Mat patch(int number, int w = 20, int h = 20) {
  cv::Mat bgr(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x)
      bgr.at<cv::Vec3b>(y, x) = cv::Vec3b(number * 7 % 256, (x * 11 + number) % 256, y * 9 % 256);
  }
  return bgr;
}

// A file's whole text.
std::string text_of(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// 10 patients × 3 patches (patient p's patches are tumour when p is odd), as PNG files and a labels.csv.
struct PatchSet {
  explicit PatchSet(const fs::path& root) : folder(root) {
    fs::create_directories(root / "patches");
    std::ofstream csv(root / "labels.csv");
    csv << "path,label,patient\n";
    for (int p = 0; p < 10; ++p) {
      for (int k = 0; k < 3; ++k) {
        const int number = p * 3 + k;
        const std::string name = "patches/p" + std::to_string(p) + "_" + std::to_string(k) + ".png";
        cv::imwrite((root / name).string(), patch(number));
        csv << name << "," << (p % 2) << ",patient" << p << "\n";
      }
    }
  }
  fs::path folder;
};

TEST(Import, CsvPatchesBecomeShardsSplitByPatient) {
  testing::TempDir dir;
  const PatchSet set(dir.path());
  const std::string out = dir.file("shards");
  const auto r =
      run("import --csv " + dir.file("labels.csv") + " --mpp 4 --out " + out + " --set shards.tiles_per_shard=7");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto manifest = io::read_manifest(out + "/manifest.json");
  EXPECT_EQ(manifest.total_tiles(), 30);
  EXPECT_EQ(manifest.shards.size(), 5u);  // 30 patches, at most 7 a shard
  EXPECT_EQ(manifest.attributes.tile_size, 20);
  EXPECT_DOUBLE_EQ(manifest.attributes.mpp, 4.0);
  ASSERT_EQ(manifest.slides.size(), 10u);
  std::map<std::string, int> per_split;
  for (const auto& s : manifest.slides) {
    ++per_split[s.split];
    EXPECT_EQ(s.tiles, 3) << s.id;
    const int p = std::stoi(s.id.substr(7));
    EXPECT_EQ(s.label, p % 2 ? "tumor" : "normal") << s.id;
    EXPECT_EQ(s.origin, "real");
  }
  // 10 patients in 0.7 / 0.15 / 0.15: 7, then the two remainders of 0.5 (the first wins the tie).
  EXPECT_EQ(per_split, (std::map<std::string, int>{{"train", 7}, {"val", 2}, {"test", 1}}));

  // Every tile holds its patch's pixels (as RGB), its label, and x = its number in patches.csv.
  std::map<std::int64_t, std::string> path_of;
  {
    std::ifstream table(out + "/patches.csv");
    std::string line;
    std::getline(table, line);
    EXPECT_EQ(line, "number,path,group,label,split,status");
    while (std::getline(table, line)) {
      const auto comma = line.find(',');
      path_of[std::stoll(line.substr(0, comma))] = line.substr(comma + 1, line.find(',', comma + 1) - comma - 1);
    }
  }
  ASSERT_EQ(path_of.size(), 30u);
  int checked = 0;
  for (const auto& entry : manifest.shards) {
    const auto shard = io::ShardFile::open(out + "/" + entry.file);
    for (std::int64_t i = 0; i < shard.size(); ++i) {
      const auto x = shard.coords()[static_cast<std::size_t>(2 * i)];
      const std::string& file = path_of.at(x);
      cv::Mat rgb;
      cv::cvtColor(cv::imread(file), rgb, cv::COLOR_BGR2RGB);
      const cv::Mat tile = shard.read_image(i);
      EXPECT_EQ(cv::norm(tile, rgb, cv::NORM_INF), 0) << file;
      const std::string id = shard.slides()[shard.slide_indices()[static_cast<std::size_t>(i)]];
      std::string prefix = "p";
      prefix += id.substr(7);
      prefix += '_';
      EXPECT_TRUE(fs::path(file).filename().string().starts_with(prefix)) << file << " in " << id;
      EXPECT_EQ(shard.labels()[static_cast<std::size_t>(i)], std::stoi(id.substr(7)) % 2);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 30);

  // The same job again: up to date; another seed: other patients in each split, still whole patients.
  const auto again =
      run("import --csv " + dir.file("labels.csv") + " --mpp 4 --out " + out + " --set shards.tiles_per_shard=7");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(contains(again.err + again.out, "up to date")) << again.err;
}

TEST(Import, PadOrResizeOddSizedPatches) {
  testing::TempDir dir;
  fs::create_directories(dir.path() / "normal" / "a");
  fs::create_directories(dir.path() / "tumor" / "b");
  cv::imwrite(dir.file("normal/a/big.png"), patch(1, 24, 24));
  cv::imwrite(dir.file("normal/a/small.png"), patch(2, 10, 12));
  cv::imwrite(dir.file("tumor/b/same.png"), patch(3, 16, 16));
  for (const std::string fit : {"pad", "resize"}) {
    const std::string out = dir.file("out-" + fit);
    const auto r = run("import --folder " + dir.path().string() + " --mpp 2 --tile-size 16 --fit " + fit + " --out " +
                       out + " --set 'splits.fractions=[1, 0, 0]'");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto manifest = io::read_manifest(out + "/manifest.json");
    ASSERT_EQ(manifest.total_tiles(), 3);
    // pad keeps um/px; resize scales the most common square side (here 16 and 24 once each: the smaller) to 16.
    EXPECT_DOUBLE_EQ(manifest.attributes.mpp, 2.0);
    const auto shard = io::ShardFile::open(out + "/" + manifest.shards.at(0).file);
    // Job order: group a (big, small), then group b (same).
    const cv::Mat big = shard.read_image(0), small = shard.read_image(1), same = shard.read_image(2);
    cv::Mat expected;
    cv::cvtColor(patch(3, 16, 16), expected, cv::COLOR_BGR2RGB);
    EXPECT_EQ(cv::norm(same, expected, cv::NORM_INF), 0);
    if (fit == "pad") {
      cv::Mat b;
      cv::cvtColor(patch(1, 24, 24)(cv::Rect(4, 4, 16, 16)), b, cv::COLOR_BGR2RGB);
      EXPECT_EQ(cv::norm(big, b, cv::NORM_INF), 0) << "a larger patch is centre-cropped";
      EXPECT_EQ(small.at<cv::Vec3b>(0, 0), cv::Vec3b(255, 255, 255)) << "a smaller patch is centred on white";
      cv::Mat s;
      cv::cvtColor(patch(2, 10, 12), s, cv::COLOR_BGR2RGB);
      EXPECT_EQ(cv::norm(small(cv::Rect(3, 2, 10, 12)), s, cv::NORM_INF), 0);
    } else {
      EXPECT_NE(small.at<cv::Vec3b>(0, 0), cv::Vec3b(255, 255, 255)) << "resize fills the tile";
    }
    for (const auto& s : manifest.slides) EXPECT_EQ(s.split, "train");
  }
}

TEST(Import, BadPatchesAreListedAndLeftOut) {
  testing::TempDir dir;
  const PatchSet set(dir.path());
  // A truncated PNG, a truncated JPEG (libjpeg would fill the rest with grey), and text named .png.
  std::vector<unsigned char> png, jpeg;
  cv::imencode(".png", patch(5), png);
  cv::imencode(".jpg", patch(6, 64, 64), jpeg);
  std::ofstream(dir.file("patches/p1_0.png"), std::ios::binary).write(reinterpret_cast<const char*>(png.data()), 60);
  std::ofstream(dir.file("patches/cut.jpg"), std::ios::binary)
      .write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size() / 2));
  std::ofstream(dir.file("patches/p2_0.png")) << "not an image\n";
  std::ofstream(dir.file("labels.csv"), std::ios::app) << "patches/cut.jpg,1,patient3\n";
  const std::string out = dir.file("shards");
  const auto r = run("import --csv " + dir.file("labels.csv") + " --mpp 4 --out " + out);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "3 of 31 patches could not be read")) << r.err;
  EXPECT_TRUE(contains(r.err, "p1_0.png")) << r.err;
  EXPECT_TRUE(contains(r.err, "p2_0.png")) << r.err;
  EXPECT_TRUE(contains(r.err, "cut.jpg") && contains(r.err, "damaged JPEG data")) << r.err;
  const auto manifest = io::read_manifest(out + "/manifest.json");
  EXPECT_EQ(manifest.total_tiles(), 28);
  EXPECT_EQ(manifest.failures.size(), 3u);
}

TEST(Import, MistakesNameTheFileAndLine) {
  testing::TempDir dir;
  const PatchSet set(dir.path());
  std::ofstream(dir.file("labels.csv"), std::ios::app) << "patches/p0_0.png,maybe,patient0\n";
  auto r = run("import --csv " + dir.file("labels.csv") + " --mpp 4 --out " + dir.file("o1"));
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(contains(r.err, "labels.csv") && contains(r.err, "line 32") && contains(r.err, "'maybe'")) << r.err;

  std::ofstream(dir.file("split.csv"))
      << "path,label,group,split\npatches/p0_0.png,0,a,train\npatches/p0_1.png,0,a,test\n";
  r = run("import --csv " + dir.file("split.csv") + " --mpp 4 --out " + dir.file("o2"));
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(contains(r.err, "line 3") && contains(r.err, "group 'a'") && contains(r.err, "one split")) << r.err;

  r = run("import --csv " + dir.file("labels.csv") + " --out " + dir.file("o3"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "import.mpp")) << r.err;
}

// A killed import keeps its finished shards on the rerun and imports the rest, with the same shards and patches.csv as
// an uninterrupted run: the imported-stain-kept marks of a kept shard come from its record, a group straddling a kept
// shard and a written one is fitted again to the same numbers, and a record of an earlier version (no stain_kept) is
// imported again.
TEST(Import, AKilledImportResumesWithWhatIsLeft) {
  testing::TempDir dir;
  const PatchSet set(dir.path());
  // And a patient "blank" of 2 white patches (too little tissue to fit its stain), first in the job: patches 0-1.
  for (int k = 0; k < 2; ++k) {
    cv::imwrite(dir.file("patches/blank" + std::to_string(k) + ".png"), cv::Mat(20, 20, CV_8UC3, cv::Scalar::all(255)));
    std::ofstream(dir.file("labels.csv"), std::ios::app) << "patches/blank" << k << ".png,0,blank\n";
  }
  const std::string args = "import --csv " + dir.file("labels.csv") +
                           " --mpp 4 --set stain.method=reinhard --set shards.tiles_per_shard=8 --out ";
  const auto whole = run(args + dir.file("whole"));
  ASSERT_EQ(whole.code, 0) << whole.err;
  const std::string rows = text_of(dir.file("whole/patches.csv"));
  // Only blank's two patches kept their stain (the number patches of PatchSet are fitted).
  std::size_t marked = 0;
  for (std::size_t at = rows.find("stain-kept"); at != std::string::npos; at = rows.find("stain-kept", at + 1))
    ++marked;
  EXPECT_EQ(marked, 2u) << rows;
  EXPECT_TRUE(contains(rows, "patches/blank0.png,blank,normal,") && contains(rows, "patches/blank1.png,blank,normal,"))
      << rows;
  // 32 patches in shards of 8; killed after the third. patient4's patches (14-16) straddle shards 1 and 2.
  const auto killed = testing::run_script("TESSERA_FAULT='import.shard-finished after=3 do=kill' \"$TESSERA\" " + args +
                                          dir.file("resumed"));
  EXPECT_NE(killed.code, 0);
  EXPECT_FALSE(fs::exists(dir.file("resumed/manifest.json")));
  // Shard 2's record as an earlier version wrote it, without stain_kept: imported again.
  const fs::path record = dir.path() / "resumed" / prep::kTileRecordFolder / "shard-00002.h5.json";
  auto doc = nlohmann::json::parse(text_of(record.string()));
  ASSERT_EQ(doc.erase("stain_kept"), 1u) << doc.dump();
  std::ofstream(record) << doc.dump() << "\n";
  const auto resumed = run(args + dir.file("resumed"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  const std::string said = resumed.err + resumed.out;
  EXPECT_TRUE(contains(said, "shard-00000.h5: kept from an earlier run")) << said;
  EXPECT_TRUE(contains(said, "shard-00001.h5: kept from an earlier run")) << said;
  EXPECT_TRUE(contains(said,
                       "shard-00002.h5.json: resume record from an earlier version of tessera (it does not say "
                       "which groups kept their stain)"))
      << said;
  EXPECT_FALSE(contains(said, "shard-00002.h5: kept from an earlier run")) << said;
  // blank's mark comes from kept shard 0's record; patient4 is fitted afresh beside kept shard 1.
  EXPECT_TRUE(contains(resumed.err, "could not be fitted on 1 groups") && contains(resumed.err, "'blank'")) << said;
  EXPECT_EQ(text_of(dir.file("resumed/patches.csv")), rows);
  EXPECT_EQ(testing::shard_tiles(dir.file("whole")), testing::shard_tiles(dir.file("resumed")));
}

// A 24×24 H&E patch by stain.h's model: nuclei (haematoxylin) in the first `nuclei` columns, stroma (eosin) in the
// rest, each stain's amount scaled by `h` and `e` (a lab that stains darker or lighter). BGR, for imwrite.
cv::Mat he_patch(int nuclei, double h, double e) {
  const auto stains = prep::ruifrok_he();
  cv::Mat rgb(24, 24, CV_8UC3);
  for (int y = 0; y < 24; ++y) {
    for (int x = 0; x < 24; ++x) {
      const bool nucleus = x < nuclei;
      const double ch = (nucleus ? 0.9 + 0.02 * (y % 6) : 0.08) * h;
      const double ce = (nucleus ? 0.15 : 0.4 + 0.03 * ((x + y) % 5)) * e;
      rgb.at<cv::Vec3b>(y, x) = prep::od_to_rgb(stains.h * ch + stains.e * ce);
    }
  }
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  return bgr;
}

// The tiles of an import's shards by their number in the job (x).
std::map<std::int64_t, cv::Mat> tiles_by_number(const std::string& out) {
  std::map<std::int64_t, cv::Mat> tiles;
  for (const auto& entry : io::read_manifest(out + "/manifest.json").shards) {
    const auto shard = io::ShardFile::open(out + "/" + entry.file);
    for (std::int64_t i = 0; i < shard.size(); ++i)
      tiles[shard.coords()[static_cast<std::size_t>(2 * i)]] = shard.read_image(i);
  }
  return tiles;
}

// Mean over pixels and channels of |a − b|.
double mean_abs_difference(const cv::Mat& a, const cv::Mat& b) {
  cv::Mat d;
  cv::absdiff(a, b, d);
  const cv::Scalar m = cv::mean(d);
  return (m[0] + m[1] + m[2]) / 3;
}

// Mean over channels of |a's mean colour − b's|.
double mean_colour_gap(const cv::Mat& a, const cv::Mat& b) {
  const cv::Scalar ma = cv::mean(a), mb = cv::mean(b);
  return (std::abs(ma[0] - mb[0]) + std::abs(ma[1] - mb[1]) + std::abs(ma[2] - mb[2])) / 3;
}

// Two patients, "even" with 4 H&E patches (split train) and "white" with 2 blank ones (too little tissue to fit its
// stain; split val), as labels.csv under `root`; in job order even's are patches 0-3, white's 4-5.
void write_even_and_white(const fs::path& root) {
  fs::create_directories(root / "p");
  std::ofstream csv(root / "labels.csv");
  csv << "path,label,patient,split\n";
  for (int k = 0; k < 4; ++k) {
    cv::imwrite((root / ("p/even" + std::to_string(k) + ".png")).string(), he_patch(3 + 6 * k, 1.0, 1.0));
    csv << "p/even" << k << ".png," << k % 2 << ",even,train\n";
  }
  for (int k = 0; k < 2; ++k) {
    cv::imwrite((root / ("p/white" + std::to_string(k) + ".png")).string(),
                cv::Mat(24, 24, CV_8UC3, cv::Scalar(255, 255, 255)));
    csv << "p/white" << k << ".png,0,white,val\n";
  }
}

// Three patients: two with the same 4 patches (more and more nuclei), "cast" stained darker in haematoxylin and
// paler in eosin (split train), "even" not (val); and "white" with 2 blank patches (val). With stain.target_split:
// train and stain.fit: group (the default), each patient's colours are fitted once on all of its patches, although
// they straddle shards of 3: cast's stay, even's move to them and keep the differences between its patches, white's
// cannot be fitted and stay as they are (listed once). Patches that name no group are fitted patch by patch (the
// target's text alone), and those differences fade. The shards record the target; a split without patches is a
// config error naming the key.
TEST(Import, StainNormalizationFitsEachPatientAsAWhole) {
  testing::TempDir dir;
  fs::create_directories(dir.path() / "p");
  std::ofstream csv(dir.file("labels.csv")), ungrouped(dir.file("ungrouped.csv"));
  csv << "path,label,patient,split\n";
  ungrouped << "path,label\n";
  std::vector<cv::Mat> cast(4), even(4);
  for (int k = 0; k < 4; ++k) {
    const auto i = static_cast<std::size_t>(k);
    cv::imwrite(dir.file("p/cast" + std::to_string(k) + ".png"), he_patch(3 + 6 * k, 1.5, 0.6));
    cv::imwrite(dir.file("p/even" + std::to_string(k) + ".png"), he_patch(3 + 6 * k, 1.0, 1.0));
    cv::cvtColor(he_patch(3 + 6 * k, 1.5, 0.6), cast[i], cv::COLOR_BGR2RGB);
    cv::cvtColor(he_patch(3 + 6 * k, 1.0, 1.0), even[i], cv::COLOR_BGR2RGB);
    csv << "p/cast" << k << ".png," << k % 2 << ",cast,train\np/even" << k << ".png," << k % 2 << ",even,val\n";
    ungrouped << "p/cast" << k << ".png," << k % 2 << "\np/even" << k << ".png," << k % 2 << "\n";
  }
  const cv::Mat white(24, 24, CV_8UC3, cv::Scalar(255, 255, 255));
  for (int k = 0; k < 2; ++k) {
    cv::imwrite(dir.file("p/white" + std::to_string(k) + ".png"), white);
    csv << "p/white" << k << ".png,0,white,val\n";
    ungrouped << "p/white" << k << ".png,0\n";
  }
  csv.close();
  ungrouped.close();
  const std::string args = "import --csv " + dir.file("labels.csv") + " --mpp 4 --set stain.method=reinhard";
  const auto r =
      run(args + " --set stain.target_split=train --set shards.tiles_per_shard=3 --out " + dir.file("group"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto per_patch = run("import --csv " + dir.file("ungrouped.csv") +
                             " --mpp 4 --set stain.method=reinhard --out " + dir.file("patch"));
  ASSERT_EQ(per_patch.code, 0) << per_patch.err;
  EXPECT_FALSE(contains(per_patch.err, "could not be fitted")) << per_patch.err;

  const auto target = prep::make_stain_normalizer(prep::StainMethod::reinhard, cast, "split train, 4 patches");
  EXPECT_EQ(io::read_manifest(dir.file("group/manifest.json")).attributes.stain_normalization,
            target->describe() + prep::kPerGroupSuffix);
  const auto shard = io::read_manifest(dir.file("group/manifest.json")).shards.at(0).file;
  EXPECT_EQ(io::ShardFile::open(dir.file("group/" + shard)).attributes().stain_normalization,
            target->describe() + prep::kPerGroupSuffix);
  EXPECT_EQ(io::read_manifest(dir.file("patch/manifest.json")).attributes.stain_normalization,
            prep::make_stain_normalizer(prep::StainMethod::reinhard)->describe());

  // Job order (with or without groups, named then after the files): cast's patches 0-3, even's 4-7, white's 8-9; shards
  // of 3 cut cast after 2 and even after 5.
  const auto group = tiles_by_number(dir.file("group")), patch = tiles_by_number(dir.file("patch"));
  ASSERT_EQ(group.size(), 10u);
  std::string failure;
  const auto even_fit = target->fitted_to(even, failure);
  ASSERT_TRUE(even_fit) << failure;
  for (std::int64_t k = 0; k < 4; ++k) {
    const auto i = static_cast<std::size_t>(k);
    EXPECT_LT(mean_abs_difference(group.at(k), cast[i]), 1.0) << "patch " << k << " of the target's own patient";
    cv::Mat expected = even[i].clone();
    even_fit->apply(expected);
    EXPECT_EQ(cv::norm(group.at(k + 4), expected, cv::NORM_INF), 0) << "patch " << k << ": fitted on all of even's";
    EXPECT_LT(mean_abs_difference(group.at(k + 4), cast[i]), mean_abs_difference(even[i], cast[i]) / 3)
        << "patch " << k << " of the other patient";
  }
  for (const std::int64_t k : {8, 9}) EXPECT_EQ(cv::norm(group.at(k), white, cv::NORM_INF), 0) << "patch " << k;
  EXPECT_TRUE(contains(r.err, "could not be fitted on 1 groups") && contains(r.err, "'white'")) << r.err;
  const std::string rows = text_of(dir.file("group/patches.csv"));
  EXPECT_TRUE(contains(rows, "p/white0.png,white,normal,val,imported-stain-kept")) << rows;
  EXPECT_TRUE(contains(rows, "p/even0.png,even,normal,val,imported\n")) << rows;

  // The differences between a patient's patches: kept per group, faded patch by patch.
  const double before = mean_colour_gap(even[0], even[3]);
  const double kept = mean_colour_gap(group.at(4), group.at(7));
  const double faded = mean_colour_gap(patch.at(4), patch.at(7));
  EXPECT_GT(kept, before / 3) << "patches 0 and 3 of even: mean colours " << before << " apart, " << kept;
  EXPECT_LT(faded, kept / 10) << "fitted patch by patch: " << faded << " apart";

  const auto none = run(args + " --set stain.target_split=test --out " + dir.file("none"));
  EXPECT_EQ(none.code, 2);
  EXPECT_TRUE(contains(none.err, "stain.target_split") && contains(none.err, "no patches are in split 'test'"))
      << none.err;
}

// The job's identity covers the stain reference's bytes, not only its path: a reference replaced at the same path, by
// a BMP of the same size (so the same size and modification time, only the bytes differ), makes another job, imported
// again with the new target as a changed key is. (`tile` hashes the same digest, TileJobHash.*; a missing reference
// is the error naming it, StainReferenceDigest.*, thrown before the folder is touched.)
TEST(Import, AStainReferenceReplacedAtTheSamePathIsAnotherJob) {
  testing::TempDir dir;
  write_even_and_white(dir.path());
  const std::string reference = dir.file("reference.bmp");
  cv::imwrite(reference, he_patch(12, 1.0, 1.0));
  const std::string out = dir.file("shards");
  const std::string args = "import --csv " + dir.file("labels.csv") +
                           " --mpp 4 --set stain.method=reinhard --set stain.reference=" + reference + " --out " + out;
  auto target = [&] {
    cv::Mat rgb;
    cv::cvtColor(cv::imread(reference), rgb, cv::COLOR_BGR2RGB);
    return prep::make_stain_normalizer(prep::StainMethod::reinhard, rgb, reference)->describe() + prep::kPerGroupSuffix;
  };
  auto r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string first_target = target();
  EXPECT_EQ(io::read_manifest(out + "/manifest.json").attributes.stain_normalization, first_target);
  const auto first_tiles = testing::shard_tiles(out);

  const auto size = fs::file_size(reference);
  const auto time = fs::last_write_time(reference);
  cv::imwrite(reference, he_patch(12, 1.5, 0.6));
  fs::last_write_time(reference, time);
  ASSERT_EQ(fs::file_size(reference), size);
  ASSERT_EQ(fs::last_write_time(reference), time);
  ASSERT_NE(target(), first_target);
  r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(contains(r.err + r.out, "up to date")) << r.err;
  EXPECT_EQ(io::read_manifest(out + "/manifest.json").attributes.stain_normalization, target());
  EXPECT_EQ(io::ShardFile::open(out + "/shard-00000.h5").attributes().stain_normalization, target());
  EXPECT_NE(testing::shard_tiles(out), first_tiles);
}

// `tessera bench import` on a few generated patches: both rows of Tessera's process, and Python's row or the reason
// it is missing (the figures themselves are measurements, never checked).
TEST(Import, BenchReportsTesseraAndPython) {
  testing::TempDir dir;
  const auto r = run("bench import --patches 40 --tile 24 --rounds 1 --workdir " + dir.file("bench"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "40 patches")) << r.out;
  EXPECT_TRUE(contains(r.out, "tessera import, 1 rank, 1 thread")) << r.out;
  EXPECT_TRUE(contains(r.out, "python: PIL + one h5py write per patch") || contains(r.out, "python: not measured"))
      << r.out;
  EXPECT_EQ(io::read_manifest(dir.file("bench/shards/manifest.json")).total_tiles(), 40);
}

// The real IDC patches (../shared/data/idc): every patch in, patients whole in their splits.
TEST(Import, RealIdcPatches) {
  const fs::path labels = testing::shared_data_dir() / "idc" / "labels.csv";
  if (!fs::exists(labels)) GTEST_SKIP() << "the real IDC patches are not here (" << labels << ")";
  testing::TempDir dir;
  const auto r = run("import --csv " + labels.string() + " --mpp 4 --tile-size 50 --out " + dir.file("idc"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto manifest = io::read_manifest(dir.file("idc/manifest.json"));
  std::ifstream in(labels);
  std::string line;
  std::int64_t rows = -1;
  while (std::getline(in, line)) rows += line.empty() ? 0 : 1;
  EXPECT_EQ(manifest.total_tiles(), rows);
  EXPECT_EQ(manifest.slides.size(), 206u);
  std::set<std::string> splits;
  for (const auto& s : manifest.slides) splits.insert(s.split);
  EXPECT_EQ(splits, (std::set<std::string>{"train", "val", "test"}));
}

}  // namespace
}  // namespace tessera
