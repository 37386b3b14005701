// The viewer's server in-process on an ephemeral port (bind() listens before serve() runs, so the first request
// needs no wait): routing, tiles, caching and the security rules of viewer/server.h.
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "analysis/heatmap_outputs.h"
#include "core/error.h"
#include "io/qc_masks.h"
#include "io/slide.h"
#include "tests/testing/testing.h"
#include "tests/viewer/fixture.h"
#include "viewer/deepzoom.h"
#include "viewer/job.h"
#include "viewer/server.h"
#include "viewer/tile_cache.h"
#include "viewer/tiles.h"

namespace tessera::viewer {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using testing::kViewSlideId;

// ---- DeepZoom geometry and the tile cache ------------------------------------------------------------------------

TEST(DeepZoom, LevelsAndTilesFollowTheDziRule) {
  DeepZoom dz;
  dz.width = 16384;
  dz.height = 10000;
  EXPECT_EQ(dz.max_level(), 14);
  EXPECT_EQ(dz.level_width(14), 16384);
  EXPECT_EQ(dz.level_height(13), 5000);
  EXPECT_EQ(dz.level_width(0), 1);
  EXPECT_EQ(dz.level_height(0), 1);
  EXPECT_EQ(dz.columns(14), 65);  // ceil(16384 / 254)
  const auto first = tile_rect(dz, 14, 0, 0);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->x, 0);
  EXPECT_EQ(first->width, 255);  // one overlap pixel on the right only
  const auto inner = tile_rect(dz, 14, 1, 1);
  ASSERT_TRUE(inner);
  EXPECT_EQ(inner->x, 253);
  EXPECT_EQ(inner->width, 256);
  const auto last = tile_rect(dz, 14, 64, 0);
  ASSERT_TRUE(last);
  EXPECT_EQ(last->x + last->width, 16384);  // clipped to the level
  EXPECT_FALSE(tile_rect(dz, 14, 65, 0));
  EXPECT_FALSE(tile_rect(dz, 15, 0, 0));
  EXPECT_FALSE(tile_rect(dz, -1, 0, 0));
  EXPECT_NE(
      dz.descriptor("jpeg").find(R"(TileSize="254" Overlap="1" Format="jpeg"><Size Width="16384" Height="10000")"),
      std::string::npos);
}

std::shared_ptr<const EncodedTile> tile_of(std::size_t bytes) {
  auto t = std::make_shared<EncodedTile>();
  t->bytes.assign(bytes, 'x');
  t->etag = entity_tag(t->bytes);
  return t;
}

TEST(TileCache, KeepsWithinItsBoundAndDropsTheLeastRecentlyUsed) {
  TileCache cache(3000);
  cache.put("a", tile_of(800));
  cache.put("b", tile_of(800));
  cache.put("c", tile_of(800));
  ASSERT_TRUE(cache.get("a"));   // a is now the most recently used
  cache.put("d", tile_of(800));  // over the bound: b goes
  EXPECT_TRUE(cache.get("a"));
  EXPECT_FALSE(cache.get("b"));
  EXPECT_TRUE(cache.get("c"));
  EXPECT_TRUE(cache.get("d"));
  const auto stats = cache.stats();
  EXPECT_LE(stats.bytes, 3000u);
  EXPECT_EQ(stats.evictions, 1u);
  cache.put("huge", tile_of(5000));  // larger than the whole cache: not kept, nothing evicted for it
  EXPECT_FALSE(cache.get("huge"));
  EXPECT_EQ(cache.stats().tiles, 3u);
}

// ---- heatmap tiles: the overlay's colour and opacity, the heatmap TIFF's footprint rule ----------------------

TEST(HeatmapTile, EachPixelTakesItsFootprintCellWithTheOverlaysColourAndAlpha) {
  const testing::TempDir tmp;
  const auto f = testing::make_view_fixture(tmp.path().string());
  const analysis::OverlayOptions overlay;
  // The whole map at 4 level-0 px per pixel, and a window of it at an offset: the window is the same pixels.
  const cv::Mat whole = analysis::render_map_rgba(f.heatmap, 0, 0, 4.0, cv::Size(512, 512), overlay);
  const cv::Mat window = analysis::render_map_rgba(f.heatmap, 4.0 * 100, 4.0 * 30, 4.0, cv::Size(200, 150), overlay);
  EXPECT_EQ(cv::norm(window, whole(cv::Rect(100, 30, 200, 150)), cv::NORM_INF), 0.0);
  for (const auto& [x, y] : std::vector<std::pair<int, int>>{{300, 150}, {20, 300}, {50, 10}}) {
    const int row = (y * 4) / 256, col = (x * 4) / 256;
    const float p = f.heatmap.at(row, col);
    const auto px = whole.at<cv::Vec4b>(y, x);
    if (std::isnan(p)) {
      EXPECT_EQ(px[3], 0) << "no tissue is transparent";
      continue;
    }
    const cv::Vec3b colour = io::colormap_rgb(p, overlay.colormap);
    EXPECT_EQ(cv::Vec3b(px[0], px[1], px[2]), colour);
    EXPECT_EQ(px[3], cv::saturate_cast<uchar>(255.0 * analysis::overlay_alpha(p, overlay)));
  }
  // Below the threshold: transparent.
  const cv::Mat thresholded = analysis::render_map_rgba(f.heatmap, 0, 0, 4.0, cv::Size(512, 512), overlay, 0.5);
  EXPECT_EQ(thresholded.at<cv::Vec4b>(300, 20)[3], 0);
  EXPECT_GT(thresholded.at<cv::Vec4b>(150, 300)[3], 0);
}

// ---- the server ---------------------------------------------------------------------------------------------------

class ViewerServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new testing::TempDir();
    fixture_ = new testing::ViewFixture(testing::make_view_fixture(tmp_->path().string()));
    ServerOptions options;
    options.port = 0;
    options.cache_bytes = 64ull << 20;
    server_ = new Server(open_job({fixture_->infer_dir}, {}), options);
    port_ = server_->bind();
    thread_ = new std::thread([] { server_->serve(); });
  }
  static void TearDownTestSuite() {
    server_->stop();
    thread_->join();
    delete thread_;
    delete server_;
    delete fixture_;
    delete tmp_;
  }

  static httplib::Result get(const std::string& path, const httplib::Headers& headers = {}) {
    httplib::Client client("127.0.0.1", port_);
    return client.Get(path, headers);
  }
  static int status(const std::string& path) {
    const auto res = get(path);
    return res ? res->status : -1;
  }

  static testing::TempDir* tmp_;
  static testing::ViewFixture* fixture_;
  static Server* server_;
  static std::thread* thread_;
  static int port_;
};
testing::TempDir* ViewerServer::tmp_ = nullptr;
testing::ViewFixture* ViewerServer::fixture_ = nullptr;
Server* ViewerServer::server_ = nullptr;
std::thread* ViewerServer::thread_ = nullptr;
int ViewerServer::port_ = 0;

TEST_F(ViewerServer, ServesThePageAndTheIndexWithTheFailedSlideAndItsError) {
  const auto page = get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("openseadragon.min.js"), std::string::npos);
  EXPECT_EQ(status("/static/openseadragon.min.js"), 200);
  EXPECT_EQ(status("/static/images/home_rest.png"), 200);

  const auto res = get("/api/job");
  ASSERT_TRUE(res);
  const json job = json::parse(res->body);
  ASSERT_EQ(job["slides"].size(), 2u);
  const json& shown = job["slides"][0];
  EXPECT_EQ(shown["id"], kViewSlideId);
  EXPECT_TRUE(shown["error"].is_null());
  EXPECT_TRUE(shown["has_heatmap"].get<bool>());
  EXPECT_TRUE(shown["has_ground_truth"].get<bool>());
  EXPECT_NEAR(shown["score"].get<double>(), testing::kViewTumourP, 1e-3);
  const json& failed = job["slides"][1];
  EXPECT_EQ(failed["id"], testing::kViewFailedId);
  EXPECT_NE(failed["error"].get<std::string>().find("Not a TIFF file"), std::string::npos);
}

TEST_F(ViewerServer, DescribesASlideWithItsRegionOutlinesAndGroundTruth) {
  const auto res = get(std::string("/api/slides/") + kViewSlideId);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const json s = json::parse(res->body);
  EXPECT_EQ(s["width"], 2048);
  EXPECT_DOUBLE_EQ(s["mpp"].get<double>(), 0.5);
  ASSERT_EQ(s["regions"].size(), 1u);  // the tumour block
  const json& region = s["regions"][0];
  EXPECT_EQ(region["bounds"], json({1024, 512, 512, 512}));
  ASSERT_TRUE(region["outline"].is_object());
  EXPECT_GE(region["outline"]["outer"].size(), 4u);
  ASSERT_EQ(s["ground_truth"].size(), 1u);
  EXPECT_TRUE(s["ground_truth"][0]["tumour"].get<bool>());
  EXPECT_EQ(s["heatmap"]["step"], 256);

  const auto grid = get(std::string("/api/slides/") + kViewSlideId + "/heatmap");
  ASSERT_TRUE(grid);
  const json g = json::parse(grid->body);
  EXPECT_TRUE(g["prob"][0].is_null());  // no tissue
  EXPECT_NEAR(g["prob"][2 * 8 + 4].get<double>(), testing::kViewTumourP, 1e-4);
}

TEST_F(ViewerServer, SlideTilesAreTheSlidesPixelsAsJpeg) {
  const std::string base = std::string("/dzi/") + kViewSlideId;
  const auto dzi = get(base + "/slide.dzi");
  ASSERT_TRUE(dzi);
  EXPECT_NE(dzi->body.find(R"(Width="2048" Height="2048")"), std::string::npos);
  // Level 11 is full resolution (2^11 = 2048); tile (1, 2) starts at level-0 (253, 507).
  const auto res = get(base + "/slide_files/11/1_2.jpeg");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "image/jpeg");
  const std::vector<uchar> bytes(res->body.begin(), res->body.end());
  cv::Mat bgr = cv::imdecode(bytes, cv::IMREAD_COLOR);
  ASSERT_EQ(bgr.cols, 256);
  ASSERT_EQ(bgr.rows, 256);
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  const io::Slide slide = io::Slide::open(fixture_->slide_path);
  const cv::Mat expected = slide.read_region(253, 507, 0, 256, 256);
  EXPECT_LT(cv::norm(rgb, expected, cv::NORM_L1) / (256.0 * 256 * 3), 6.0) << "mean difference beyond JPEG's";
  // A coarse level is the slide area-averaged: the 8x8 level shows the whole slide.
  const auto small = get(base + "/slide_files/3/0_0.jpeg");
  ASSERT_TRUE(small);
  const std::vector<uchar> small_bytes(small->body.begin(), small->body.end());
  EXPECT_EQ(cv::imdecode(small_bytes, cv::IMREAD_COLOR).size(), cv::Size(8, 8));
}

TEST_F(ViewerServer, HeatmapTilesAreTransparentPngsWithTheTumourColourOverTheTumour) {
  const std::string base = std::string("/dzi/") + kViewSlideId;
  // Level 8 is 256 px, 8 level-0 px per pixel; tile 0_0 covers its pixels [0, 255).
  const auto res = get(base + "/heatmap-0_files/8/0_0.png");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "image/png");
  const std::vector<uchar> bytes(res->body.begin(), res->body.end());
  const cv::Mat bgra = cv::imdecode(bytes, cv::IMREAD_UNCHANGED);
  ASSERT_EQ(bgra.type(), CV_8UC4);
  ASSERT_EQ(bgra.size(), cv::Size(255, 255));  // [0, 254 + 1 overlap)
  const cv::Vec3b tumour = io::colormap_rgb(testing::kViewTumourP, io::Colormap::inferno);
  const auto at_tumour = bgra.at<cv::Vec4b>(96, 160);  // level-0 (1280, 768)
  EXPECT_EQ(cv::Vec3b(at_tumour[2], at_tumour[1], at_tumour[0]), tumour);
  EXPECT_GT(at_tumour[3], 128);
  EXPECT_EQ(bgra.at<cv::Vec4b>(10, 10)[3], 0) << "no tissue in row 0";
  const auto at_normal = bgra.at<cv::Vec4b>(150, 40);  // level-0 (320, 1200)
  EXPECT_GT(at_normal[3], 0);
  EXPECT_LT(at_normal[3], at_tumour[3]);
  // At threshold 0.50 the normal cells go; the tumour stays.
  const auto cut = get(base + "/heatmap-50_files/8/0_0.png");
  ASSERT_TRUE(cut);
  const std::vector<uchar> cut_bytes(cut->body.begin(), cut->body.end());
  const cv::Mat cut_bgra = cv::imdecode(cut_bytes, cv::IMREAD_UNCHANGED);
  EXPECT_EQ(cut_bgra.at<cv::Vec4b>(150, 40)[3], 0);
  EXPECT_EQ(cut_bgra.at<cv::Vec4b>(96, 160), at_tumour);
}

// The QC layer: <slide>.qc.png's excluded areas grey, flagged ones amber, elsewhere transparent, on the slide's
// DeepZoom grid.
TEST_F(ViewerServer, QcTilesAreExcludedGreyAndFlaggedAmber) {
  const auto detail = nlohmann::json::parse(get(std::string("/api/slides/") + kViewSlideId)->body);
  EXPECT_EQ(detail["has_qc"], true);
  const std::string base = std::string("/dzi/") + kViewSlideId;
  EXPECT_EQ(status(base + "/qc.dzi"), 200);
  EXPECT_EQ(status(base + "/qc_files/8/0_0.jpeg"), 404) << "the QC layer is PNG";
  const auto res = get(base + "/qc_files/8/0_0.png");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "image/png");
  const std::vector<uchar> bytes(res->body.begin(), res->body.end());
  const cv::Mat bgra = cv::imdecode(bytes, cv::IMREAD_UNCHANGED);
  ASSERT_EQ(bgra.type(), CV_8UC4);
  // Level 8: 8 level-0 px per pixel, so pixel (x, y) is level-0 (8x + 4, 8y + 4).
  const auto at = [&](int x0, int y0) { return bgra.at<cv::Vec4b>(y0 / 8, x0 / 8); };
  const auto& ex = testing::kViewQcExcluded;
  const auto& fl = testing::kViewQcFlagged;
  EXPECT_EQ(at(ex[0] + 100, ex[1] + 100), cv::Vec4b(110, 110, 110, kQcLayerAlpha));
  EXPECT_EQ(at(ex[0] + ex[2] - 12, ex[1] + ex[3] - 12), cv::Vec4b(110, 110, 110, kQcLayerAlpha));
  EXPECT_EQ(at(fl[0] + 100, fl[1] + 100), cv::Vec4b(0, 170, 255, kQcLayerAlpha)) << "amber (BGRA)";
  EXPECT_EQ(at(ex[0] + ex[2] + 20, ex[1] + 100)[3], 0) << "just right of the excluded area";
  EXPECT_EQ(at(1280, 768)[3], 0) << "tissue without artefacts";
}

// Without <slide>.qc.png there is no QC layer; masks of another slide's size are the slide's error, naming them.
TEST(ViewerJob, QcMasksAreOptionalAndMustFitTheSlide) {
  testing::TempDir tmp;
  const auto fixture = testing::make_view_fixture(tmp.path().string());
  const fs::path masks = fs::path(fixture.infer_dir) / (std::string(kViewSlideId) + ".qc.png");
  fs::remove(masks);
  const auto without = open_job({fixture.infer_dir}, {});
  const ViewerSlide* s = without.find(kViewSlideId);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->error, "");
  EXPECT_EQ(s->qc, nullptr);
  io::write_qc_masks_png(masks.string(), cv::Mat1w(100, 256, io::kQcTissueBit));
  const auto wrong = open_job({fixture.infer_dir}, {});
  s = wrong.find(kViewSlideId);
  ASSERT_NE(s, nullptr);
  EXPECT_NE(s->error.find("the QC masks (case_001.qc.png, 256x100) are not those of this 2048x2048 slide"),
            std::string::npos)
      << s->error;
}

TEST_F(ViewerServer, TilesCarryAnEtagAndARevalidationIsNotModified) {
  const std::string path = std::string("/dzi/") + kViewSlideId + "/slide_files/10/1_1.jpeg";
  const auto first = get(path);
  ASSERT_TRUE(first);
  const std::string etag = first->get_header_value("ETag");
  ASSERT_FALSE(etag.empty());
  EXPECT_NE(first->get_header_value("Cache-Control").find("max-age"), std::string::npos);
  const auto again = get(path, {{"If-None-Match", etag}});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 304);
  EXPECT_TRUE(again->body.empty());
  const auto second = get(path);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->body, first->body);
  EXPECT_EQ(second->get_header_value("ETag"), etag);
  EXPECT_GT(server_->cache_stats().hits, 0u);
}

TEST_F(ViewerServer, AnyOtherPathTraversalOrEncodedTraversalIsNotFound) {
  const std::string id = kViewSlideId;
  for (const std::string& path : {
           std::string("/static/../CMakeLists.txt"),
           std::string("/static/%2e%2e/%2e%2e/CMakeLists.txt"),
           std::string("/static/..%2f..%2fCMakeLists.txt"),
           std::string("/static/%252e%252e/x"),
           std::string("/dzi/..%2F..%2F..%2Fetc%2Fpasswd/slide.dzi"),
           std::string("/dzi/%2Fetc%2Fpasswd/slide.dzi"),
           std::string("//etc/passwd"),
           std::string("/etc/passwd"),
           std::string("/static/..\\..\\CMakeLists.txt"),
           std::string("/static/"),
           std::string("/static/images/"),
           std::string("/static/images"),
           std::string("/dzi/") + id + "/",
           std::string("/dzi/") + id + "/slide_files/11/",
           std::string("/dzi/") + id + "/./slide.dzi",
           std::string("/api/slides/no_such_slide"),
           std::string("/dzi/no_such_slide/slide.dzi"),
           std::string("/dzi/") + testing::kViewFailedId + "/slide.dzi",
           std::string("/") + fixture_->slide_path,
           std::string("/dzi/") + id + "/slide_files/11/0_0.png",
           std::string("/dzi/") + id + "/heatmap-0_files/11/0_0.jpeg",
       }) {
    EXPECT_EQ(status(path), 404) << path;
  }
}

TEST_F(ViewerServer, BadLevelColumnRowOrThresholdIsBadRequest) {
  const std::string base = std::string("/dzi/") + kViewSlideId;
  for (const std::string& path : {
           base + "/slide_files/x/0_0.jpeg",
           base + "/slide_files/-1/0_0.jpeg",
           base + "/slide_files/12/0_0.jpeg",  // beyond the last level (11)
           base + "/slide_files/11/9_0.jpeg",  // 9 columns of 254 px cover 2286 > 2048
           base + "/slide_files/11/0_99999999999.jpeg",
           base + "/slide_files/11/+1_0.jpeg",
           base + "/slide_files/11/1 _0.jpeg",
           base + "/heatmap-101_files/11/0_0.png",
           base + "/heatmap-abc_files/11/0_0.png",
           base + "/heatmap-101.dzi",
       }) {
    EXPECT_EQ(status(path), 400) << path;
  }
}

TEST_F(ViewerServer, OnlyGetAndHeadAndNoBodies) {
  httplib::Client client("127.0.0.1", port_);
  const auto head = client.Head(std::string("/dzi/") + kViewSlideId + "/slide.dzi");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->body.empty());
  const auto post = client.Post("/api/job", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->get_header_value("Allow"), "GET, HEAD");
  const auto put = client.Put("/", "x", "text/plain");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 405);
  const auto del = client.Delete("/api/job");
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 405);
  const auto options = client.Options("/");
  ASSERT_TRUE(options);
  EXPECT_EQ(options->status, 405);
  // A body is never read: a megabyte sent with a POST gets its 405 (or the connection closed under the client
  // still sending it), and the server goes on; a request line beyond 8 KB is refused.
  const auto big = client.Post("/api/job", std::string(1 << 20, 'x'), "text/plain");
  if (big) {
    EXPECT_EQ(big->status, 405);
  }
  EXPECT_EQ(status("/api/job"), 200);
  EXPECT_EQ(status("/api/" + std::string(9000, 'a')), 414);
}

TEST_F(ViewerServer, NeverWritesIntoTheJobsFolders) {
  auto listing = [&] {
    std::map<std::string, std::pair<std::uintmax_t, fs::file_time_type>> out;
    for (const auto& e : fs::recursive_directory_iterator(fixture_->dir)) {
      out[e.path().string()] = {e.is_regular_file() ? e.file_size() : 0, e.last_write_time()};
    }
    return out;
  };
  const auto before = listing();
  for (const char* path : {"/", "/api/job", "/dzi/case_001/slide_files/9/0_0.jpeg",
                           "/dzi/case_001/heatmap-30_files/8/0_0.png", "/api/slides/case_001/thumbnail.jpg"}) {
    EXPECT_EQ(status(path), 200) << path;
  }
  EXPECT_EQ(listing(), before);
}

// ---- the job: symlinks out of the folder, slides alone ----------------------------------------------------------

TEST(ViewerJob, AnOutputThatIsASymlinkOutOfTheFolderIsNotServed) {
  const testing::TempDir tmp;
  const auto f = testing::make_view_fixture(tmp.file("job"));
  const fs::path heatmap = fs::path(f.infer_dir) / (std::string(kViewSlideId) + ".heatmap.h5");
  const fs::path outside = tmp.path() / "elsewhere.heatmap.h5";
  fs::rename(heatmap, outside);
  fs::create_symlink(outside, heatmap);
  const ViewerJob job = open_job({f.infer_dir}, {});
  const ViewerSlide* s = job.find(kViewSlideId);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->slide, nullptr);
  EXPECT_NE(s->error.find("leads out of the job's folder"), std::string::npos) << s->error;
}

TEST(ViewerJob, AReportUnlikeInfersIsTheSlidesErrorNamingIt) {
  const testing::TempDir tmp;
  const auto f = testing::make_view_fixture(tmp.file("job"));
  const fs::path report = fs::path(f.infer_dir) / (std::string(kViewSlideId) + ".report.json");
  std::ofstream(report) << R"({"regions": [{"id": "one"}]})";
  const ViewerJob job = open_job({f.infer_dir}, {});
  const ViewerSlide* s = job.find(kViewSlideId);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->slide, nullptr);
  EXPECT_NE(s->error.find(report.string()), std::string::npos) << s->error;
  EXPECT_NE(s->error.find("regions unlike tessera infer's"), std::string::npos) << s->error;
}

TEST(ViewerJob, AFolderWithoutInferOutputsIsAnInputErrorNamingIt) {
  const testing::TempDir tmp;
  try {
    open_job({tmp.path().string()}, {});
    FAIL() << "no error";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), tmp.path().string());
    EXPECT_NE(std::string(e.what()).find("no tessera infer outputs"), std::string::npos);
  }
}

TEST(ViewerJob, RealSlidesAloneAreShownAndTheCorruptOnesListedWithTheirErrors) {
  const fs::path real = testing::shared_data_dir() / "real-slides";
  if (!fs::exists(real / "cmu-1-small-region.svs")) GTEST_SKIP() << "no real slides at " << real;
  const ViewerJob job = open_job({(real / "cmu-1-small-region.svs").string(), (real / "unreadable.svs").string(),
                                  (real / "unopenable.tiff").string(), (real / "broken.svs").string()},
                                 {});
  ASSERT_EQ(job.slides.size(), 4u);
  EXPECT_TRUE(job.slides[0].error.empty()) << job.slides[0].error;
  EXPECT_NE(job.slides[0].slide, nullptr);
  EXPECT_EQ(job.slides[0].heatmap, nullptr);
  for (std::size_t i = 1; i < 4; ++i) {
    EXPECT_FALSE(job.slides[i].error.empty()) << job.slides[i].id;
    EXPECT_EQ(job.slides[i].slide, nullptr);
  }
  EXPECT_NE(job.slides[1].error.find("Bogus marker length"), std::string::npos) << job.slides[1].error;
}

}  // namespace
}  // namespace tessera::viewer
