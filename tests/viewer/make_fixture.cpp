// tessera_view_fixture DIR: writes the viewer tests' job (fixture.h) into DIR, for the browser test.
#include <exception>
#include <iostream>

#include "tests/viewer/fixture.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tessera_view_fixture DIR\n";
    return 2;
  }
  try {
    const auto f = tessera::testing::make_view_fixture(argv[1]);
    std::cout << f.infer_dir << "\n";
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
