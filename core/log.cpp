#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <array>
#include <memory>
#include <utility>

#include "core/error.h"

namespace tessera::core {
namespace {

// The one list of level names (STYLE: an unknown name lists the known ones).
constexpr std::array<std::pair<const char*, spdlog::level::level_enum>, 6> level_names{{
    {"trace", spdlog::level::trace},
    {"debug", spdlog::level::debug},
    {"info", spdlog::level::info},
    {"warn", spdlog::level::warn},
    {"error", spdlog::level::err},
    {"off", spdlog::level::off},
}};

spdlog::level::level_enum parse_level(const std::string& name) {
  std::string known;
  for (const auto& [level_name, level] : level_names) {
    if (name == level_name) return level;
    known += known.empty() ? level_name : std::string(", ") + level_name;
  }
  throw UsageError("unknown log level '" + name + "' (valid: " + known + ")");
}

}  // namespace

void init_logging(const std::string& level, int rank, int size) {
  const auto parsed = parse_level(level);  // before touching the logger: a bad name changes nothing

  std::string pattern = "[%H:%M:%S] [%^%l%$] ";
  if (size > 1) pattern += "[rank " + std::to_string(rank) + "/" + std::to_string(size) + "] ";
  pattern += "%v";

  // Colours only when stderr is a terminal (the sink checks).
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("tessera", std::move(sink));
  logger->set_pattern(pattern);
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));  // replaces any earlier default, so init may run again
}

}  // namespace tessera::core
