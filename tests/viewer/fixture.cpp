#include "tests/viewer/fixture.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "analysis/heatmap_outputs.h"
#include "io/annotations.h"
#include "io/qc_masks.h"
#include "tests/testing/testing.h"

namespace tessera::testing {
namespace fs = std::filesystem;

ViewFixture make_view_fixture(const std::string& dir) {
  ViewFixture f;
  f.dir = dir;
  fs::create_directories(fs::path(dir) / "slides");
  fs::create_directories(fs::path(dir) / "infer");
  f.infer_dir = (fs::path(dir) / "infer").string();
  f.slide_path = (fs::path(dir) / "slides" / (std::string(kViewSlideId) + ".tif")).string();
  io::TiffWriterOptions tiff;
  tiff.mpp = 0.5;
  write_pattern_slide(f.slide_path, 2048, 2048, tiff);

  io::Annotation truth;
  truth.name = "Tumour block";
  truth.group = "_0";
  truth.outer = {{1024, 512}, {1536, 512}, {1536, 1024}, {1024, 1024}};
  const std::string xml = (fs::path(dir) / "slides" / (std::string(kViewSlideId) + ".xml")).string();
  io::write_asap_xml(xml, {truth});
  f.dataset = (fs::path(dir) / "dataset.csv").string();
  std::ofstream(f.dataset) << "slide_id,slide,label,annotation,split\n"
                           << kViewSlideId << ",slides/" << kViewSlideId << ".tif,tumor,slides/" << kViewSlideId
                           << ".xml,test\n";

  io::Heatmap& h = f.heatmap;
  h.slide_id = kViewSlideId;
  h.slide_path = f.slide_path;
  h.slide_width = h.slide_height = 2048;
  h.slide_mpp = 0.5;
  h.tile_mpp = 2.0;
  h.tile = h.step = 256;
  h.rows = h.cols = 8;
  h.checkpoint = "model.h5";
  h.prob.assign(64, kViewNormalP);
  for (int j = 0; j < 8; ++j) h.prob[static_cast<std::size_t>(j)] = std::numeric_limits<float>::quiet_NaN();
  for (int i = 2; i <= 3; ++i) {
    for (int j = 4; j <= 5; ++j) h.prob[static_cast<std::size_t>(i * 8 + j)] = kViewTumourP;
  }
  analysis::OutputOptions out;
  out.outputs = {"heatmap.h5", "geojson", "report.json"};
  out.geojson.tiles = false;
  analysis::write_slide_outputs(f.infer_dir, analysis::analyse_heatmap(h, out), out);

  cv::Mat1w qc(256, 256, io::kQcTissueBit);
  constexpr std::uint16_t kPenGreen = 1u << 1, kBlur = 1u << 0;
  const auto mark = [&](const int (&area)[4], std::uint16_t bits) {
    qc(cv::Rect(area[0] / 8, area[1] / 8, area[2] / 8, area[3] / 8)).setTo(io::kQcTissueBit | bits);
  };
  mark(kViewQcExcluded, kPenGreen | io::kQcExcludedBit);
  mark(kViewQcFlagged, kBlur | io::kQcFlaggedBit);
  io::write_qc_masks_png((fs::path(f.infer_dir) / (std::string(kViewSlideId) + ".qc.png")).string(), qc);

  const nlohmann::json record = {
      {"slides", {{{"id", kViewSlideId}, {"slide", f.slide_path}}}},
      {"failures", {{{"id", kViewFailedId}, {"error", "broken_002.svs: corrupt slide: Not a TIFF file"}}}}};
  std::ofstream(fs::path(f.infer_dir) / "infer.json") << record.dump(2);
  std::ofstream(fs::path(f.infer_dir) / "infer.config.yaml")
      << "checkpoint: model.h5\ninput:\n  csv: " << f.dataset << "\noutput: " << f.infer_dir
      << "\ninfer:\n  threshold: 0.5\noverlay:\n  colormap: inferno\n";
  return f;
}

}  // namespace tessera::testing
