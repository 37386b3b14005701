#include "core/hosts.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <map>
#include <utility>

#include <fmt/format.h>

namespace tessera::core {

std::string rank_runs(const std::vector<int>& ranks) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out.push_back(j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(out, ","));
}

HostMap describe_hosts(const Comm& comm, std::size_t named) {
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0) std::snprintf(host.data(), host.size(), "?");
  const auto all = comm.gather_bytes(host.data(), 0);
  HostMap map;
  if (!comm.is_root()) return map;
  std::vector<std::pair<std::string, std::vector<int>>> hosts;  // in the order of their first rank
  std::map<std::string, std::size_t> index;
  for (std::size_t r = 0; r < all.size(); ++r) {
    auto [it, added] = index.emplace(all[r], hosts.size());
    if (added) hosts.emplace_back(all[r], std::vector<int>{});
    hosts[it->second].second.push_back(static_cast<int>(r));
  }
  std::vector<std::string> parts;
  for (const auto& [name, ranks] : hosts) {
    if (parts.size() == named) {
      parts.push_back(fmt::format("... ({} more)", hosts.size() - named));
      break;
    }
    parts.push_back(fmt::format("{}: {} {}", name, ranks.size() == 1 ? "rank" : "ranks", rank_runs(ranks)));
  }
  map.hosts = static_cast<int>(hosts.size());
  map.text = fmt::format("{}", fmt::join(parts, "; "));
  return map;
}

}  // namespace tessera::core
