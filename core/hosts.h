// Which ranks of a job run on which host, for the logs: when a host fails, Open MPI names the host (and its
// daemon), and this line, written once at the start of every job of several ranks, names the ranks on it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/comm.h"

namespace tessera::core {

// Sorted ranks as runs: {0, 1, 2, 3, 8} → "0-3,8".
std::string rank_runs(const std::vector<int>& ranks);

struct HostMap {
  int hosts = 0;     // distinct host names
  std::string text;  // "t1: ranks 0-1; t2: ranks 2-3", hosts in the order of their first rank; at most `named`
                     // hosts named, then "... (N more)"
};

// Collective over `comm`: every rank's host name (gethostname). The map on `comm`'s rank 0, empty elsewhere.
HostMap describe_hosts(const Comm& comm, std::size_t named = 8);

}  // namespace tessera::core
