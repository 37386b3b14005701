#include "io/dicom_seg.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <sstream>
#include <vector>

#include <dcmtk/config/osconfig.h>  // first of DCMTK's headers
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcuid.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/hash.h"
#include "io/dicom_writer.h"

namespace tessera::io {
namespace {

constexpr int kMaxFrameSide = 256;
constexpr double kMillimetresPerMicron = 0.001;
constexpr int kFractionalMax = 255;

void check(const OFCondition& status, const std::string& what, const std::string& path) {
  if (status.bad()) {
    throw core::InternalError(
        fmt::format("cannot write the DICOM Segmentation ({}): {}; file '{}'", what, status.text(), path));
  }
}

std::vector<double> numbers(const std::string& text) {
  std::vector<double> values;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, '\\');) {
    try {
      values.push_back(std::stod(part));
    } catch (const std::exception&) {
      return {};
    }
  }
  return values;
}

void put_code(DcmItem* parent, const DcmTagKey& sequence, const std::string& value, const std::string& scheme,
              const std::string& meaning) {
  DcmItem* code = nullptr;
  parent->findOrCreateSequenceItem(sequence, code, -2);
  code->putAndInsertString(DCM_CodeValue, value.c_str());
  code->putAndInsertString(DCM_CodingSchemeDesignator, scheme.c_str());
  code->putAndInsertString(DCM_CodeMeaning, meaning.c_str());
}

// DS values: at most 16 characters.
std::string ds(double value) {
  std::string text = fmt::format("{:.10g}", value);
  if (text.size() > 16) text = fmt::format("{:.8g}", value);
  return text;
}

}  // namespace

std::vector<std::string> write_dicom_seg(const std::string& path, const Heatmap& heatmap, const Slide& slide,
                                         const DicomSegOptions& options) {
  if (!slide.is_dicom()) {
    throw core::InputError(
        fmt::format("dicom-seg: a DICOM Segmentation must reference DICOM source images, and this slide is not DICOM "
                    "(vendor {})",
                    slide.vendor()),
        slide.path());
  }
  if (heatmap.rows <= 0 || heatmap.cols <= 0) {
    throw core::InputError("dicom-seg: the heatmap has no cells", slide.path());
  }
  std::vector<std::string> notes;
  const auto property = [&](const std::string& name) { return slide.property(name).value_or(""); };
  const std::string level0 = property("dicom.level[0].path");
  DcmFileFormat source;
  if (source.loadFile(level0.c_str(), EXS_Unknown, EGL_noChange, 4096).bad()) {
    throw core::InputError("dicom-seg: cannot read the source's level 0 again", level0);
  }
  DcmDataset* src = source.getDataset();

  DcmFileFormat file;
  DcmDataset* seg = file.getDataset();
  const auto copy = [&](const DcmTagKey& tag) {
    DcmElement* element = nullptr;
    if (src->findAndGetElement(tag, element).good() && element != nullptr) {
      seg->insert(dynamic_cast<DcmElement*>(element->clone()), true);
    } else {
      seg->insertEmptyElement(tag);  // Type 2: present, empty
    }
  };
  for (const DcmTagKey& tag : {DCM_PatientName, DCM_PatientID, DCM_PatientBirthDate, DCM_PatientSex, DCM_StudyDate,
                               DCM_StudyTime, DCM_ReferringPhysicianName, DCM_StudyID, DCM_AccessionNumber}) {
    copy(tag);
  }
  const std::string series_uid = property("dicom.series-uid");
  const std::string map_hash =
      fmt::format("{:016x}", core::fnv1a(heatmap.prob.data(), heatmap.prob.size() * sizeof(float)));
  const std::string seed = series_uid + "|" + heatmap.checkpoint + "|" + map_hash;
  const auto put = [&](const DcmTagKey& tag, const std::string& value) {
    check(seg->putAndInsertString(tag, value.c_str()), "attribute", path);
  };
  put(DCM_SOPClassUID, UID_SegmentationStorage);
  put(DCM_SOPInstanceUID, derived_uid(seed, "segmentation instance"));
  put(DCM_StudyInstanceUID, property("dicom.study-uid"));
  put(DCM_SeriesInstanceUID, derived_uid(seed, "segmentation series"));
  put(DCM_Modality, "SEG");
  put(DCM_SeriesNumber, "100");
  put(DCM_InstanceNumber, "1");
  put(DCM_SeriesDescription, "Tessera tumour probability");
  put(DCM_FrameOfReferenceUID, property("dicom.frame-of-reference-uid"));
  put(DCM_PositionReferenceIndicator, "SLIDE_CORNER");
  put(DCM_Manufacturer, "Tessera");
  put(DCM_ManufacturerModelName, "tessera infer");
  put(DCM_DeviceSerialNumber, "1");
  put(DCM_SoftwareVersions, "Tessera");
  {
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    std::array<char, 16> date{};
    std::array<char, 16> time{};
    std::strftime(date.data(), date.size(), "%Y%m%d", &utc);
    std::strftime(time.data(), time.size(), "%H%M%S", &utc);
    put(DCM_ContentDate, date.data());
    put(DCM_ContentTime, time.data());
  }
  put(DCM_ImageType, "DERIVED\\PRIMARY");
  put(DCM_ContentLabel, "TUMOUR_PROB");
  put(DCM_ContentDescription, "P(tumour) per heatmap cell, x 255");
  put(DCM_ContentCreatorName, "");
  put(DCM_SegmentationType, "FRACTIONAL");
  put(DCM_SegmentationFractionalType, "PROBABILITY");
  check(seg->putAndInsertUint16(DCM_MaximumFractionalValue, kFractionalMax), "attribute", path);
  put(DCM_LossyImageCompression, "00");
  // The Specimen module (the imaging subject is a specimen): the source's, else a minimal one, noted.
  bool specimen_made = false;
  for (const DcmTagKey& tag : {DCM_ContainerIdentifier, DCM_IssuerOfTheContainerIdentifierSequence,
                               DCM_ContainerTypeCodeSequence, DCM_SpecimenDescriptionSequence}) {
    DcmElement* element = nullptr;
    if (src->findAndGetElement(tag, element).good() && element != nullptr && element->getLength() > 0) {
      seg->insert(dynamic_cast<DcmElement*>(element->clone()), true);
      continue;
    }
    specimen_made = true;
    if (tag == DCM_ContainerIdentifier) {
      put(DCM_ContainerIdentifier, slide.id().substr(0, 64));
    } else if (tag == DCM_SpecimenDescriptionSequence) {
      DcmItem* specimen = nullptr;
      seg->findOrCreateSequenceItem(DCM_SpecimenDescriptionSequence, specimen, -2);
      specimen->putAndInsertString(DCM_SpecimenIdentifier, slide.id().substr(0, 64).c_str());
      specimen->putAndInsertString(DCM_SpecimenUID, derived_uid(series_uid, "specimen").c_str());
      specimen->insertEmptyElement(DCM_IssuerOfTheSpecimenIdentifierSequence);
      specimen->insertEmptyElement(DCM_SpecimenPreparationSequence);
    } else {
      seg->insertEmptyElement(tag);
    }
  }
  if (specimen_made)
    notes.push_back("the source has no complete Specimen module: the slide id stands for the container and specimen");

  // The segment.
  DcmItem* segment = nullptr;
  seg->findOrCreateSequenceItem(DCM_SegmentSequence, segment, -2);
  segment->putAndInsertUint16(DCM_SegmentNumber, 1);
  segment->putAndInsertString(DCM_SegmentLabel, options.segment_label.c_str());
  segment->putAndInsertString(DCM_SegmentAlgorithmType, "AUTOMATIC");
  segment->putAndInsertString(DCM_SegmentAlgorithmName, "Tessera");
  put_code(segment, DCM_SegmentedPropertyCategoryCodeSequence, options.category_code, options.category_scheme,
           options.category_meaning);
  put_code(segment, DCM_SegmentedPropertyTypeCodeSequence, options.type_code, options.type_scheme,
           options.type_meaning);
  DcmItem* algorithm = nullptr;
  segment->findOrCreateSequenceItem(DCM_SegmentationAlgorithmIdentificationSequence, algorithm, -2);
  put_code(algorithm, DCM_AlgorithmFamilyCodeSequence, "123110", "DCM", "Artificial Intelligence");
  algorithm->putAndInsertString(DCM_AlgorithmName, "Tessera");
  algorithm->putAndInsertString(DCM_AlgorithmVersion, "1");

  // The source referenced.
  const std::string sop_class = UID_VLWholeSlideMicroscopyImageStorage;
  std::vector<std::string> instances;
  {
    std::stringstream in(property("dicom.sop-instance-uids"));
    for (std::string uid; std::getline(in, uid, '\\');) instances.push_back(uid);
  }
  DcmItem* series = nullptr;
  seg->findOrCreateSequenceItem(DCM_ReferencedSeriesSequence, series, -2);
  series->putAndInsertString(DCM_SeriesInstanceUID, series_uid.c_str());
  for (const auto& uid : instances) {
    DcmItem* instance = nullptr;
    series->findOrCreateSequenceItem(DCM_ReferencedInstanceSequence, instance, -2);
    instance->putAndInsertString(DCM_ReferencedSOPClassUID, sop_class.c_str());
    instance->putAndInsertString(DCM_ReferencedSOPInstanceUID, uid.c_str());
  }
  DcmItem* source_image = nullptr;
  seg->findOrCreateSequenceItem(DCM_SourceImageSequence, source_image, -2);
  source_image->putAndInsertString(DCM_ReferencedSOPClassUID, sop_class.c_str());
  source_image->putAndInsertString(DCM_ReferencedSOPInstanceUID, instances.empty() ? "" : instances.front().c_str());

  // Geometry.
  std::vector<double> orientation = numbers(property("dicom.image-orientation-slide"));
  if (orientation.size() != 6) {
    orientation = {0, -1, 0, -1, 0, 0};
    notes.push_back("the source has no Image Orientation (Slide): 0\\-1\\0\\-1\\0\\0 assumed");
  }
  double origin_x = 0.0;
  double origin_y = 0.0;
  const auto x0 = numbers(property("dicom.origin-x-mm"));
  const auto y0 = numbers(property("dicom.origin-y-mm"));
  if (x0.size() == 1 && y0.size() == 1) {
    origin_x = x0.front();
    origin_y = y0.front();
  } else {
    notes.push_back("the source has no Total Pixel Matrix Origin: (0, 0) mm assumed");
  }
  const double mx = slide.mpp() * kMillimetresPerMicron;
  const double my = slide.mpp_y() * kMillimetresPerMicron;
  // Slide coordinates (mm) of level-0 position (px, py).
  const auto slide_x = [&](double px, double py) {
    return origin_x + px * mx * orientation[0] + py * my * orientation[3];
  };
  const auto slide_y = [&](double px, double py) {
    return origin_y + px * mx * orientation[1] + py * my * orientation[4];
  };
  const cv::Rect2d first = cell_footprint(heatmap, 0, 0);
  const double step = static_cast<double>(heatmap.step);
  std::string orientation_text;
  for (std::size_t k = 0; k < orientation.size(); ++k) {
    if (k > 0) orientation_text += '\\';
    orientation_text += ds(orientation[k]);
  }
  put(DCM_ImageOrientationSlide, orientation_text);
  DcmItem* origin = nullptr;
  seg->findOrCreateSequenceItem(DCM_TotalPixelMatrixOriginSequence, origin, -2);
  origin->putAndInsertString(DCM_XOffsetInSlideCoordinateSystem, ds(slide_x(first.x, first.y)).c_str());
  origin->putAndInsertString(DCM_YOffsetInSlideCoordinateSystem, ds(slide_y(first.x, first.y)).c_str());

  const int side_x = std::min(kMaxFrameSide, heatmap.cols);
  const int side_y = std::min(kMaxFrameSide, heatmap.rows);
  const int across = (heatmap.cols + side_x - 1) / side_x;
  const int down = (heatmap.rows + side_y - 1) / side_y;
  check(seg->putAndInsertUint16(DCM_Rows, static_cast<Uint16>(side_y)), "attribute", path);
  check(seg->putAndInsertUint16(DCM_Columns, static_cast<Uint16>(side_x)), "attribute", path);
  seg->putAndInsertUint16(DCM_SamplesPerPixel, 1);
  put(DCM_PhotometricInterpretation, "MONOCHROME2");
  seg->putAndInsertUint16(DCM_BitsAllocated, 8);
  seg->putAndInsertUint16(DCM_BitsStored, 8);
  seg->putAndInsertUint16(DCM_HighBit, 7);
  seg->putAndInsertUint16(DCM_PixelRepresentation, 0);
  put(DCM_NumberOfFrames, std::to_string(across * down));
  seg->putAndInsertUint32(DCM_TotalPixelMatrixColumns, static_cast<Uint32>(heatmap.cols));
  seg->putAndInsertUint32(DCM_TotalPixelMatrixRows, static_cast<Uint32>(heatmap.rows));
  put(DCM_SegmentsOverlap, "NO");

  DcmItem* shared = nullptr;
  seg->findOrCreateSequenceItem(DCM_SharedFunctionalGroupsSequence, shared, -2);
  DcmItem* measures = nullptr;
  shared->findOrCreateSequenceItem(DCM_PixelMeasuresSequence, measures, -2);
  measures->putAndInsertString(DCM_PixelSpacing, (ds(step * my) + "\\" + ds(step * mx)).c_str());
  measures->putAndInsertString(DCM_SliceThickness, "0.001");
  DcmItem* identification = nullptr;
  shared->findOrCreateSequenceItem(DCM_SegmentIdentificationSequence, identification, -2);
  identification->putAndInsertUint16(DCM_ReferencedSegmentNumber, 1);

  // Dimensions: segment, then column and row of the frame in the total pixel matrix.
  const std::string dimension_uid = derived_uid(seed, "dimension organisation");
  DcmItem* organisation = nullptr;
  seg->findOrCreateSequenceItem(DCM_DimensionOrganizationSequence, organisation, -2);
  organisation->putAndInsertString(DCM_DimensionOrganizationUID, dimension_uid.c_str());
  const std::array<std::pair<DcmTagKey, DcmTagKey>, 3> dimensions = {
      std::pair{DCM_ReferencedSegmentNumber, DCM_SegmentIdentificationSequence},
      std::pair{DCM_ColumnPositionInTotalImagePixelMatrix, DCM_PlanePositionSlideSequence},
      std::pair{DCM_RowPositionInTotalImagePixelMatrix, DCM_PlanePositionSlideSequence}};
  for (const auto& [pointer, group] : dimensions) {
    DcmItem* index = nullptr;
    seg->findOrCreateSequenceItem(DCM_DimensionIndexSequence, index, -2);
    index->putAndInsertString(DCM_DimensionOrganizationUID, dimension_uid.c_str());
    index->putAndInsertTagKey(DCM_DimensionIndexPointer, pointer);
    index->putAndInsertTagKey(DCM_FunctionalGroupPointer, group);
  }
  put(DCM_DimensionOrganizationType, "TILED_SPARSE");

  std::vector<Uint8> pixels;
  pixels.reserve(static_cast<std::size_t>(across) * down * side_x * side_y);
  for (int fy = 0; fy < down; ++fy) {
    for (int fx = 0; fx < across; ++fx) {
      DcmItem* frame = nullptr;
      seg->findOrCreateSequenceItem(DCM_PerFrameFunctionalGroupsSequence, frame, -2);
      // Derived from the source's level 0 (a slide-microscopy source: positions are in the slide's coordinates).
      DcmItem* derivation = nullptr;
      frame->findOrCreateSequenceItem(DCM_DerivationImageSequence, derivation, -2);
      DcmItem* derived_from = nullptr;
      derivation->findOrCreateSequenceItem(DCM_SourceImageSequence, derived_from, -2);
      derived_from->putAndInsertString(DCM_ReferencedSOPClassUID, sop_class.c_str());
      derived_from->putAndInsertString(DCM_ReferencedSOPInstanceUID,
                                       instances.empty() ? "" : instances.front().c_str());
      derived_from->putAndInsertString(DCM_SpatialLocationsPreserved, "YES");
      put_code(derived_from, DCM_PurposeOfReferenceCodeSequence, "121322", "DCM",
               "Source image for image processing operation");
      put_code(derivation, DCM_DerivationCodeSequence, "113076", "DCM", "Segmentation");
      DcmItem* content = nullptr;
      frame->findOrCreateSequenceItem(DCM_FrameContentSequence, content, -2);
      const std::string indices = fmt::format("1\\{}\\{}", fx + 1, fy + 1);
      content->putAndInsertString(DCM_DimensionIndexValues, indices.c_str());
      DcmItem* position = nullptr;
      frame->findOrCreateSequenceItem(DCM_PlanePositionSlideSequence, position, -2);
      const int column = fx * side_x;
      const int row = fy * side_y;
      position->putAndInsertSint32(DCM_ColumnPositionInTotalImagePixelMatrix, column + 1);
      position->putAndInsertSint32(DCM_RowPositionInTotalImagePixelMatrix, row + 1);
      const double px = first.x + column * step;
      const double py = first.y + row * step;
      position->putAndInsertString(DCM_XOffsetInSlideCoordinateSystem, ds(slide_x(px, py)).c_str());
      position->putAndInsertString(DCM_YOffsetInSlideCoordinateSystem, ds(slide_y(px, py)).c_str());
      position->putAndInsertString(DCM_ZOffsetInSlideCoordinateSystem, "0");
      for (int r = 0; r < side_y; ++r) {
        for (int c = 0; c < side_x; ++c) {
          const int i = row + r;
          const int j = column + c;
          double p = i < heatmap.rows && j < heatmap.cols ? heatmap.at(i, j) : 0.0;
          if (std::isnan(p)) p = 0.0;
          pixels.push_back(static_cast<Uint8>(std::lround(std::clamp(p, 0.0, 1.0) * kFractionalMax)));
        }
      }
    }
  }
  check(seg->putAndInsertUint8Array(DCM_PixelData, pixels.data(), static_cast<unsigned long>(pixels.size())),
        "pixel data", path);
  core::write_atomic(path, [&](const std::string& temporary) {
    check(file.saveFile(temporary.c_str(), EXS_LittleEndianExplicit), "save", temporary);
  });
  return notes;
}

}  // namespace tessera::io
