// DICOM whole-slide series (io/dicom_slide.h) against the TIFF they were made from (io/dicom_writer.h): every
// transfer syntax (JPEG Baseline, explicit and implicit VR little endian, JPEG-LS by DCMTK's dcmcjpls, JPEG 2000 by
// GDCM's gdcmconv) and organisation (TILED_FULL, TILED_SPARSE with missing tiles, one instance per level, offset
// table filled, empty or extended, several fragments per frame, two optical paths or focal planes), YBR_FULL_422, an
// ICC profile, Pixel Spacing per frame, the Imaged Volume resolution fallback, and bad input (not a slide, truncated,
// frame count off, damaged frame, unsupported syntax, two instances for one level, levels of two images, other
// series in the folder).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <opencv2/core.hpp>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcpixel.h>
#include <dcmtk/dcmdata/dcpixseq.h>
#include <dcmtk/dcmdata/dcpxitem.h>
#include <dcmtk/dcmdata/dcuid.h>
#include <jpeglib.h>

#include "core/error.h"
#include "io/dicom_slide.h"
#include "io/dicom_writer.h"
#include "io/slide.h"
#include "tests/testing/testing.h"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kWidth = 1000;
constexpr std::int64_t kHeight = 777;

// A small pattern slide as a generic JPEG TIFF (3 levels, 256-px tiles) and the same slide as a DICOM series.
struct Pair {
  testing::TempDir dir;
  std::string tiff;
  std::string series;
  explicit Pair(const DicomWriterOptions& options, TiffFlavor flavor = TiffFlavor::generic,
                std::int64_t height = kHeight) {
    TiffWriterOptions tiff_options;
    tiff_options.flavor = flavor;
    tiff_options.jpeg_quality = 90;
    tiff_options.mpp = 0.25;
    tiff = dir.file("slide.tif");
    series = dir.file("series");
    testing::write_pattern_slide(tiff, kWidth, height, tiff_options);
    write_dicom_series(tiff, series, options);
  }
};

// Largest absolute difference of two RGB images of one size.
int max_difference(const cv::Mat& a, const cv::Mat& b) {
  EXPECT_EQ(a.size(), b.size());
  cv::Mat diff;
  cv::absdiff(a, b, diff);
  double largest = 0.0;
  cv::minMaxLoc(diff.reshape(1), nullptr, &largest);
  return static_cast<int>(largest);
}

// Every level of `dicom`, read whole and in an unaligned window, against `tiff`; returns the largest difference.
int compare_levels(const Slide& dicom, const Slide& tiff) {
  EXPECT_EQ(dicom.level_count(), tiff.level_count());
  int largest = 0;
  for (int l = 0; l < std::min(dicom.level_count(), tiff.level_count()); ++l) {
    const SlideLevel& a = dicom.level(l);
    const SlideLevel& b = tiff.level(l);
    EXPECT_EQ(a.width, b.width);
    EXPECT_EQ(a.height, b.height);
    EXPECT_DOUBLE_EQ(a.downsample, b.downsample);
    const auto ds = static_cast<std::int64_t>(a.downsample);
    largest = std::max(largest, max_difference(dicom.read_region(0, 0, l, a.width, a.height),
                                               tiff.read_region(0, 0, l, b.width, b.height)));
    // A window crossing tile borders and the slide's edge.
    largest = std::max(largest, max_difference(dicom.read_region(123 * ds, 201 * ds, l, 300, 700),
                                               tiff.read_region(123 * ds, 201 * ds, l, 300, 700)));
  }
  return largest;
}

// Runs a shell command; its exit status, and its output in `output`.
int run(const std::string& command, std::string* output = nullptr) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string text;
  std::array<char, 4096> buffer{};
  for (std::size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) text.append(buffer.data(), n);
  if (output != nullptr) *output = text;
  return pclose(pipe);
}

std::string error_of(const std::string& path) {
  try {
    Slide::open(path);
  } catch (const core::Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Whether one of the slide's notes contains `part`.
bool noted(const Slide& slide, const std::string& part) {
  return std::any_of(slide.notes().begin(), slide.notes().end(), [&](const auto& n) { return contains(n, part); });
}

TEST(Dicom, JpegFramesAreTheTiffTilesPixelForPixel) {
  const Pair pair({});
  const Slide dicom = Slide::open(pair.series);
  const Slide tiff = Slide::open(pair.tiff);
  EXPECT_EQ(dicom.vendor(), "dicom");
  EXPECT_EQ(dicom.reader(), "DICOM (JPEG Baseline frames)");
  EXPECT_EQ(dicom.id(), "series");
  EXPECT_EQ(dicom.mpp_source(), MppSource::dicom);
  EXPECT_DOUBLE_EQ(dicom.mpp(), 0.25);
  EXPECT_DOUBLE_EQ(dicom.mpp_y(), 0.25);
  EXPECT_EQ(dicom.level(0).tile_width, 256);
  EXPECT_EQ(dicom.property("dicom.level[0].frame-map"), "one fragment per frame");
  // The same JPEG streams through the same libjpeg: identical pixels.
  EXPECT_EQ(compare_levels(dicom, tiff), 0);
}

TEST(Dicom, RgbOverYcbcrFramesDecodeAsTheirHeadersSay) {
  // Photometric Interpretation RGB over YCbCr-coded frames, as some converters write: decoded as YCbCr.
  DicomWriterOptions options;
  options.jpeg_photometric = "RGB";
  const Pair pair(options);
  EXPECT_EQ(compare_levels(Slide::open(pair.series), Slide::open(pair.tiff)), 0);
}

struct Organisation {
  const char* name;
  DicomWriterOptions options;
  const char* frame_map;  // level 0's
};

class DicomOrganisation : public ::testing::TestWithParam<Organisation> {};

TEST_P(DicomOrganisation, ReadsAsTheTiff) {
  const Pair pair(GetParam().options);
  const Slide dicom = Slide::open(pair.series);
  EXPECT_EQ(dicom.property("dicom.level[0].frame-map"), GetParam().frame_map);
  EXPECT_EQ(compare_levels(dicom, Slide::open(pair.tiff)), 0);
}

DicomWriterOptions with(void (*change)(DicomWriterOptions&)) {
  DicomWriterOptions o;
  change(o);
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Syntaxes, DicomOrganisation,
    ::testing::Values(
        Organisation{"offset_table", with([](DicomWriterOptions& o) { o.offset_table = true; }), "basic offset table"},
        Organisation{"fragments", with([](DicomWriterOptions& o) { o.fragments_per_frame = 3; }), "fragment walk"},
        Organisation{"fragments_offset_table", with([](DicomWriterOptions& o) {
                       o.fragments_per_frame = 2;
                       o.offset_table = true;
                     }),
                     "basic offset table"},
        Organisation{"extended_offset_table", with([](DicomWriterOptions& o) { o.extended_offset_table = true; }),
                     "extended offset table"},
        Organisation{"sparse_jpeg", with([](DicomWriterOptions& o) { o.sparse = true; }), "one fragment per frame"},
        Organisation{"explicit", with([](DicomWriterOptions& o) { o.syntax = DicomTransferSyntax::explicit_little; }),
                     "uncompressed"},
        Organisation{"implicit", with([](DicomWriterOptions& o) { o.syntax = DicomTransferSyntax::implicit_little; }),
                     "uncompressed"},
        Organisation{"sparse_explicit", with([](DicomWriterOptions& o) {
                       o.syntax = DicomTransferSyntax::explicit_little;
                       o.sparse = true;
                     }),
                     "uncompressed"}),
    [](const auto& param_info) { return std::string(param_info.param.name); });

// Frames are read at their file positions when the pixel data ends the file (checked at open), and through DCMTK
// otherwise: here data set trailing padding after the pixel data. Same pixels either way.
TEST(Dicom, FramesAreReadThroughDcmtkWhenThePixelDataIsNotLast) {
  for (const auto syntax : {DicomTransferSyntax::jpeg_baseline, DicomTransferSyntax::explicit_little}) {
    DicomWriterOptions options;
    options.syntax = syntax;
    options.fragments_per_frame = 2;
    const Pair pair(options);
    EXPECT_EQ(Slide::open(pair.series).property("dicom.level[0].frame-reads"), "positional");
    for (const auto& entry : fs::directory_iterator(pair.series)) {
      DcmFileFormat file;
      ASSERT_TRUE(file.loadFile(entry.path().c_str()).good());
      file.loadAllDataIntoMemory();  // saved over the file it was lazily read from
      const Uint8 padding[8] = {};
      file.getDataset()->putAndInsertUint8Array(DCM_DataSetTrailingPadding, padding, sizeof(padding));
      ASSERT_TRUE(file.saveFile(entry.path().c_str(), file.getDataset()->getOriginalXfer()).good());
    }
    const Slide dicom = Slide::open(pair.series);
    EXPECT_EQ(dicom.property("dicom.level[0].frame-reads"), "DCMTK");
    EXPECT_EQ(compare_levels(dicom, Slide::open(pair.tiff)), 0);
  }
}

TEST(Dicom, SparseTilesWithoutFramesAreBackgroundAndCounted) {
  DicomWriterOptions options;
  options.sparse = true;
  options.omit_tiles = {{0, 0}, {0, 5}};  // level 0: 4 tiles across; tiles (0, 0) and (1, 1)
  const Pair pair(options);
  const Slide dicom = Slide::open(pair.series);
  const Slide tiff = Slide::open(pair.tiff);
  EXPECT_EQ(dicom.property("dicom.level[0].organization"), "TILED_SPARSE");
  ASSERT_FALSE(dicom.notes().empty());
  EXPECT_TRUE(contains(dicom.notes().back(), "level 0: TILED_SPARSE, 2 tiles without a frame")) << dicom.notes().back();
  const cv::Mat missing = dicom.read_region(256, 256, 0, 256, 256);
  EXPECT_EQ(cv::countNonZero(missing.reshape(1) != 255), 0);
  EXPECT_EQ(max_difference(dicom.read_region(512, 0, 0, 488, 777), tiff.read_region(512, 0, 0, 488, 777)), 0);
  EXPECT_GT(max_difference(dicom.read_region(0, 0, 0, 256, 256), tiff.read_region(0, 0, 0, 256, 256)), 0);
}

// Two optical paths (the second holds the inverse of the first's pixels): the first is read, in TILED_FULL (frames
// of path 1, then of path 2) and in TILED_SPARSE (each frame names its path; path 2's frame first for every tile),
// and the other is said.
TEST(Dicom, SeveralOpticalPathsReadTheFirstAndSaySo) {
  for (const bool sparse : {false, true}) {
    DicomWriterOptions options;
    options.syntax = DicomTransferSyntax::explicit_little;
    options.optical_paths = 2;
    options.sparse = sparse;
    const Pair pair(options);
    const Slide dicom = Slide::open(pair.series);
    EXPECT_EQ(dicom.property("dicom.optical-paths"), "1\\2");
    EXPECT_EQ(compare_levels(dicom, Slide::open(pair.tiff)), 0) << (sparse ? "TILED_SPARSE" : "TILED_FULL");
    EXPECT_TRUE(noted(dicom, "2 optical paths (1, 2); '1' is read"));
    // Level 0 is 4x4 tiles: 16 frames of path 2 left.
    EXPECT_TRUE(noted(dicom, "level-0.dcm: 16 frames of other optical paths or focal planes not used"));
  }
}

// Two focal planes (the second, 0.001 mm above, holds the inverse): the first is read, in TILED_FULL (frames of plane
// 1, then of plane 2) and in TILED_SPARSE (each frame's Z Offset), and the other is said.
TEST(Dicom, SeveralFocalPlanesReadTheFirstAndSaySo) {
  for (const bool sparse : {false, true}) {
    DicomWriterOptions options;
    options.syntax = DicomTransferSyntax::explicit_little;
    options.focal_planes = 2;
    options.sparse = sparse;
    const Pair pair(options);
    const Slide dicom = Slide::open(pair.series);
    EXPECT_EQ(dicom.property("dicom.focal-planes"), "2");
    EXPECT_EQ(compare_levels(dicom, Slide::open(pair.tiff)), 0) << (sparse ? "TILED_SPARSE" : "TILED_FULL");
    EXPECT_TRUE(noted(dicom, "2 focal planes; the first is read"));
    EXPECT_TRUE(noted(dicom, "level-0.dcm: 16 frames of other optical paths or focal planes not used"));
  }
}

// A minimal ICC profile: the 128-byte header (v4.3, display class, RGB data, XYZ connection space, 'acsp') and an
// empty tag table.
std::string icc_profile() {
  std::string icc(132, '\0');
  const auto put = [&](std::size_t at, const std::string& four) { icc.replace(at, 4, four); };
  put(0, std::string{'\0', '\0', '\0', static_cast<char>(132)});
  put(8, std::string{'\x04', '\x30', '\0', '\0'});
  put(12, "mntr");
  put(16, "RGB ");
  put(20, "XYZ ");
  put(36, "acsp");
  return icc;
}

TEST(Dicom, AnIccProfileIsKeptByteForByteAndReported) {
  DicomWriterOptions options;
  options.icc_profile = icc_profile();
  const Pair pair(options);
  const auto dicom = DicomSlide::open(pair.series);
  EXPECT_EQ(dicom->icc_profile(), options.icc_profile);
  const Slide slide = Slide::open(pair.series);
  EXPECT_EQ(slide.property("dicom.icc-profile-bytes"), "132");
  // Kept, not applied: the pixels are the TIFF's.
  EXPECT_EQ(compare_levels(slide, Slide::open(pair.tiff)), 0);
  EXPECT_TRUE(DicomSlide::open(Pair({}).series)->icc_profile().empty());
}

TEST(Dicom, YbrFull422UncompressedIsConverted) {
  DicomWriterOptions options;
  options.syntax = DicomTransferSyntax::explicit_little;
  options.ybr_full_422 = true;
  const Pair pair(options);
  const Slide dicom = Slide::open(pair.series);
  EXPECT_EQ(dicom.property("dicom.photometric-interpretation"), "YBR_FULL_422");
  const cv::Mat a = dicom.read_region(0, 0, 0, kWidth, kHeight);
  const cv::Mat b = Slide::open(pair.tiff).read_region(0, 0, 0, kWidth, kHeight);
  // Chroma is shared by pixel pairs: close, not equal; a naive reader taking Y Y Cb Cr for RGB is far off.
  cv::Mat diff;
  cv::absdiff(a, b, diff);
  const cv::Scalar mean = cv::mean(diff);
  for (int c = 0; c < 3; ++c) EXPECT_LT(mean[c], 3.0) << "channel " << c;
}

// A lossless re-encoding by another toolkit of the explicit-VR series decodes to the very same pixels.
void check_reencoded(const std::string& tool, const std::string& expected_reader) {
  DicomWriterOptions options;
  options.syntax = DicomTransferSyntax::explicit_little;
  const Pair pair(options);
  const fs::path recoded = pair.dir.path() / "recoded";
  fs::create_directories(recoded);
  for (const auto& entry : fs::directory_iterator(pair.series)) {
    const std::string from = entry.path().string();
    const std::string to = (recoded / entry.path().filename()).string();
    std::string output;
    ASSERT_EQ(run(tool + " " + from + " " + to, &output), 0)
        << tool << " failed (Debian packages dcmtk, libgdcm-tools): " << output;
  }
  const Slide dicom = Slide::open(recoded.string());
  EXPECT_EQ(dicom.reader(), expected_reader);
  EXPECT_EQ(compare_levels(dicom, Slide::open(pair.series)), 0);
}

TEST(Dicom, JpegLsByDcmcjplsDecodesExactly) { check_reencoded("dcmcjpls", "DICOM (JPEG-LS Lossless frames)"); }

TEST(Dicom, Jpeg2000ByGdcmconvDecodesExactly) {
  check_reencoded("gdcmconv --j2k", "DICOM (JPEG 2000 (Lossless only) frames)");
}

TEST(Dicom, OneFileOfTheSeriesOpensTheSeries) {
  const Pair pair({}, TiffFlavor::aperio);
  const Slide folder = Slide::open(pair.series);
  const Slide file = Slide::open((fs::path(pair.series) / "level-1.dcm").string());
  EXPECT_EQ(file.id(), "series");
  EXPECT_EQ(file.level_count(), folder.level_count());
  EXPECT_EQ(max_difference(file.read_region(0, 0, 0, kWidth, kHeight), folder.read_region(0, 0, 0, kWidth, kHeight)),
            0);
  // Associated images: the TIFF's, as uncompressed instances.
  const Slide tiff = Slide::open(pair.tiff);
  ASSERT_EQ(folder.associated_images().size(), tiff.associated_images().size());
  for (const auto& a : tiff.associated_images()) {
    EXPECT_EQ(max_difference(folder.read_associated_image(a.name), tiff.read_associated_image(a.name)), 0) << a.name;
  }
}

TEST(Dicom, OtherSeriesInTheFolderAreIgnoredWhenAFileIsNamed) {
  const Pair pair({});
  DicomWriterOptions other;
  other.uid_seed = "another slide";
  write_dicom_series(pair.tiff, pair.dir.file("other"), other);
  fs::copy_file(pair.dir.path() / "other" / "level-0.dcm", fs::path(pair.series) / "other-level-0.dcm");
  // The folder alone is ambiguous.
  EXPECT_TRUE(contains(error_of(pair.series), "the folder holds 2 slide series")) << error_of(pair.series);
  const Slide slide = Slide::open((fs::path(pair.series) / "level-0.dcm").string());
  EXPECT_EQ(slide.level_count(), Slide::open(pair.tiff).level_count());
  EXPECT_EQ(slide.id(), derived_uid("tessera", "series"));  // the Series Instance UID names it
  EXPECT_TRUE(std::any_of(slide.notes().begin(), slide.notes().end(), [](const std::string& n) {
    return contains(n, "1 files of other series in the folder ignored");
  }));
}

// Pixel Spacing in each frame's functional groups instead of the shared ones (TILED_SPARSE files may carry it so).
TEST(Dicom, PerFramePixelSpacingGivesTheResolution) {
  DicomWriterOptions options;
  options.sparse = true;
  const Pair pair(options);
  for (const auto& entry : fs::directory_iterator(pair.series)) {
    const std::string path = entry.path().string();
    if (!contains(path, "level-")) continue;  // not an associated image
    DcmFileFormat file;
    ASSERT_TRUE(file.loadFile(path.c_str()).good());
    file.loadAllDataIntoMemory();  // saved over the file it was lazily read from
    DcmDataset* ds = file.getDataset();
    DcmItem* shared = nullptr;
    ASSERT_TRUE(ds->findAndGetSequenceItem(DCM_SharedFunctionalGroupsSequence, shared).good());
    DcmItem* measures = nullptr;
    ASSERT_TRUE(shared->findAndGetSequenceItem(DCM_PixelMeasuresSequence, measures).good());
    OFString spacing;
    ASSERT_TRUE(measures->findAndGetOFStringArray(DCM_PixelSpacing, spacing).good());
    ASSERT_TRUE(shared->findAndDeleteElement(DCM_PixelMeasuresSequence).good());
    DcmSequenceOfItems* groups = nullptr;
    ASSERT_TRUE(ds->findAndGetSequence(DCM_PerFrameFunctionalGroupsSequence, groups).good());
    for (unsigned long f = 0; f < groups->card(); ++f) {
      DcmItem* own = nullptr;
      ASSERT_TRUE(groups->getItem(f)->findOrCreateSequenceItem(DCM_PixelMeasuresSequence, own, -2).good());
      own->putAndInsertString(DCM_PixelSpacing, spacing.c_str());
    }
    ASSERT_TRUE(file.saveFile(path.c_str(), ds->getOriginalXfer()).good());
  }
  const Slide slide = Slide::open(pair.series);
  EXPECT_EQ(slide.mpp_source(), MppSource::dicom);
  EXPECT_EQ(slide.property("dicom.mpp-origin"), "DICOM Pixel Spacing");
  EXPECT_DOUBLE_EQ(slide.mpp(), 0.25);
  EXPECT_EQ(compare_levels(slide, Slide::open(pair.tiff)), 0);
}

TEST(Dicom, ImagedVolumeGivesTheResolutionWhenPixelSpacingIsAbsent) {
  DicomWriterOptions options;
  options.pixel_spacing = false;
  const Pair pair(options);
  const Slide slide = Slide::open(pair.series);
  EXPECT_EQ(slide.property("dicom.mpp-origin"), "DICOM Imaged Volume Width/Height");
  EXPECT_NEAR(slide.mpp(), 0.25, 1e-6);  // written as 32-bit floats
  EXPECT_TRUE(std::any_of(slide.notes().begin(), slide.notes().end(),
                          [](const std::string& n) { return contains(n, "no Pixel Spacing"); }));
}

// ---- bad input ----

TEST(Dicom, ANonSlideDicomFileIsNamedAsSuch) {
  const testing::TempDir dir;
  const std::string path = dir.file("ct.dcm");
  DcmFileFormat file;
  file.getDataset()->putAndInsertString(DCM_SOPClassUID, UID_CTImageStorage);
  file.getDataset()->putAndInsertString(DCM_SOPInstanceUID, derived_uid("test", "ct").c_str());
  file.getDataset()->putAndInsertString(DCM_Modality, "CT");
  ASSERT_TRUE(file.saveFile(path.c_str(), EXS_LittleEndianExplicit).good());
  const std::string error = error_of(path);
  EXPECT_TRUE(contains(error, "DICOM file, but not a whole-slide image (modality CT)")) << error;
  EXPECT_TRUE(contains(error, "ct.dcm")) << error;
}

TEST(Dicom, ATruncatedFileIsAnErrorNamingIt) {
  const Pair pair({});
  const fs::path level = fs::path(pair.series) / "level-0.dcm";
  fs::resize_file(level, fs::file_size(level) / 2);
  const std::string error = error_of(pair.series);
  EXPECT_TRUE(contains(error, "corrupt DICOM file")) << error;
  EXPECT_TRUE(contains(error, "level-0.dcm")) << error;
}

TEST(Dicom, AFrameCountThatDisagreesWithThePixelDataIsAnError) {
  for (const auto syntax : {DicomTransferSyntax::jpeg_baseline, DicomTransferSyntax::explicit_little}) {
    DicomWriterOptions options;
    options.syntax = syntax;
    const Pair pair(options);
    const std::string path = (fs::path(pair.series) / "level-0.dcm").string();
    DcmFileFormat file;
    ASSERT_TRUE(file.loadFile(path.c_str()).good());
    file.loadAllDataIntoMemory();                                     // saved over the file it was lazily read from
    file.getDataset()->putAndInsertString(DCM_NumberOfFrames, "17");  // 16 tiles at level 0
    ASSERT_TRUE(file.saveFile(path.c_str(), file.getDataset()->getOriginalXfer()).good());
    const std::string error = error_of(pair.series);
    EXPECT_TRUE(contains(error, syntax == DicomTransferSyntax::jpeg_baseline
                                    ? "frame count 17 disagrees with the pixel data (16 frames found by fragment walk)"
                                    : "frame count 17 disagrees with the pixel data (3145728 bytes, 3342336 needed)"))
        << error;
    EXPECT_TRUE(contains(error, "level-0.dcm")) << error;
  }
}

TEST(Dicom, AMissingLevelFileIsNotFound) {
  const Pair pair({});
  const std::string missing = (fs::path(pair.series) / "level-7.dcm").string();
  EXPECT_THROW(Slide::open(missing), core::FileNotFoundError);
}

TEST(Dicom, ADamagedFrameIsAnErrorNeverPixels) {
  const Pair pair({});
  const fs::path level = fs::path(pair.series) / "level-0.dcm";
  std::string bytes;
  {
    std::ifstream in(level, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Scramble entropy-coded data of the first frame: 300 bytes past its start of scan.
  const std::size_t sos = bytes.find("\xff\xda");
  ASSERT_NE(sos, std::string::npos);
  for (std::size_t i = sos + 300; i < sos + 340; ++i) bytes[i] = static_cast<char>(0x5a ^ i);
  {
    std::ofstream out(level, std::ios::binary);
    out << bytes;
  }
  const Slide slide = Slide::open(pair.series);
  try {
    slide.read_region(0, 0, 0, 256, 256);
    ADD_FAILURE() << "a damaged frame was read";
  } catch (const core::CorruptTileError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot decode frame 1")) << e.what();
    EXPECT_TRUE(contains(e.what(), "level-0.dcm")) << e.what();
  }
  // The other frames still read.
  EXPECT_NO_THROW(slide.read_region(512, 512, 0, 256, 256));
}

TEST(Dicom, AnUnsupportedTransferSyntaxIsNamed) {
  DicomWriterOptions options;
  options.syntax = DicomTransferSyntax::explicit_little;
  const Pair pair(options);
  const std::string level = (fs::path(pair.series) / "level-0.dcm").string();
  ASSERT_EQ(run("dcmconv +tb " + level + " " + level + ".big && mv " + level + ".big " + level), 0);
  const std::string error = error_of(pair.series);
  EXPECT_TRUE(contains(error, "unsupported transfer syntax Big Endian Explicit (1.2.840.10008.1.2.2)")) << error;
}

TEST(Dicom, TwoInstancesForOneLevelAreAnError) {
  const Pair pair({});
  fs::copy_file(fs::path(pair.series) / "level-1.dcm", fs::path(pair.series) / "level-1-copy.dcm");
  const std::string error = error_of(pair.series);
  EXPECT_TRUE(contains(error, "two instances for one 500x389 level")) << error;
  EXPECT_TRUE(contains(error, "level-1-copy.dcm")) << error;
}

TEST(Dicom, LevelsOfTwoImagesAreNotAPyramid) {
  const Pair pair({});
  // The same series UIDs over a slide of another shape.
  const Pair other({}, TiffFlavor::generic, 300);
  fs::copy_file(fs::path(other.series) / "level-1.dcm", fs::path(pair.series) / "stray.dcm");
  fs::remove(fs::path(pair.series) / "level-1.dcm");
  const std::string error = error_of(pair.series);
  EXPECT_TRUE(contains(error, "levels do not form a pyramid of one image")) << error;
  EXPECT_TRUE(contains(error, "stray.dcm")) << error;
}

TEST(Dicom, AFolderWithoutSlidesSaysSo) {
  const testing::TempDir dir;
  std::ofstream(dir.file("notes.txt")) << "not a slide";
  const std::string error = error_of(dir.path().string());
  EXPECT_TRUE(contains(error, "no DICOM file in the folder")) << error;
}

// ---- the shared real data (../shared/data/real-slides/dicom, described in its README) ----

fs::path real_file(const std::string& name) { return testing::shared_data_dir() / "real-slides" / name; }
std::string skip_message(const fs::path& path) {
  return "no real data at " + path.string() + " (../shared/data is absent)";
}

// The CMU-1-Small-Region scan converted to DICOM by another project's converter is the SVS: its size and µm/px, and
// level 0 within JPEG re-encoding (mean absolute difference per channel ≤ 5 grey levels). A reader that took the
// RGB Photometric Interpretation at its word over the JFIF (YCbCr) frames would be off by tens of grey levels.
TEST(DicomReal, CmuSeriesIsTheSvs) {
  const fs::path series = real_file("dicom/cmu-1-small-region-dicom");
  const fs::path svs = real_file("cmu-1-small-region.svs");
  if (!fs::exists(series) || !fs::exists(svs)) GTEST_SKIP() << skip_message(series);
  const Slide dicom = Slide::open(series.string());
  const Slide aperio = Slide::open(svs.string());
  EXPECT_EQ(dicom.id(), "cmu-1-small-region-dicom");
  EXPECT_EQ(dicom.level_count(), 12);
  EXPECT_EQ(dicom.width(), aperio.width());
  EXPECT_EQ(dicom.height(), aperio.height());
  EXPECT_NEAR(dicom.mpp(), aperio.mpp(), 1e-3);
  EXPECT_EQ(dicom.property("dicom.level[0].frame-map"), "one fragment per frame");
  EXPECT_TRUE(noted(dicom, "12 different Frame of Reference UIDs"));
  EXPECT_TRUE(noted(dicom, "no Optical Path Sequence"));
  EXPECT_TRUE(noted(dicom, "no Total Pixel Matrix Origin Sequence"));
  cv::Mat diff;
  cv::absdiff(dicom.read_region(0, 0, 0, dicom.width(), dicom.height()),
              aperio.read_region(0, 0, 0, aperio.width(), aperio.height()), diff);
  const cv::Scalar mad = cv::mean(diff);
  std::printf("CMU-1 DICOM vs SVS, level 0, mean absolute difference R %.2f G %.2f B %.2f\n", mad[0], mad[1], mad[2]);
  for (int c = 0; c < 3; ++c) EXPECT_LE(mad[c], 5.0) << "channel " << c;
}

// libjpeg's decode of a JPEG stream, RGB.
cv::Mat decode_jpeg(const std::uint8_t* data, unsigned long size) {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr errors{};
  cinfo.err = jpeg_std_error(&errors);
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, size);
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  cv::Mat out(static_cast<int>(cinfo.output_height), static_cast<int>(cinfo.output_width), CV_8UC3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out.ptr(static_cast<int>(cinfo.output_scanline));
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return out;
}

// `rgb` JPEG-encoded with the parameters of the JPEG stream `model` (its colour space, chroma subsampling and
// quantisation tables: libjpeg's jpeg_copy_critical_parameters, as jpegtran uses it), then decoded.
cv::Mat reencode_like(const cv::Mat& rgb, const std::uint8_t* model, unsigned long model_size) {
  jpeg_decompress_struct source{};
  jpeg_error_mgr source_errors{};
  source.err = jpeg_std_error(&source_errors);
  jpeg_create_decompress(&source);
  jpeg_mem_src(&source, model, model_size);
  jpeg_read_header(&source, TRUE);
  jpeg_compress_struct target{};
  jpeg_error_mgr target_errors{};
  target.err = jpeg_std_error(&target_errors);
  jpeg_create_compress(&target);
  unsigned char* encoded = nullptr;
  unsigned long encoded_size = 0;
  jpeg_mem_dest(&target, &encoded, &encoded_size);
  target.image_width = static_cast<JDIMENSION>(rgb.cols);
  target.image_height = static_cast<JDIMENSION>(rgb.rows);
  target.input_components = 3;
  jpeg_copy_critical_parameters(&source, &target);
  target.in_color_space = JCS_RGB;  // converted to the model's colour space (YCbCr) by the encoder
  jpeg_start_compress(&target, TRUE);
  while (target.next_scanline < target.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(rgb.ptr(static_cast<int>(target.next_scanline)));
    jpeg_write_scanlines(&target, &row, 1);
  }
  jpeg_finish_compress(&target);
  jpeg_destroy_compress(&target);
  jpeg_destroy_decompress(&source);
  cv::Mat decoded = decode_jpeg(encoded, encoded_size);
  std::free(encoded);
  return decoded;
}

// Where the CMU-1 DICOM series' level 0 differs from the SVS, the difference is in the file: the SVS's pixels (as
// Tessera decodes them), JPEG-encoded by libjpeg with each DICOM frame's own parameters (YCbCr 4:2:0 and its
// quantisation tables) and decoded, are the DICOM series' pixels as Tessera decodes them (bit for bit, but in the
// partial MCUs at the right and bottom edge, whose padding the converter did not keep). So the converter decoded
// the SVS as Tessera does and re-encoded it, with no offset, resampling or colour change, and Tessera decodes the
// result as libjpeg does. The re-encoding (mostly the 4:2:0 chroma subsampling) costs a mean absolute difference of
// about 8 / 5 / 9 grey levels on tissue (3.7 / 2.3 / 4.3 over the whole level, where background is most of it): a
// floor that no reader can go below, printed here.
TEST(DicomReal, CmuSeriesLevel0IsTheSvsReencodedByItsConverter) {
  const fs::path level0 = real_file("dicom/cmu-1-small-region-dicom/level-0-frames-0-30.dcm");
  const fs::path svs = real_file("cmu-1-small-region.svs");
  if (!fs::exists(level0) || !fs::exists(svs)) GTEST_SKIP() << skip_message(level0.parent_path());
  const Slide dicom = Slide::open(level0.parent_path().string());
  const Slide aperio = Slide::open(svs.string());
  const cv::Mat ours = dicom.read_region(0, 0, 0, dicom.width(), dicom.height());
  const cv::Mat source = aperio.read_region(0, 0, 0, aperio.width(), aperio.height());
  const int tile = dicom.level(0).tile_width;
  ASSERT_EQ(tile, dicom.level(0).tile_height);
  DcmFileFormat file;
  ASSERT_TRUE(file.loadFile(level0.c_str()).good());
  DcmElement* element = nullptr;
  ASSERT_TRUE(file.getDataset()->findAndGetElement(DCM_PixelData, element).good());
  DcmPixelSequence* fragments = nullptr;
  ASSERT_TRUE(dynamic_cast<DcmPixelData*>(element)
                  ->getEncapsulatedRepresentation(file.getDataset()->getOriginalXfer(), nullptr, fragments)
                  .good());
  const int across = static_cast<int>((dicom.width() + tile - 1) / tile);
  cv::Mat reencoded(source.size(), CV_8UC3);
  for (unsigned long item = 1; item < fragments->card(); ++item) {  // one fragment per frame, TILED_FULL
    DcmPixelItem* fragment = nullptr;
    Uint8* bytes = nullptr;
    ASSERT_TRUE(fragments->getItem(fragment, item).good() && fragment->getUint8Array(bytes).good());
    const int frame = static_cast<int>(item - 1);
    const cv::Rect inside =
        cv::Rect(frame % across * tile, frame / across * tile, tile, tile) & cv::Rect(0, 0, source.cols, source.rows);
    // The frame's part past the slide's edge: the DICOM frame's own pixels (the converter's padding).
    cv::Mat block = decode_jpeg(bytes, fragment->getLength());
    source(inside).copyTo(block(cv::Rect(0, 0, inside.width, inside.height)));
    reencode_like(block, bytes, fragment->getLength())(cv::Rect(0, 0, inside.width, inside.height))
        .copyTo(reencoded(inside));
  }
  cv::Mat diff;
  cv::absdiff(ours, reencoded, diff);
  const cv::Scalar residual = cv::mean(diff);
  double largest = 0.0;
  cv::minMaxLoc(diff.reshape(1), nullptr, &largest);
  const int differing = cv::countNonZero(diff.reshape(1));
  // The frames are YCbCr 4:2:0: 16x16-pixel MCUs. Only those that reach past the slide's right or bottom edge also
  // encode the converter's padding, which the file does not keep; every whole MCU must come out bit for bit.
  constexpr int kMcu = 16;
  const cv::Rect whole_mcus(0, 0, diff.cols / kMcu * kMcu, diff.rows / kMcu * kMcu);
  EXPECT_EQ(cv::countNonZero(diff(whole_mcus).reshape(1)), 0);
  cv::absdiff(ours, source, diff);
  const cv::Scalar floor = cv::mean(diff);
  std::printf(
      "CMU-1 DICOM level 0 vs the SVS re-encoded with the DICOM frames' JPEG parameters: mean absolute difference "
      "R %.3f G %.3f B %.3f, largest %.0f, %d of %zu values differ; vs the SVS itself R %.2f G %.2f B %.2f\n",
      residual[0], residual[1], residual[2], largest, differing, diff.total() * 3, floor[0], floor[1], floor[2]);
  for (int c = 0; c < 3; ++c) EXPECT_LE(residual[c], 0.05) << "channel " << c;
}

// The uncompressed highdicom file decodes to exactly the values pydicom (Debian python3-pydicom) reads.
TEST(DicomReal, HighdicomUncompressedIsWhatPydicomReads) {
  const fs::path file = real_file("dicom/highdicom/sm_image.dcm");
  if (!fs::exists(file)) GTEST_SKIP() << skip_message(file);
  const Slide slide = Slide::open(file.string());
  ASSERT_EQ(slide.width(), 50);
  ASSERT_EQ(slide.height(), 50);
  // pydicom's frames, tiled by row and column as TILED_FULL lays them out, as raw RGB bytes in hex.
  const std::string script =
      "import pydicom,sys\n"
      "d=pydicom.dcmread(sys.argv[1]);a=d.pixel_array;W=d.TotalPixelMatrixColumns;H=d.TotalPixelMatrixRows\n"
      "r,c=d.Rows,d.Columns;n=(W+c-1)//c;out=bytearray(W*H*3)\n"
      "for f in range(a.shape[0]):\n"
      " y0,x0=f//n*r,f%n*c\n"
      " for y in range(min(r,H-y0)):\n"
      "  for x in range(min(c,W-x0)):\n"
      "   i=((y0+y)*W+x0+x)*3;out[i:i+3]=bytes(int(v) for v in a[f,y,x])\n"
      "print(out.hex())\n";
  const testing::TempDir dir;
  std::ofstream(dir.file("dump.py")) << script;
  std::string output;
  ASSERT_EQ(run("/usr/bin/python3 " + dir.file("dump.py") + " " + file.string(), &output), 0)
      << "pydicom (Debian python3-pydicom): " << output;
  const cv::Mat pixels = slide.read_region(0, 0, 0, 50, 50);
  std::string hex;
  static constexpr char kDigits[] = "0123456789abcdef";
  for (int r = 0; r < pixels.rows; ++r) {
    for (int c = 0; c < pixels.cols * 3; ++c) {
      const unsigned char v = pixels.ptr<unsigned char>(r)[c];
      hex += kDigits[v >> 4];
      hex += kDigits[v & 15];
    }
  }
  while (!output.empty() && output.back() == '\n') output.pop_back();
  EXPECT_EQ(hex, output);
}

TEST(DicomReal, NonSlideFilesAreNamedAsSuch) {
  const fs::path dx = real_file("dicom/highdicom/dx_image.dcm");
  const fs::path seg = real_file("dicom/highdicom/seg_image_sm_control.dcm");
  if (!fs::exists(dx) || !fs::exists(seg)) GTEST_SKIP() << skip_message(dx.parent_path());
  EXPECT_TRUE(contains(error_of(dx.string()), "DICOM file, but not a whole-slide image (modality DX)"))
      << error_of(dx.string());
  EXPECT_TRUE(contains(error_of(seg.string()), "DICOM file, but not a whole-slide image (modality SEG)"))
      << error_of(seg.string());
}

}  // namespace
}  // namespace tessera::io
