// The HTTP server behind `tessera view` (cpp-httplib). It serves one ViewerJob and a fixed set of static files
// (the page and OpenSeadragon, read into memory at start), nothing else:
//
//   GET /                                        the page (index of the slides; #<id> opens one)
//   GET /static/<file>                           the page's script and style, OpenSeadragon and its button images
//   GET /api/job                                 the index: title, threshold, every slide (score, regions per
//                                                size class, error) as JSON
//   GET /api/slides/<id>                         one slide: size, µm/px, heatmap geometry, regions with outlines,
//                                                ground truth, report (provenance) as JSON
//   GET /api/slides/<id>/heatmap                 the probability grid (null = no tissue) for P under the mouse
//   GET /api/slides/<id>/thumbnail.jpg           a thumbnail for the index
//   GET /dzi/<id>/slide.dzi, /dzi/<id>/slide_files/<level>/<col>_<row>.jpeg          the slide, DeepZoom
//   GET /dzi/<id>/heatmap-<t>.dzi, /dzi/<id>/heatmap-<t>_files/<level>/<col>_<row>.png  the heatmap, cells with
//                                                P < t/100 transparent (t an integer 0..100)
//   GET /dzi/<id>/qc.dzi, /dzi/<id>/qc_files/<level>/<col>_<row>.png  quality control's areas (<id>.qc.png, when
//                                                infer wrote it): excluded grey, flagged amber
//
// Security: binds 127.0.0.1 unless told otherwise; slides are addressed by id, never by path, so no request
// names a file: an unknown id, any other path, a `..` segment (also percent-encoded), a backslash or an empty
// segment is 404; a bad level, column, row or threshold is 400; methods other than GET and HEAD are 405; request
// lines, headers and bodies are bounded (8 KB, 8 KB, 0 bytes accepted); no directory is ever listed; nothing is
// written. Tiles are deterministic: each carries an ETag (FNV-1a of its bytes) and Cache-Control, and a matching
// If-None-Match gets 304. Encoded tiles are kept in a TileCache of a bounded size.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "viewer/job.h"
#include "viewer/tile_cache.h"

namespace tessera::viewer {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                         // 0 = any free port (tests, benchmarks)
  std::size_t cache_bytes = 256ull << 20;  // encoded tiles kept in memory
  std::string web_dir;                     // the page and OpenSeadragon (default_web_dir())
  int jpeg_quality = 85;
};

// Where the build put the page and OpenSeadragon (<build>/viewer/web).
std::string default_web_dir();

class Server {
 public:
  // Reads the static files; core::InputError naming the file when one is missing (OpenSeadragon comes from
  // `npm ci` in viewer/web: scripts/install-deps.sh).
  Server(ViewerJob job, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens (connections queue from here on, before serve()); returns the port. InternalError naming
  // the address when it cannot bind.
  int bind();
  // Answers requests until stop() (from another thread); returns then.
  void serve();
  void stop();

  const ViewerJob& job() const;
  TileCache::Stats cache_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::viewer
