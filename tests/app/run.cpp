#include "tests/app/run.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "tests/testing/testing.h"

namespace tessera::testing {
namespace {

Run run_with(const std::string& prefix, const std::string& args) {
  TempDir tmp;
  const std::string err_file = tmp.file("stderr.txt");
  const std::string command = prefix + std::string(TESSERA_BIN) + " " + args + " 2>" + err_file;
  Run r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  for (std::size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) r.out.append(buffer, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  r.err = s.str();
  return r;
}

}  // namespace

Run run(const std::string& args) { return run_with("", args); }

Run run_mpi(int ranks, const std::string& args) {
  return run_with(std::string(TESSERA_MPIEXEC) + " -n " + std::to_string(ranks) + " --oversubscribe --allow-run-as-root ",
                  args);
}

}  // namespace tessera::testing
