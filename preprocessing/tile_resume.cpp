#include "preprocessing/tile_resume.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/shard.h"

namespace tessera::prep {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct PixelChecksum::State {
  XXH3_state_t* xxh = XXH3_createState();
};

PixelChecksum::PixelChecksum() : state_(std::make_unique<State>()) {
  if (state_->xxh == nullptr || XXH3_64bits_reset(state_->xxh) != XXH_OK) {
    throw core::InternalError("cannot start a pixel checksum (xxHash)");
  }
}

PixelChecksum::~PixelChecksum() { XXH3_freeState(state_->xxh); }

void PixelChecksum::add(const std::uint8_t* data, std::size_t bytes) {
  if (bytes != 0) XXH3_64bits_update(state_->xxh, data, bytes);
}

void PixelChecksum::add(const std::string& text) {
  add(reinterpret_cast<const std::uint8_t*>(text.data()), text.size() + 1);
}

std::string PixelChecksum::hex() const { return fmt::format("{:016x}", XXH3_64bits_digest(state_->xxh)); }

fs::path shard_record_path(const fs::path& out, std::int64_t index) {
  return out / kTileRecordFolder / (shard_name(index) + ".json");
}

void write_shard_record(const fs::path& out, const ShardRecord& record) {
  json doc = {{"job", record.job},           {"index", record.index},   {"first", record.first},
              {"count", record.count},       {"tiles", record.tiles},   {"kept", record.kept},
              {"checksum", record.checksum}, {"failed", record.failed}, {"checksum_algorithm", kChecksumAlgorithm}};
  if (record.stain_kept) doc["stain_kept"] = *record.stain_kept;
  core::write_file_atomic(shard_record_path(out, record.index).string(), doc.dump() + "\n");
}

std::optional<ShardRecord> read_shard_record(const fs::path& out, const std::string& job, const ShardSpan& span,
                                             const std::string& tiles, bool* earlier_logged, bool needs_stain_kept) {
  const fs::path path = shard_record_path(out, span.index);
  if (!fs::exists(path)) return std::nullopt;
  try {
    std::ifstream in(path);
    const json doc = json::parse(in);
    ShardRecord record{doc.at("job").get<std::string>(),
                       doc.at("index").get<std::int64_t>(),
                       doc.at("first").get<std::int64_t>(),
                       doc.at("count").get<std::int64_t>(),
                       doc.at("tiles").get<std::string>(),
                       doc.at("kept").get<std::int64_t>(),
                       doc.at("checksum").get<std::string>(),
                       doc.at("failed").get<std::map<std::string, std::string>>(),
                       std::nullopt};
    if (doc.contains("stain_kept")) record.stain_kept = doc.at("stain_kept").get<std::map<std::string, std::string>>();
    const bool old_checksum = doc.value("checksum_algorithm", std::string()) != kChecksumAlgorithm;
    if (old_checksum || (needs_stain_kept && !record.stain_kept)) {
      if (earlier_logged == nullptr || !*earlier_logged) {
        spdlog::info("{}: resume record from an earlier version of tessera{}: extracting again{}", path.string(),
                     old_checksum ? "" : " (it does not say which groups kept their stain)",
                     earlier_logged == nullptr ? "" : " (the same for every such record of this job)");
        if (earlier_logged != nullptr) *earlier_logged = true;
      }
      return std::nullopt;
    }
    if (record.job != job || record.index != span.index || record.first != span.first || record.count != span.count ||
        record.tiles != tiles) {
      return std::nullopt;
    }
    return record;
  } catch (const std::exception& e) {
    spdlog::warn("{}: unreadable ({}); its shard is extracted again", path.string(), e.what());
    return std::nullopt;
  }
}

bool shard_matches(const std::string& path, const ShardRecord& record, bool check_pixels) {
  try {
    const auto shard = io::ShardFile::open(path);
    if (!check_pixels) return true;
    if (shard.size() != record.kept) {
      spdlog::warn("{}: {} tiles, its record says {}; extracted again", path, shard.size(), record.kept);
      return false;
    }
    PixelChecksum checksum;
    constexpr std::int64_t block = 64;
    std::vector<std::uint8_t> pixels;
    for (std::int64_t first = 0; first < shard.size(); first += block) {
      const std::int64_t n = std::min(block, shard.size() - first);
      pixels.resize(static_cast<std::size_t>(n) * shard.tile_bytes());
      shard.read_images(first, n, pixels.data());
      checksum.add(pixels.data(), pixels.size());
    }
    if (checksum.hex() != record.checksum) {
      spdlog::warn("{}: its pixels do not match its record (checksum {} vs {}); extracted again", path, checksum.hex(),
                   record.checksum);
      return false;
    }
    return true;
  } catch (const core::Error& e) {
    spdlog::warn("{}; extracted again", e.what());
    return false;
  }
}

std::optional<ShardRecord> finished_shard(const fs::path& out, const std::string& job, const ShardSpan& span,
                                          const std::string& tiles, bool* earlier_logged, bool needs_stain_kept) {
  const fs::path final_path = out / shard_name(span.index);
  const std::string unchecked = final_path.string() + ".unchecked";
  auto record = read_shard_record(out, job, span, tiles, earlier_logged, needs_stain_kept);
  if (record && !fs::exists(final_path) && fs::exists(unchecked) && shard_matches(unchecked, *record, true)) {
    return record;
  }
  return std::nullopt;
}

}  // namespace tessera::prep
