#include "io/dicom_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include <dcmtk/config/osconfig.h>  // first of DCMTK's headers
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcpixel.h>
#include <dcmtk/dcmdata/dcpixseq.h>
#include <dcmtk/dcmdata/dcpxitem.h>
#include <dcmtk/dcmdata/dcuid.h>
#include <dcmtk/dcmdata/dcvrov.h>
#include <tiffio.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/hash.h"
#include "io/slide.h"
#include "io/tiff_reader.h"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;

constexpr double kMillimetresPerMicron = 0.001;
constexpr int kChannels = 3;

void check(const OFCondition& status, const std::string& what, const std::string& path) {
  if (status.bad())
    throw core::InternalError(fmt::format("cannot write DICOM ({}): {}; file '{}'", what, status.text(), path));
}

int ignore_tiff_message(TIFF*, void*, const char*, const char*, va_list) { return 1; }

// The source TIFF, opened with libtiff for its raw JPEG tiles.
struct RawTiff {
  TIFF* tif = nullptr;
  explicit RawTiff(const std::string& path) {
    TIFFOpenOptions* options = TIFFOpenOptionsAlloc();
    TIFFOpenOptionsSetErrorHandlerExtR(options, ignore_tiff_message, nullptr);
    TIFFOpenOptionsSetWarningHandlerExtR(options, ignore_tiff_message, nullptr);
    tif = TIFFOpenExt(path.c_str(), "r", options);
    TIFFOpenOptionsFree(options);
    if (tif == nullptr) throw core::InputError("libtiff cannot open the slide", path);
  }
  RawTiff(const RawTiff&) = delete;
  RawTiff& operator=(const RawTiff&) = delete;
  ~RawTiff() { TIFFClose(tif); }
};

// A complete JPEG stream from a TIFF tile: libtiff keeps the quantisation and Huffman tables in the shared
// JPEGTables tag (SOI tables EOI) and each tile abbreviated (SOI ... EOI); the tables go in after the tile's SOI.
std::vector<std::uint8_t> full_jpeg(const std::vector<std::uint8_t>& tile, const std::uint8_t* tables,
                                    std::uint32_t table_bytes) {
  constexpr std::size_t kMarker = 2;
  if (tables == nullptr || table_bytes < 2 * kMarker) return tile;
  std::vector<std::uint8_t> out(tile.begin(), tile.begin() + kMarker);
  out.insert(out.end(), tables + kMarker, tables + table_bytes - kMarker);
  out.insert(out.end(), tile.begin() + kMarker, tile.end());
  return out;
}

// RGB to full-range YCbCr 4:2:2 (Y1 Y2 Cb Cr per pair of pixels, chroma averaged over the pair).
void append_ybr_422(const cv::Mat& rgb, std::vector<std::uint8_t>& out) {
  const auto clamp = [](double v) { return static_cast<std::uint8_t>(std::clamp(std::lround(v), 0L, 255L)); };
  for (int r = 0; r < rgb.rows; ++r) {
    const auto* row = rgb.ptr<cv::Vec3b>(r);
    for (int c = 0; c + 1 < rgb.cols; c += 2) {
      double cb = 0.0;
      double cr = 0.0;
      std::array<std::uint8_t, 2> y{};
      for (int k = 0; k < 2; ++k) {
        const double red = row[c + k][0];
        const double green = row[c + k][1];
        const double blue = row[c + k][2];
        y[k] = clamp(0.299 * red + 0.587 * green + 0.114 * blue);
        cb += 128.0 - 0.168736 * red - 0.331264 * green + 0.5 * blue;
        cr += 128.0 + 0.5 * red - 0.418688 * green - 0.081312 * blue;
      }
      out.insert(out.end(), {y[0], y[1], clamp(cb / 2.0), clamp(cr / 2.0)});
    }
  }
}

struct Common {
  std::string study;
  std::string series;
  std::string frame_of_reference;
  std::string software;
  double mpp_x = 0.0;
  double mpp_y = 0.0;
  std::int64_t width0 = 0;
  std::int64_t height0 = 0;
};

// The attributes every instance of the series carries.
void put_common(DcmDataset* ds, const Common& c, const std::string& sop_uid, const std::string& image_type,
                const std::string& path, int optical_paths = 1, int focal_planes = 1,
                const std::string& icc_profile = {}) {
  const auto put = [&](const DcmTagKey& tag, const std::string& value) {
    check(ds->putAndInsertString(tag, value.c_str()), "attribute", path);
  };
  put(DCM_SOPClassUID, UID_VLWholeSlideMicroscopyImageStorage);
  put(DCM_SOPInstanceUID, sop_uid);
  put(DCM_StudyInstanceUID, c.study);
  put(DCM_SeriesInstanceUID, c.series);
  put(DCM_FrameOfReferenceUID, c.frame_of_reference);
  put(DCM_Modality, "SM");
  put(DCM_ImageType, image_type);
  put(DCM_Manufacturer, "Tessera");
  put(DCM_SoftwareVersions, c.software);
  put(DCM_PatientName, "");
  put(DCM_PatientID, "");
  put(DCM_PatientBirthDate, "");
  put(DCM_PatientSex, "");
  put(DCM_StudyDate, "");
  put(DCM_StudyTime, "");
  put(DCM_AccessionNumber, "");
  put(DCM_ReferringPhysicianName, "");
  put(DCM_StudyID, "");
  put(DCM_SeriesNumber, "1");
  put(DCM_ContentDate, "");
  put(DCM_ContentTime, "");
  put(DCM_PositionReferenceIndicator, "SLIDE_CORNER");
  put(DCM_VolumetricProperties, "VOLUME");
  put(DCM_SpecimenLabelInImage, "NO");
  put(DCM_BurnedInAnnotation, "NO");
  put(DCM_FocusMethod, "AUTO");
  put(DCM_ExtendedDepthOfField, "NO");
  put(DCM_ImageOrientationSlide, "0\\-1\\0\\-1\\0\\0");
  put(DCM_ContainerIdentifier, c.series);
  put(DCM_NumberOfOpticalPaths, std::to_string(optical_paths));
  put(DCM_TotalPixelMatrixFocalPlanes, std::to_string(focal_planes));
  check(
      ds->putAndInsertFloat32(DCM_ImagedVolumeWidth, static_cast<Float32>(c.width0 * c.mpp_x * kMillimetresPerMicron)),
      "attribute", path);
  check(ds->putAndInsertFloat32(DCM_ImagedVolumeHeight,
                                static_cast<Float32>(c.height0 * c.mpp_y * kMillimetresPerMicron)),
        "attribute", path);
  check(ds->putAndInsertFloat32(DCM_ImagedVolumeDepth, 1.0F), "attribute", path);
  DcmItem* origin = nullptr;
  check(ds->findOrCreateSequenceItem(DCM_TotalPixelMatrixOriginSequence, origin, -2), "origin", path);
  origin->putAndInsertString(DCM_XOffsetInSlideCoordinateSystem, "0");
  origin->putAndInsertString(DCM_YOffsetInSlideCoordinateSystem, "0");
  for (int p = 0; p < optical_paths; ++p) {
    DcmItem* optical = nullptr;
    check(ds->findOrCreateSequenceItem(DCM_OpticalPathSequence, optical, -2), "optical path", path);
    optical->putAndInsertString(DCM_OpticalPathIdentifier, std::to_string(p + 1).c_str());
    optical->putAndInsertString(DCM_OpticalPathDescription, p == 0 ? "brightfield" : "brightfield, inverted");
    DcmItem* code = nullptr;
    optical->findOrCreateSequenceItem(DCM_IlluminationTypeCodeSequence, code, -2);
    code->putAndInsertString(DCM_CodeValue, "111744");
    code->putAndInsertString(DCM_CodingSchemeDesignator, "DCM");
    code->putAndInsertString(DCM_CodeMeaning, "Brightfield illumination");
    optical->findOrCreateSequenceItem(DCM_IlluminationColorCodeSequence, code, -2);
    code->putAndInsertString(DCM_CodeValue, "11744");
    code->putAndInsertString(DCM_CodingSchemeDesignator, "DCM");
    code->putAndInsertString(DCM_CodeMeaning, "Full Spectrum");
    if (p == 0 && !icc_profile.empty()) {
      check(optical->putAndInsertUint8Array(DCM_ICCProfile, reinterpret_cast<const Uint8*>(icc_profile.data()),
                                            static_cast<unsigned long>(icc_profile.size())),
            "ICC profile", path);
    }
  }
  DcmItem* dimension = nullptr;
  ds->findOrCreateSequenceItem(DCM_DimensionOrganizationSequence, dimension, -2);
  dimension->putAndInsertString(DCM_DimensionOrganizationUID, derived_uid(c.series, "dimension organisation").c_str());
}

void put_image(DcmDataset* ds, int rows, int cols, std::int64_t frames, std::int64_t total_cols,
               std::int64_t total_rows, const std::string& photometric, bool lossy, double mpp_x, double mpp_y,
               bool pixel_spacing, const std::string& path, bool one_optical_path = true) {
  const auto put16 = [&](const DcmTagKey& tag, int value) {
    check(ds->putAndInsertUint16(tag, static_cast<Uint16>(value)), "attribute", path);
  };
  put16(DCM_Rows, rows);
  put16(DCM_Columns, cols);
  put16(DCM_SamplesPerPixel, kChannels);
  put16(DCM_PlanarConfiguration, 0);
  put16(DCM_BitsAllocated, 8);
  put16(DCM_BitsStored, 8);
  put16(DCM_HighBit, 7);
  put16(DCM_PixelRepresentation, 0);
  ds->putAndInsertString(DCM_PhotometricInterpretation, photometric.c_str());
  ds->putAndInsertString(DCM_NumberOfFrames, std::to_string(frames).c_str());
  ds->putAndInsertUint32(DCM_TotalPixelMatrixColumns, static_cast<Uint32>(total_cols));
  ds->putAndInsertUint32(DCM_TotalPixelMatrixRows, static_cast<Uint32>(total_rows));
  ds->putAndInsertString(DCM_LossyImageCompression, lossy ? "01" : "00");
  if (lossy) {
    ds->putAndInsertString(DCM_LossyImageCompressionMethod, "ISO_10918_1");
  }
  DcmItem* shared = nullptr;
  ds->findOrCreateSequenceItem(DCM_SharedFunctionalGroupsSequence, shared, -2);
  if (pixel_spacing) {
    DcmItem* measures = nullptr;
    shared->findOrCreateSequenceItem(DCM_PixelMeasuresSequence, measures, -2);
    measures->putAndInsertString(
        DCM_PixelSpacing,
        fmt::format("{:.9g}\\{:.9g}", mpp_y * kMillimetresPerMicron, mpp_x * kMillimetresPerMicron).c_str());
    measures->putAndInsertString(DCM_SliceThickness, "0.001");
  }
  if (one_optical_path) {  // otherwise each frame's path follows from its place (TILED_FULL) or its own group
    DcmItem* path_item = nullptr;
    shared->findOrCreateSequenceItem(DCM_OpticalPathIdentificationSequence, path_item, -2);
    path_item->putAndInsertString(DCM_OpticalPathIdentifier, "1");
  }
}

void save(DcmFileFormat& file, E_TransferSyntax xfer, const fs::path& path) {
  check(file.saveFile(path.c_str(), xfer, EET_ExplicitLength, EGL_recalcGL, EPD_noChange, 0, 0, EWM_createNewMeta),
        "save", path.string());
  core::sync_file(path.string());
}

}  // namespace

std::string derived_uid(const std::string& seed, const std::string& label) {
  const std::uint64_t high = core::fnv1a(seed + '\x1f' + label) | (std::uint64_t{1} << 63);  // no leading zero
  const std::uint64_t low = core::fnv1a(label + '\x1f' + seed + '\x1e');
  constexpr std::uint64_t kNineteenDigits = 10000000000000000000ULL;
  return fmt::format("2.25.{}{:019d}", high, low % kNineteenDigits);
}

void write_dicom_series(const std::string& tiff_path, const std::string& folder, const DicomWriterOptions& options) {
  const Slide slide = Slide::open(tiff_path);
  std::vector<TiffLevelSize> sizes;
  for (const auto& l : slide.levels()) sizes.push_back({l.width, l.height});
  std::string why_not;
  const auto tiles = TiffTileReader::open(tiff_path, sizes, false, why_not);
  if (tiles == nullptr) throw core::InputError("cannot convert to DICOM: " + why_not, tiff_path);
  const bool jpeg = options.syntax == DicomTransferSyntax::jpeg_baseline;
  const E_TransferSyntax xfer = jpeg                                                     ? EXS_JPEGProcess1
                                : options.syntax == DicomTransferSyntax::explicit_little ? EXS_LittleEndianExplicit
                                                                                         : EXS_LittleEndianImplicit;
  if (options.fragments_per_frame < 1) throw core::InternalError("DICOM writer: fragments_per_frame < 1");
  if (options.extended_offset_table && (!jpeg || options.fragments_per_frame != 1 || options.offset_table)) {
    throw core::InternalError("DICOM writer: an Extended Offset Table needs JPEG frames of one fragment each");
  }
  if (options.optical_paths < 1 || options.focal_planes < 1 ||
      ((options.optical_paths > 1 || options.focal_planes > 1) && jpeg)) {
    throw core::InternalError("DICOM writer: several optical paths or focal planes need an uncompressed syntax");
  }
  const int paths = options.optical_paths;
  const int planes = options.focal_planes;
  constexpr double kPlaneDistanceMm = 0.001;

  Common common;
  common.study = derived_uid(options.uid_seed, "study");
  common.series = derived_uid(options.uid_seed, "series");
  common.frame_of_reference = derived_uid(options.uid_seed, "frame of reference");
  common.software = slide.property("tiff.Software").value_or("Tessera");
  common.mpp_x = slide.mpp();
  common.mpp_y = slide.mpp_y();
  common.width0 = slide.width();
  common.height0 = slide.height();

  const fs::path target(folder);
  const fs::path temporary(core::temporary_name(folder));
  std::error_code ec;
  fs::remove_all(temporary, ec);
  fs::create_directories(temporary, ec);
  if (ec) throw core::InternalError(fmt::format("cannot create '{}': {}", temporary.string(), ec.message()));
  try {
    RawTiff raw(tiff_path);
    for (int level = 0; level < slide.level_count(); ++level) {
      const SlideLevel& l = slide.level(level);
      const fs::path file = temporary / fmt::format("level-{}.dcm", level);
      if (TIFFSetDirectory(raw.tif, static_cast<tdir_t>(tiles->directory(level))) != 1) {
        throw core::InputError(fmt::format("cannot read TIFF directory of level {}", level), tiff_path);
      }
      std::uint32_t tw = 0;
      std::uint32_t th = 0;
      std::uint16_t compression = 0;
      TIFFGetField(raw.tif, TIFFTAG_TILEWIDTH, &tw);
      TIFFGetField(raw.tif, TIFFTAG_TILELENGTH, &th);
      TIFFGetFieldDefaulted(raw.tif, TIFFTAG_COMPRESSION, &compression);
      if (jpeg && compression != COMPRESSION_JPEG) {
        throw core::InputError(fmt::format("level {} has no JPEG tiles to copy into JPEG Baseline frames", level),
                               tiff_path);
      }
      const std::int64_t across = (l.width + tw - 1) / tw;
      const std::int64_t down = (l.height + th - 1) / th;
      std::vector<std::int64_t> tiles_stored;
      for (std::int64_t t = 0; t < across * down; ++t) {
        if (options.sparse && options.omit_tiles.count({level, t}) != 0) continue;
        tiles_stored.push_back(t);
      }
      if (options.sparse) std::reverse(tiles_stored.begin(), tiles_stored.end());
      struct Stored {
        std::int64_t t;  // tile index
        int p;           // optical path index
        int z;           // focal plane index
      };
      std::vector<Stored> order;  // frames in storage order
      if (options.sparse) {
        for (const std::int64_t t : tiles_stored) {
          for (int p = paths - 1; p >= 0; --p) {
            for (int z = 0; z < planes; ++z) order.push_back({t, p, z});
          }
        }
      } else {
        for (int p = 0; p < paths; ++p) {
          for (int z = 0; z < planes; ++z) {
            for (const std::int64_t t : tiles_stored) order.push_back({t, p, z});
          }
        }
      }

      DcmFileFormat dicom;
      DcmDataset* ds = dicom.getDataset();
      put_common(ds, common, derived_uid(options.uid_seed, fmt::format("level {}", level)),
                 level == 0 ? "ORIGINAL\\PRIMARY\\VOLUME\\NONE" : "DERIVED\\PRIMARY\\VOLUME\\RESAMPLED", file.string(),
                 paths, planes, options.icc_profile);
      ds->putAndInsertString(DCM_InstanceNumber, std::to_string(level + 1).c_str());
      const std::string photometric = jpeg ? options.jpeg_photometric : options.ybr_full_422 ? "YBR_FULL_422" : "RGB";
      put_image(ds, static_cast<int>(th), static_cast<int>(tw), static_cast<std::int64_t>(order.size()), l.width,
                l.height, photometric, jpeg, common.mpp_x * l.downsample, common.mpp_y * l.downsample,
                options.pixel_spacing, file.string(), paths == 1);
      ds->putAndInsertString(DCM_DimensionOrganizationType, options.sparse ? "TILED_SPARSE" : "TILED_FULL");
      if (options.sparse) {
        for (const auto& [t, p, z] : order) {
          DcmItem* group = nullptr;
          ds->findOrCreateSequenceItem(DCM_PerFrameFunctionalGroupsSequence, group, -2);
          if (paths > 1) {
            DcmItem* path_item = nullptr;
            group->findOrCreateSequenceItem(DCM_OpticalPathIdentificationSequence, path_item, -2);
            path_item->putAndInsertString(DCM_OpticalPathIdentifier, std::to_string(p + 1).c_str());
          }
          DcmItem* position = nullptr;
          group->findOrCreateSequenceItem(DCM_PlanePositionSlideSequence, position, -2);
          const std::int64_t x = t % across * tw;
          const std::int64_t y = t / across * th;
          position->putAndInsertSint32(DCM_ColumnPositionInTotalImagePixelMatrix, static_cast<Sint32>(x + 1));
          position->putAndInsertSint32(DCM_RowPositionInTotalImagePixelMatrix, static_cast<Sint32>(y + 1));
          const double level_mpp = common.mpp_x * l.downsample;
          position->putAndInsertString(DCM_XOffsetInSlideCoordinateSystem,
                                       fmt::format("{:.6f}", y * level_mpp * kMillimetresPerMicron).c_str());
          position->putAndInsertString(DCM_YOffsetInSlideCoordinateSystem,
                                       fmt::format("{:.6f}", x * level_mpp * kMillimetresPerMicron).c_str());
          position->putAndInsertString(DCM_ZOffsetInSlideCoordinateSystem,
                                       fmt::format("{:.6f}", z * kPlaneDistanceMm).c_str());
        }
      }

      if (jpeg) {
        const std::uint8_t* tables = nullptr;
        std::uint32_t table_bytes = 0;
        void* table_pointer = nullptr;
        if (TIFFGetField(raw.tif, TIFFTAG_JPEGTABLES, &table_bytes, &table_pointer) == 1) {
          tables = static_cast<const std::uint8_t*>(table_pointer);
        }
        auto sequence = std::make_unique<DcmPixelSequence>(DCM_PixelSequenceTag);
        auto* table_item = new DcmPixelItem(DCM_PixelItemTag);
        sequence->insert(table_item);
        DcmOffsetList offsets;
        std::vector<Uint64> frame_offsets;  // Extended Offset Table: each frame's first item, from the first fragment
        std::vector<Uint64> frame_lengths;
        Uint64 position = 0;
        for (const Stored& stored : order) {  // one optical path and focal plane (checked above)
          const std::int64_t t = stored.t;
          const tmsize_t size = TIFFGetStrileByteCount(raw.tif, static_cast<std::uint32_t>(t));
          std::vector<std::uint8_t> tile(static_cast<std::size_t>(size));
          if (size <= 0 || TIFFReadRawTile(raw.tif, static_cast<std::uint32_t>(t), tile.data(), size) != size) {
            throw core::InputError(fmt::format("cannot read raw tile {} of level {}", t, level), tiff_path);
          }
          std::vector<std::uint8_t> frame = full_jpeg(tile, tables, table_bytes);
          if (frame.size() % 2 != 0) frame.push_back(0);  // items have even lengths; decoders stop at EOI
          const std::size_t parts = static_cast<std::size_t>(options.fragments_per_frame);
          const std::size_t step = (frame.size() / parts + 1) / 2 * 2;
          Uint32 encoded = 0;
          for (std::size_t begin = 0; begin < frame.size(); begin += step) {
            const std::size_t end = std::min(frame.size(), begin + step);
            auto* item = new DcmPixelItem(DCM_PixelItemTag);
            item->putUint8Array(frame.data() + begin, static_cast<Uint32>(end - begin));
            sequence->insert(item);
            encoded += static_cast<Uint32>(end - begin) + 8;
          }
          offsets.push_back(encoded);
          frame_offsets.push_back(position);
          frame_lengths.push_back(frame.size());
          position += encoded;
        }
        if (options.offset_table) check(table_item->createOffsetTable(offsets), "offset table", file.string());
        if (options.extended_offset_table) {
          for (const auto& [tag, values] : {std::pair{DCM_ExtendedOffsetTable, &frame_offsets},
                                            std::pair{DCM_ExtendedOffsetTableLengths, &frame_lengths}}) {
            auto element = std::make_unique<DcmOther64bitVeryLong>(DcmTag(tag));
            check(element->putUint64Array(values->data(), static_cast<unsigned long>(values->size())),
                  "extended offset table", file.string());
            check(ds->insert(element.release(), true), "extended offset table", file.string());
          }
        }
        auto* pixels = new DcmPixelData(DCM_PixelData);
        pixels->putOriginalRepresentation(xfer, nullptr, sequence.release());
        check(ds->insert(pixels, true), "pixel data", file.string());
      } else {
        std::vector<std::uint8_t> bytes;
        for (const auto& [t, p, z] : order) {
          cv::Mat rgb =
              tiles->read(level, t % across * tw, t / across * th, static_cast<int>(tw), static_cast<int>(th));
          if (p > 0 || z > 0) rgb = ~rgb;  // another optical path or focal plane: the inverse
          if (options.ybr_full_422) {
            append_ybr_422(rgb, bytes);
          } else {
            bytes.insert(bytes.end(), rgb.data, rgb.data + rgb.total() * rgb.elemSize());
          }
        }
        check(ds->putAndInsertUint8Array(DCM_PixelData, bytes.data(), static_cast<unsigned long>(bytes.size())),
              "pixel data", file.string());
      }
      save(dicom, xfer, file);
    }

    // Associated images, uncompressed RGB in one frame.
    const std::vector<std::pair<std::string, std::string>> kinds = {
        {"label", "LABEL"}, {"macro", "OVERVIEW"}, {"thumbnail", "THUMBNAIL"}};
    for (const auto& a : slide.associated_images()) {
      const auto kind = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == a.name; });
      if (kind == kinds.end()) continue;
      const cv::Mat rgb = slide.read_associated_image(a.name);
      const fs::path file = temporary / (a.name + ".dcm");
      DcmFileFormat dicom;
      DcmDataset* ds = dicom.getDataset();
      put_common(ds, common, derived_uid(options.uid_seed, a.name), "ORIGINAL\\PRIMARY\\" + kind->second + "\\NONE",
                 file.string());
      put_image(ds, rgb.rows, rgb.cols, 1, rgb.cols, rgb.rows, "RGB", false, common.mpp_x, common.mpp_y, false,
                file.string());
      ds->putAndInsertString(DCM_DimensionOrganizationType, "TILED_FULL");
      check(
          ds->putAndInsertUint8Array(DCM_PixelData, rgb.data, static_cast<unsigned long>(rgb.total() * rgb.elemSize())),
          "pixel data", file.string());
      save(dicom, EXS_LittleEndianExplicit, file);
    }
    fs::remove_all(target, ec);
    fs::rename(temporary, target, ec);
    if (ec)
      throw core::InternalError(
          fmt::format("cannot rename '{}' to '{}': {}", temporary.string(), folder, ec.message()));
    core::sync_folder_of(folder);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(temporary, ignored);
    throw;
  }
}

}  // namespace tessera::io
