// tessera info SLIDE... — what a pathologist or an HPC admin checks before a job: vendor, whether tessera synth made
// the slide (io/provenance.h), pyramid, resolution and where it came from, objective power, associated images.
// Unreadable slides (including slides whose smallest level does not decode) are listed at the end and the rest are
// still shown. A slide that records no resolution is described all the same (levels, sizes, vendor), its resolution
// "unknown" with why and the setting that supplies one: the jobs refuse it until assume_mpp is set, and `info` is where
// one finds that out.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/cli.h"
#include "core/comm.h"
#include "core/error.h"
#include "io/slide.h"

namespace tessera::app {
namespace {

struct InfoOptions {
  std::vector<std::string> slides;
  bool json = false;
  double assume_mpp = 0.0;
};

std::string mpp_source_text(const io::Slide& slide) {
  switch (slide.mpp_source()) {
    case io::MppSource::openslide_property:
      return "from openslide.mpp-x";
    case io::MppSource::tiff_resolution:
      return "from the TIFF resolution tags";
    case io::MppSource::dicom:
      return "from the " + slide.property("dicom.mpp-origin").value_or("DICOM attributes");
    case io::MppSource::assumed:
      return "assumed (--assume-mpp), not in the slide";
    case io::MppSource::unknown:
      return "unknown";
  }
  return "";
}

// A slide's µm/px at one of its levels as text, "-" when the slide records no resolution.
std::string level_mpp_text(const io::Slide& slide, double downsample) {
  return slide.has_mpp() ? fmt::format("{:.4f}", slide.mpp() * downsample) : std::string("-");
}

std::string describe(const io::Slide& slide) {
  std::ostringstream out;
  out << fmt::format("{}\n", slide.path());
  out << fmt::format("  vendor       {}\n", slide.vendor());
  out << fmt::format("  reader       {}\n", slide.reader());
  out << fmt::format("  origin       {}\n",
                     slide.synthetic() ? "synthetic (made by tessera synth)" : "not made by tessera synth");
  if (slide.has_mpp()) {
    const double mm_w = static_cast<double>(slide.width()) * slide.mpp() / 1000.0;
    const double mm_h = static_cast<double>(slide.height()) * slide.mpp_y() / 1000.0;
    out << fmt::format("  size         {} x {} px ({:.2f} x {:.2f} mm)\n", slide.width(), slide.height(), mm_w, mm_h);
    out << fmt::format("  resolution   {:.4f} x {:.4f} um/px, {}\n", slide.mpp(), slide.mpp_y(),
                       mpp_source_text(slide));
  } else {
    out << fmt::format("  size         {} x {} px (mm unknown)\n", slide.width(), slide.height());
    out << fmt::format("  resolution   unknown — set assume_mpp (--assume-mpp here, input.assume_mpp in a job): {}\n",
                       slide.mpp_problem());
  }
  const auto power = slide.objective_power();
  out << fmt::format("  objective    {}\n", power ? fmt::format("{:g}x", *power) : std::string("not recorded"));
  out << fmt::format("  levels       {}\n", slide.level_count());
  out << fmt::format("    {:>5}  {:>8}  {:>8}  {:>10}  {:>9}  {:>9}\n", "level", "width", "height", "downsample",
                     "um/px", "tile");
  for (int i = 0; i < slide.level_count(); ++i) {
    const auto& l = slide.level(i);
    const std::string tile = l.tile_width > 0 ? fmt::format("{}x{}", l.tile_width, l.tile_height) : "-";
    out << fmt::format("    {:>5}  {:>8}  {:>8}  {:>10.4f}  {:>9}  {:>9}\n", i, l.width, l.height, l.downsample,
                       level_mpp_text(slide, l.downsample), tile);
  }
  if (slide.associated_images().empty()) {
    out << "  associated   none\n";
  } else {
    std::string list;
    for (const auto& a : slide.associated_images()) {
      list += fmt::format("{}{} ({}x{})", list.empty() ? "" : ", ", a.name, a.width, a.height);
    }
    out << fmt::format("  associated   {}\n", list);
  }
  if (slide.is_dicom()) {
    const auto paths = slide.property("dicom.optical-paths").value_or("");
    out << fmt::format("  optical      {}\n", paths.empty() ? std::string("no optical path recorded")
                                                            : "paths " + paths + " (the first is read)");
    const auto icc = slide.property("dicom.icc-profile-bytes").value_or("0");
    out << fmt::format("  icc profile  {}\n", icc == "0" ? std::string("none") : icc + " bytes (kept, not applied)");
    out << fmt::format("  series       {}\n", slide.property("dicom.series-uid").value_or(""));
  }
  for (const auto& note : slide.notes()) out << fmt::format("  note         {}\n", note);
  return out.str();
}

const char* mpp_source_id(io::MppSource source) {
  switch (source) {
    case io::MppSource::openslide_property:
      return "openslide_property";
    case io::MppSource::tiff_resolution:
      return "tiff_resolution";
    case io::MppSource::dicom:
      return "dicom";
    case io::MppSource::assumed:
      return "assumed";
    case io::MppSource::unknown:
      return "unknown";
  }
  return "";
}

// A number, or JSON null for a slide without a resolution.
nlohmann::json mpp_json(const io::Slide& slide, double value_if_known) {
  return slide.has_mpp() ? nlohmann::json(value_if_known) : nlohmann::json(nullptr);
}

nlohmann::json to_json(const io::Slide& slide) {
  const double mpp_x = slide.has_mpp() ? slide.mpp() : 0.0;
  const double mpp_y = slide.has_mpp() ? slide.mpp_y() : 0.0;
  nlohmann::json levels = nlohmann::json::array();
  for (const auto& l : slide.levels()) {
    levels.push_back({{"width", l.width},
                      {"height", l.height},
                      {"downsample", l.downsample},
                      {"mpp", mpp_json(slide, mpp_x * l.downsample)},
                      {"tile_width", l.tile_width},
                      {"tile_height", l.tile_height}});
  }
  nlohmann::json associated = nlohmann::json::array();
  for (const auto& a : slide.associated_images()) {
    associated.push_back({{"name", a.name}, {"width", a.width}, {"height", a.height}});
  }
  const auto power = slide.objective_power();
  nlohmann::json out = {{"path", slide.path()},
                        {"vendor", slide.vendor()},
                        {"reader", slide.reader()},
                        {"synthetic", slide.synthetic()},
                        {"width", slide.width()},
                        {"height", slide.height()},
                        {"mpp_x", mpp_json(slide, mpp_x)},
                        {"mpp_y", mpp_json(slide, mpp_y)},
                        {"mpp_source", mpp_source_id(slide.mpp_source())},
                        {"objective_power", power ? nlohmann::json(*power) : nlohmann::json(nullptr)},
                        {"levels", levels},
                        {"associated_images", associated},
                        {"notes", slide.notes()}};
  if (!slide.has_mpp()) out["mpp_problem"] = slide.mpp_problem() + "; set assume_mpp";
  return out;
}

// A header can be sound over pixels that do not decode (damaged JPEG tiles): the smallest level is read (its
// top-left kProbeSide² pixels at most), so that such a slide is reported here rather than when tiling. Damage
// in other levels is found by the jobs that read them (tile, infer).
void check_pixels(const io::Slide& slide) {
  constexpr std::int64_t kProbeSide = 4096;
  const int last = slide.level_count() - 1;
  const auto& level = slide.level(last);
  slide.read_region(0, 0, last, std::min(level.width, kProbeSide), std::min(level.height, kProbeSide));
}

int run_info(const InfoOptions& options) {
  // Reading a few headers needs no parallelism; under mpirun only rank 0 answers.
  if (!core::Comm::world().is_root()) return core::exit_ok;
  io::SlideOpenOptions open_options;
  open_options.assume_mpp = options.assume_mpp;
  open_options.require_mpp = false;  // described, with "resolution unknown", rather than refused
  nlohmann::json all = nlohmann::json::array();
  std::vector<std::string> failures;
  for (const auto& path : options.slides) {
    try {
      const auto slide = io::Slide::open(path, open_options);
      check_pixels(slide);
      if (options.json) {
        all.push_back(to_json(slide));
      } else {
        std::cout << describe(slide) << std::flush;
      }
    } catch (const core::Error& e) {
      if (e.kind() != core::ErrorKind::input) throw;
      failures.push_back(e.what());
      if (options.json) all.push_back({{"path", path}, {"error", e.what()}});
    }
  }
  if (options.json) std::cout << all.dump(2) << "\n";
  if (failures.empty()) return core::exit_ok;
  std::cerr << fmt::format("tessera info: {} of {} slides could not be read:\n", failures.size(),
                           options.slides.size());
  for (const auto& f : failures) std::cerr << "  " << f << "\n";
  return core::exit_input;
}

}  // namespace

Action setup_info(CLI::App& command) {
  auto options = std::make_shared<InfoOptions>();
  command.add_option("slides", options->slides, "Slide files (.svs .tif .ndpi .mrxs ...)")->required();
  command.add_flag("--json", options->json, "Print one JSON array instead of text");
  command
      .add_option("--assume-mpp", options->assume_mpp,
                  "Resolution (um/px) to use for slides that do not record one (without it such a slide is "
                  "described with its resolution unknown)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            // The same bounds as the verbs' `assume_mpp` keys, and a message that does not print DBL_MAX.
            double value = 0.0;
            std::size_t used = 0;
            try {
              value = std::stod(text, &used);
            } catch (const std::exception&) {
              used = 0;
            }
            if (used != text.size() || !(value > 0.0 && value <= 100.0)) {
              return "must be a number above 0 and at most 100, got '" + text + "'";
            }
            return {};
          },
          "UM_PER_PX"));
  return [options] { return run_info(*options); };
}

}  // namespace tessera::app
