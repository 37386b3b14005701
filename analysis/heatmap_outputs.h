// The per-slide outputs of `tessera infer` (docs/ARCHITECTURE.md "Inference outputs"), made from a probability map
// (io::Heatmap) and its regions and detections (analysis/regions.h). One registry lists them; each
// output is written atomically (temporary name, then rename), so a reader never sees half a file.
//
//   name            file                        what
//   heatmap.h5      <slide>.heatmap.h5          the map and its geometry (io::write_heatmap)
//   overlay.png     <slide>.overlay.png         thumbnail + colour-mapped probabilities, outlines, legend, scale bar
//   heatmap.tif     <slide>.heatmap.tif         pyramidal TIFF of the map at the slide's size (io::write_heatmap_tiff)
//   geojson         <slide>.geojson             QuPath: regions as "Tumor" annotations with measurements, and
//                                               optionally every scored tile as a detection with `tumor_prob`
//   xml             <slide>.xml                 ASAP: regions as polygons in group "Tumor" (holes as "_2")
//   detections.csv  <slide>.detections.csv      CAMELYON16: one `prob,X,Y` line per detection, no header, level-0
//                                               integer coordinates, as the challenge's evaluation script reads it
//   report.json     <slide>.report.json         areas, slide score, regions with size class (see report_json())
//
// These live in preprocessing/ rather than io/ because they take Region and Detection (the analysis); the file
// formats themselves are io's writers (io::write_geojson, io::write_asap_xml, io::TiffWriter, io::write_png).
//
//   analysis::SlideResult result = analysis::analyse_heatmap(heatmap, options);   // regions + detections
//   result.thumbnail = slide.thumbnail(options.overlay.max_side);
//   result.tissue_area_mm2 = tissue.tissue_area_mm2();
//   analysis::write_slide_outputs(output_dir, result, options);
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <opencv2/core.hpp>

#include "analysis/regions.h"
#include "core/config.h"
#include "io/dicom_seg.h"
#include "io/heatmap.h"
#include "io/provenance.h"

namespace tessera::analysis {

struct OverlayOptions {
  io::Colormap colormap = io::Colormap::inferno;
  // Opacity of the colour over the slide grows linearly with P, from min_alpha at P = 0 to max_alpha at P = 1:
  // tissue the model calls normal stays readable, tumour stands out. Unscored cells are not painted.
  double min_alpha = 0.1;
  double max_alpha = 0.65;
  int max_side = 2048;  // longer side of the thumbnail to read for the overlay (used by the caller)
  int max_labels = 40;  // regions numbered on the picture, largest first (numbers as in report.json)
};

struct GeojsonOptions {
  // Every scored tile as a detection (footprint square) with measurement `tumor_prob`: QuPath's measurement
  // maps show it as a heatmap. About 250 bytes per tile (200k tiles of a CAMELYON16-size slide: 50 MB), written as
  // they are made: memory does not grow with them.
  bool tiles = true;
};

struct OutputOptions {
  RegionOptions regions;  // threshold of the regions (also marked on the overlay's legend)
  DetectionOptions detections;
  OverlayOptions overlay;
  io::HeatmapTiffOptions tiff;
  GeojsonOptions geojson;
  std::vector<std::string> outputs;  // registry names to write; empty = all but those written only when asked
  // `dicom-seg` (io/dicom_seg.h) is written only when asked: in `outputs`, or with `dicom_seg` (infer --dicom-seg).
  bool dicom_seg = false;
  io::DicomSegOptions seg;
};

// The output settings (outputs, overlay.*, geojson.*, detections.*), declared once for every job that writes these
// outputs; the region threshold is the job's own setting (infer.threshold).
core::Schema& declare_output_keys(core::Schema& schema);

// The output settings of `config` (checked against a schema with declare_output_keys) and the region `threshold`.
// ConfigError naming the key for an output name the registry does not know or a threshold that is not above 0.
OutputOptions read_output_options(const core::Config& config, double threshold, const std::string& threshold_key);

// What the slide quality-control stage (preprocessing/qc.h) found, as report.json and the overlay state it. Filled by
// the verb from prep::QcResult (analysis does not depend on preprocessing).
struct QcClassArea {
  std::string name;    // "blur", "pen_green", ...
  std::string action;  // "exclude" | "flag"
  double area_mm2 = 0.0;
  double tissue_fraction = 0.0;
};
struct QcOutcome {
  bool ran = false;
  std::vector<QcClassArea> classes;  // every class QC ran for
  std::vector<std::string> flags;    // slide-level flags
  double excluded_mm2 = 0.0;         // area of the excluded classes (their union)
  double flagged_mm2 = 0.0;          // area of the flagged classes (their union)
  std::int64_t excluded_cells = 0;   // grid cells on tissue not scored because of excluded artefacts
  double downsample = 1.0;           // level-0 pixels per mask pixel
  cv::Mat1b excluded, flagged;       // unions (255 = in)
  std::vector<std::pair<std::string, cv::Mat1b>> masks;  // per class with its action: "fold (exclude)"
  cv::Mat1w bits;  // the masks as <slide>.qc.png holds them (io/qc_masks.h), which infer writes; empty when QC was off
};

// The artefacts a region touches (its outline dilated by one mask pixel overlaps the class's mask), as "name
// (action)": a region next to or over an excluded area is kept and marked, never dropped.
std::vector<std::string> region_artefacts(const Region& region, const QcOutcome& qc);

// Everything the writers need for one slide.
struct SlideResult {
  io::Heatmap heatmap;
  std::vector<Region> regions;
  std::vector<Detection> detections;
  cv::Mat thumbnail;  // RGB whole-slide thumbnail for overlay.png; empty = a white background
  // From the tissue mask (prep::TissueMask::tissue_area_mm2()); NaN = estimated as the scored tiles' footprints.
  double tissue_area_mm2 = std::numeric_limits<double>::quiet_NaN();
  // What the model was trained on (the checkpoint's /meta, io/provenance.h), as report.json states it; nullopt = the
  // checkpoint records none (report.json: training_data "unknown").
  std::optional<io::TrainingProvenance> training;
  // What report.json ("caution") and the overlay (a line under the title, and the PNG's "Warning" text) must say
  // about the scores: io::model_caution(), e.g. io::kSyntheticModelCaution; "" = nothing.
  std::string caution;
  QcOutcome qc;  // qc.ran false: QC was off
};

// Regions and detections of `heatmap` with options.regions and options.detections.
SlideResult analyse_heatmap(io::Heatmap heatmap, const OutputOptions& options);

// ---------------------------------------------------------------------------------------------------------
// overlay.png
//
// The canvas: a title band (slide id, slide score, regions per size class) above the thumbnail, which is drawn
// unscaled at `image`, and a legend band below it (colour bar 0..1 with ticks and the threshold marked, the
// outline's meaning, a scale bar of a round length in mm). Narrow thumbnails are centred on a wider canvas so
// the legend fits. With a caution (SlideResult::caution), a band under the title states it in red, across the
// canvas, and the PNG carries it as its "Warning" text (io::write_png).
struct OverlayLayout {
  cv::Size canvas;
  cv::Rect image;    // where the thumbnail is, on the canvas
  cv::Rect caution;  // the caution's band; empty without a caution
};
OverlayLayout overlay_layout(cv::Size thumbnail, bool caution = false);

// The opacity of probability p's colour over the slide: min_alpha at p = 0 growing linearly to max_alpha at p = 1
// (OverlayOptions). overlay.png blends with it; the viewer's heatmap tiles carry it as their alpha.
double overlay_alpha(double p, const OverlayOptions& overlay);

// The map as an RGBA picture (CV_8UC4, R-G-B-A order) of `size` pixels, pixel (x, y) covering the level-0 square
// [x0 + x·scale, +scale) × [y0 + y·scale, +scale): each pixel takes the cell whose footprint holds its centre
// (io::cell_columns, as heatmap.tif and overlay.png), coloured by overlay.colormap with alpha
// round(255·overlay_alpha(p)). Unscored cells, cells with p < min_prob and pixels outside the grid are fully
// transparent. The viewer's heatmap tiles (viewer/tiles.h).
cv::Mat render_map_rgba(const io::Heatmap& heatmap, double x0, double y0, double scale, cv::Size size,
                        const OverlayOptions& overlay, double min_prob = 0.0);

// `thumbnail`: RGB CV_8UC3 of the whole slide (any size; its pixels are slide_width / cols level-0 pixels wide).
// With `qc` (ran), the excluded areas are outlined in grey and the flagged ones in amber, and the PNG's "QC" text
// states their areas.
cv::Mat render_overlay(const io::Heatmap& heatmap, const std::vector<Region>& regions, const cv::Mat& thumbnail,
                       const OutputOptions& options, const std::string& caution = "", const QcOutcome* qc = nullptr);
void write_overlay_png(const std::string& path, const io::Heatmap& heatmap, const std::vector<Region>& regions,
                       const cv::Mat& thumbnail, const OutputOptions& options, const std::string& caution = "",
                       const QcOutcome* qc = nullptr);

// ---------------------------------------------------------------------------------------------------------
// Viewer annotations, detections, report

// QuPath FeatureCollection: one "Tumor" annotation per region (Polygon with holes; name "Region <id>: <size
// class>"; measurements "Area mm^2", "Longest diameter µm", "Max probability", "Mean probability", "Tiles"),
// then (options.geojson.tiles) one detection per scored tile with measurement "tumor_prob".
void write_regions_geojson(const std::string& path, const io::Heatmap& heatmap, const std::vector<Region>& regions,
                           const OutputOptions& options);
// ASAP XML: one Polygon per region in group "Tumor"; holes become "_2" polygons (CAMELYON's non-tumour inside
// tumour), so io::read_asap_xml and `tessera tile` read the regions back as tumour.
void write_regions_asap(const std::string& path, const std::vector<Region>& regions);

// The report (keys): format "tessera-report", version, slide {id, path, width, height, mpp}, model {checkpoint,
// tile_mpp, tile_um (side of a tile), tile_level0_px, step_level0_px, training_data ("synthetic", "real", "mixed",
// "unknown"), training_slides ({synthetic, real, unknown} counts, null when not recorded), training_shards (null
// when not recorded)}, caution (SlideResult::caution, null when none), threshold, slide_score (the maximum tile
// probability, null when no tissue was scored) with slide_score_definition, scored_tiles, tissue_area_mm2 and
// tissue_area_source
// ("tissue mask" | "scored tiles"), tumour_area_mm2 (sum of the regions), tumour_fraction_of_tissue,
// largest_size_class ("none" when there is no region), regions_per_size_class {isolated_tumour_cells,
// micrometastasis, macrometastasis}, size_class_rule, detections (count), regions [{id, size_class, area_mm2,
// longest_diameter_um, max_prob, mean_prob, tiles, centroid [x, y], peak [x, y], bounds [x, y, w, h], artefacts
// [region_artefacts()]}] with level-0 coordinates, and qc (null when QC was off): {flags, excluded_area_mm2,
// flagged_area_mm2, excluded_cells, classes [{name, action, area_mm2, tissue_fraction}]}.
std::string report_json(const SlideResult& result, const OutputOptions& options);
void write_report_json(const std::string& path, const SlideResult& result, const OutputOptions& options);

// ---------------------------------------------------------------------------------------------------------
// The registry

struct OutputWriter {
  const char* name;    // as in OutputOptions::outputs
  const char* suffix;  // file name is "<slide id>.<suffix>"
  void (*write)(const std::string& path, const SlideResult& result, const OutputOptions& options);
  bool only_when_asked = false;  // not part of "every output" (an empty `outputs`)
};

// Every writer, in the order write_slide_outputs() runs them.
const std::vector<OutputWriter>& output_writers();
// nullptr when `name` is not a writer's name.
const OutputWriter* find_output_writer(const std::string& name);
std::string output_writer_names();  // "heatmap.h5, overlay.png, ..." for error messages

// Writes the selected outputs of one slide into `directory` (which must exist) as "<slide id>.<suffix>", in
// registry order, and returns their paths. An error names the output and the slide (context "output", "slide"); outputs
// written before it stay (each is complete). InternalError listing the known names for an unknown name in
// options.outputs.
// `seconds` (optional) gets each written output's name and wall seconds, in that order.
std::vector<std::string> write_slide_outputs(const std::string& directory, const SlideResult& result,
                                             const OutputOptions& options,
                                             std::vector<std::pair<std::string, double>>* seconds = nullptr);

}  // namespace tessera::analysis
