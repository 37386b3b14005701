// Version text for `tessera --version`: Tessera's own version and the libraries it was built with.
#pragma once

#include <string>

namespace tessera::app {
std::string version_text();
}
