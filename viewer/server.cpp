#include "viewer/server.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <opencv2/core.hpp>

#include "core/error.h"
#include "viewer/deepzoom.h"
#include "viewer/tiles.h"

namespace tessera::viewer {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kTileCacheControl = "private, max-age=3600";
constexpr int kThumbnailSide = 384;
constexpr int kMaxThreshold = 100;

struct Asset {
  std::string bytes;
  std::string type;
};

std::string content_type(const std::string& name) {
  static const std::map<std::string, std::string> types = {{".html", "text/html; charset=utf-8"},
                                                           {".js", "text/javascript; charset=utf-8"},
                                                           {".css", "text/css; charset=utf-8"},
                                                           {".png", "image/png"},
                                                           {".svg", "image/svg+xml"},
                                                           {".json", "application/json"}};
  const auto it = types.find(fs::path(name).extension().string());
  return it == types.end() ? "application/octet-stream" : it->second;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw core::InputError(
        "missing: the viewer's page and OpenSeadragon are installed by scripts/install-deps.sh (npm ci in "
        "viewer/web) and copied by the build",
        path.string());
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A non-negative decimal integer and nothing else (no sign, no spaces, no leading '+'); nullopt otherwise.
std::optional<std::int64_t> parse_index(const std::string& text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

// A path no route may serve: a dot-dot or dot segment, an empty segment, a backslash or a NUL (after httplib's
// percent-decoding, so %2e%2e and %2f are caught too).
bool suspicious_path(const std::string& path) {
  if (path.empty() || path.front() != '/') return true;
  if (path.find('\\') != std::string::npos || path.find('\0') != std::string::npos) return true;
  if (path == "/") return false;
  std::string_view rest(path);
  rest.remove_prefix(1);
  while (true) {
    const auto slash = rest.find('/');
    const std::string_view segment = rest.substr(0, slash);
    if (segment.empty() || segment == "." || segment == "..") return true;
    if (slash == std::string_view::npos) return false;
    rest.remove_prefix(slash + 1);
  }
}

json number_or_null(double value) { return std::isnan(value) ? json(nullptr) : json(value); }

json slide_summary(const ViewerSlide& s) {
  json regions_per_class = {{"isolated_tumour_cells", 0}, {"micrometastasis", 0}, {"macrometastasis", 0}};
  json score = nullptr;
  if (s.report.is_object()) {
    if (s.report.contains("regions_per_size_class")) regions_per_class = s.report["regions_per_size_class"];
    if (s.report.contains("slide_score")) score = s.report["slide_score"];
  } else if (s.heatmap) {
    score = number_or_null(s.heatmap->max_prob());
  }
  json out = {{"id", s.id},
              {"path", s.slide_path},
              {"error", s.error.empty() ? json(nullptr) : json(s.error)},
              {"score", score},
              {"regions_per_size_class", regions_per_class},
              {"regions", s.regions.size()},
              {"has_heatmap", s.heatmap != nullptr && s.slide != nullptr},
              {"has_ground_truth", s.ground_truth.is_array() && !s.ground_truth.empty()}};
  if (s.slide) {
    out["width"] = s.slide->width();
    out["height"] = s.slide->height();
    out["mpp"] = s.slide->has_mpp() ? json(s.slide->mpp()) : json(nullptr);
  }
  return out;
}

}  // namespace

std::string default_web_dir() { return TESSERA_VIEWER_WEB_DIR; }

struct Server::Impl {
  ViewerJob job;
  ServerOptions options;
  TileCache cache;
  std::map<std::string, Asset> assets;  // "/static/<name>" and "/"
  httplib::Server http;
  std::string job_json;

  Impl(ViewerJob j, ServerOptions o) : job(std::move(j)), options(std::move(o)), cache(options.cache_bytes) {}

  void load_assets() {
    const fs::path web = options.web_dir.empty() ? fs::path(default_web_dir()) : fs::path(options.web_dir);
    assets["/"] = {read_file(web / "index.html"), content_type("index.html")};
    for (const char* name : {"viewer.js", "viewer.css", "openseadragon.min.js"}) {
      assets[std::string("/static/") + name] = {read_file(web / name), content_type(name)};
    }
    // OpenSeadragon's navigation button images, as its package ships them.
    const fs::path images = web / "images";
    std::error_code ec;
    if (!fs::is_directory(images, ec)) read_file(images / "home_rest.png");  // throws naming the folder's file
    for (const auto& entry : fs::directory_iterator(images)) {
      if (!entry.is_regular_file()) continue;
      const std::string name = entry.path().filename().string();
      assets["/static/images/" + name] = {read_file(entry.path()), content_type(name)};
    }
  }

  static void security_headers(httplib::Response& res) {
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Referrer-Policy", "no-referrer");
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
                   "frame-ancestors 'none'");
  }

  static void fail(httplib::Response& res, int status, const std::string& message) {
    res.status = status;
    res.set_content(message + "\n", "text/plain; charset=utf-8");
  }

  static void send_json(httplib::Response& res, const std::string& body) {
    res.set_header("Cache-Control", "no-cache");
    res.set_content(body, "application/json");
  }

  // Serves `key` from the cache, or makes it with `make` and keeps it; answers 304 to a matching If-None-Match.
  template <typename Make>
  void send_cached(const httplib::Request& req, httplib::Response& res, const std::string& key, const char* type,
                   Make&& make) {
    auto tile = cache.get(key);
    if (!tile) {
      auto made = std::make_shared<EncodedTile>();
      made->bytes = make();
      made->etag = entity_tag(made->bytes);
      tile = made;
      cache.put(key, made);
    }
    res.set_header("ETag", tile->etag);
    res.set_header("Cache-Control", kTileCacheControl);
    if (req.get_header_value("If-None-Match") == tile->etag) {
      res.status = 304;
      return;
    }
    res.set_content(tile->bytes, type);
  }

  const ViewerSlide* shown(const std::string& id, httplib::Response& res) const {
    const ViewerSlide* s = job.find(id);
    if (s == nullptr) {
      fail(res, 404, "no slide '" + id + "' in this job");
      return nullptr;
    }
    if (!s->slide) {
      fail(res, 404, "slide '" + id + "' cannot be shown: " + s->error);
      return nullptr;
    }
    return s;
  }

  static DeepZoom deep_zoom(const ViewerSlide& s) {
    DeepZoom dz;
    dz.width = s.slide->width();
    dz.height = s.slide->height();
    return dz;
  }

  json slide_detail(const ViewerSlide& s) const {
    json out = slide_summary(s);
    out["regions"] = s.regions;
    out["ground_truth"] = s.ground_truth.is_array() ? s.ground_truth : json(nullptr);
    out["ground_truth_error"] = s.ground_truth_error.empty() ? json(nullptr) : json(s.ground_truth_error);
    out["threshold"] = job.threshold;
    out["model"] = s.report.is_object() && s.report.contains("model") ? s.report["model"] : json(nullptr);
    out["caution"] = s.report.is_object() && s.report.contains("caution") ? s.report["caution"] : json(nullptr);
    if (s.slide) {
      out["vendor"] = s.slide->vendor();
      out["dzi"] = {{"tile_size", deep_zoom(s).tile_size}, {"max_level", deep_zoom(s).max_level()}};
    }
    out["has_qc"] = s.qc != nullptr && s.slide != nullptr;
    if (s.heatmap && s.slide) {
      const io::Heatmap& h = *s.heatmap;
      out["heatmap"] = {{"rows", h.rows},
                        {"cols", h.cols},
                        {"origin_x", h.origin_x},
                        {"origin_y", h.origin_y},
                        {"step", h.step},
                        {"tile", h.tile},
                        {"colormap", io::to_string(job.overlay.colormap)},
                        {"min_alpha", job.overlay.min_alpha},
                        {"max_alpha", job.overlay.max_alpha}};
    }
    return out;
  }

  std::string grid_json(const io::Heatmap& h) const {
    json prob = json::array();
    for (const float p : h.prob) {
      prob.push_back(std::isnan(p) ? json(nullptr) : json(std::round(static_cast<double>(p) * 1e4) / 1e4));
    }
    return json({{"rows", h.rows}, {"cols", h.cols}, {"prob", prob}}).dump();
  }

  void routes() {
    http.set_payload_max_length(0);
    http.set_keep_alive_max_count(1000);
    // Without TCP_NODELAY a response written in two sends (headers, then body) waits for the client's delayed ACK:
    // 40 ms per tile on Linux loopback, whatever the cache (bench view measured it).
    http.set_tcp_nodelay(true);
    http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
      security_headers(res);
      if (req.method != "GET" && req.method != "HEAD") {
        res.set_header("Allow", "GET, HEAD");
        fail(res, 405, "only GET and HEAD");
        return httplib::Server::HandlerResponse::Handled;
      }
      if (suspicious_path(req.path)) {
        fail(res, 404, "not found");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (res.body.empty()) {
        res.set_content(res.status == 404 ? "not found\n" : fmt::format("error {}\n", res.status),
                        "text/plain; charset=utf-8");
      }
    });
    http.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      try {
        std::rethrow_exception(ep);
      } catch (const core::Error& e) {
        spdlog::warn("{}: {}", req.path, e.what());
        fail(res, e.kind() == core::ErrorKind::input ? 422 : 500, e.what());
      } catch (const std::exception& e) {
        spdlog::error("{}: {}", req.path, e.what());
        fail(res, 500, e.what());
      }
    });

    for (const auto& [path, asset] : assets) {
      const Asset* a = &asset;
      std::string pattern;  // the route is a regular expression: the file name's dots are literal
      for (const char c : path) {
        if (c == '.') pattern += '\\';
        pattern += c;
      }
      http.Get(pattern, [a](const httplib::Request&, httplib::Response& res) {
        res.set_header("Cache-Control", "no-cache");
        res.set_content(a->bytes, a->type.c_str());
      });
    }
    http.Get("/api/job", [this](const httplib::Request&, httplib::Response& res) { send_json(res, job_json); });
    http.Get(R"(/api/slides/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      const ViewerSlide* s = job.find(req.matches[1]);
      if (s == nullptr) return fail(res, 404, "no slide '" + req.matches[1].str() + "' in this job");
      send_json(res, slide_detail(*s).dump());
    });
    http.Get(R"(/api/slides/([^/]+)/heatmap)", [this](const httplib::Request& req, httplib::Response& res) {
      const ViewerSlide* s = shown(req.matches[1], res);
      if (s == nullptr) return;
      if (!s->heatmap) return fail(res, 404, "slide '" + s->id + "' has no heatmap");
      send_cached(req, res, "grid/" + s->id, "application/json", [&] { return grid_json(*s->heatmap); });
    });
    http.Get(R"(/api/slides/([^/]+)/thumbnail\.jpg)", [this](const httplib::Request& req, httplib::Response& res) {
      const ViewerSlide* s = shown(req.matches[1], res);
      if (s == nullptr) return;
      send_cached(req, res, "thumb/" + s->id, "image/jpeg",
                  [&] { return encode_jpeg(s->slide->thumbnail(kThumbnailSide), options.jpeg_quality); });
    });
    http.Get(R"(/dzi/([^/]+)/slide\.dzi)", [this](const httplib::Request& req, httplib::Response& res) {
      const ViewerSlide* s = shown(req.matches[1], res);
      if (s == nullptr) return;
      res.set_content(deep_zoom(*s).descriptor("jpeg"), "application/xml");
    });
    http.Get(R"(/dzi/([^/]+)/heatmap-([^/]+)\.dzi)", [this](const httplib::Request& req, httplib::Response& res) {
      const ViewerSlide* s = shown(req.matches[1], res);
      if (s == nullptr) return;
      if (!s->heatmap) return fail(res, 404, "slide '" + s->id + "' has no heatmap");
      const auto t = parse_index(req.matches[2]);
      if (!t || *t > kMaxThreshold) return fail(res, 400, "the threshold must be an integer 0..100 (percent)");
      res.set_content(deep_zoom(*s).descriptor("png"), "application/xml");
    });
    http.Get(R"(/dzi/([^/]+)/qc\.dzi)", [this](const httplib::Request& req, httplib::Response& res) {
      const ViewerSlide* s = shown(req.matches[1], res);
      if (s == nullptr) return;
      if (!s->qc) return fail(res, 404, "slide '" + s->id + "' has no quality control masks");
      res.set_content(deep_zoom(*s).descriptor("png"), "application/xml");
    });
    http.Get(R"(/dzi/([^/]+)/(slide|qc|heatmap-[^/]+)_files/([^/]+)/([^/_]+)_([^/_.]+)\.(jpeg|png))",
             [this](const httplib::Request& req, httplib::Response& res) { tile(req, res); });
  }

  void tile(const httplib::Request& req, httplib::Response& res) {
    const ViewerSlide* s = shown(req.matches[1], res);
    if (s == nullptr) return;
    const std::string layer = req.matches[2];
    const bool qc = layer == "qc";
    const bool heatmap = layer != "slide" && !qc;
    if ((heatmap || qc) != (req.matches[6] == "png")) return fail(res, 404, "not found");
    if (qc && !s->qc) return fail(res, 404, "slide '" + s->id + "' has no quality control masks");
    std::optional<std::int64_t> threshold;
    if (heatmap) {
      if (!s->heatmap) return fail(res, 404, "slide '" + s->id + "' has no heatmap");
      threshold = parse_index(layer.substr(std::string("heatmap-").size()));
      if (!threshold || *threshold > kMaxThreshold) {
        return fail(res, 400, "the threshold must be an integer 0..100 (percent)");
      }
    }
    const DeepZoom dz = deep_zoom(*s);
    const auto level = parse_index(req.matches[3]);
    const auto column = parse_index(req.matches[4]);
    const auto row = parse_index(req.matches[5]);
    if (!level || !column || !row) return fail(res, 400, "level, column and row must be non-negative integers");
    if (*level > dz.max_level()) {
      return fail(res, 400, fmt::format("level {} is beyond the image's last level {}", *level, dz.max_level()));
    }
    const auto rect = tile_rect(dz, static_cast<int>(*level), *column, *row);
    if (!rect) {
      return fail(res, 400,
                  fmt::format("tile {}_{} is outside level {} ({}x{} tiles)", *column, *row, *level,
                              dz.columns(static_cast<int>(*level)), dz.rows(static_cast<int>(*level))));
    }
    const std::string key = fmt::format("{}/{}/{}/{}_{}", s->id, layer, *level, *column, *row);
    if (qc) {
      send_cached(req, res, key, "image/png", [&] {
        return encode_png(qc_tile(*s->qc, s->slide->width(), dz, static_cast<int>(*level), *rect));
      });
    } else if (heatmap) {
      send_cached(req, res, key, "image/png", [&] {
        return encode_png(heatmap_tile(*s->heatmap, dz, static_cast<int>(*level), *rect, job.overlay,
                                       static_cast<double>(*threshold) / kMaxThreshold));
      });
    } else {
      send_cached(req, res, key, "image/jpeg", [&] {
        return encode_jpeg(slide_tile(*s->slide, dz, static_cast<int>(*level), *rect), options.jpeg_quality);
      });
    }
  }
};

Server::Server(ViewerJob job, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(job), std::move(options))) {
  impl_->load_assets();
  json slides = json::array();
  for (const auto& s : impl_->job.slides) slides.push_back(slide_summary(s));
  impl_->job_json = json({{"title", impl_->job.title},
                          {"infer", impl_->job.infer},
                          {"threshold", impl_->job.threshold},
                          {"slides", slides}})
                        .dump();
  impl_->routes();
}

Server::~Server() = default;

int Server::bind() {
  const int port =
      impl_->options.port == 0
          ? impl_->http.bind_to_any_port(impl_->options.host)
          : (impl_->http.bind_to_port(impl_->options.host, impl_->options.port) ? impl_->options.port : -1);
  if (port < 0) {
    throw core::InternalError(fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)",
                                          impl_->options.host, impl_->options.port));
  }
  return port;
}

void Server::serve() { impl_->http.listen_after_bind(); }

void Server::stop() { impl_->http.stop(); }

const ViewerJob& Server::job() const { return impl_->job; }

TileCache::Stats Server::cache_stats() const { return impl_->cache.stats(); }

}  // namespace tessera::viewer
