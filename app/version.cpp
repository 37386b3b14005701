#include "app/version.h"

#include <mpi.h>

#include <H5public.h>
#include <oneapi/dnnl/dnnl.h>
#include <openslide/openslide.h>
#include <tiffvers.h>
#include <opencv2/core/version.hpp>

#include <string>

#include "app/tessera_version.h"

namespace tessera::app {

std::string version_text() {
  const dnnl_version_t* dnnl = dnnl_version();
  char mpi_library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(mpi_library, &length);
  std::string mpi_text(mpi_library, static_cast<std::size_t>(length));
  if (auto comma = mpi_text.find(','); comma != std::string::npos) mpi_text.resize(comma);
  return "tessera " TESSERA_VERSION
         "\n"
         "  OpenSlide " +
         std::string(openslide_get_version()) + "\n" + "  oneDNN " + std::to_string(dnnl->major) + "." +
         std::to_string(dnnl->minor) + "." + std::to_string(dnnl->patch) + "\n" +
         "  OpenCV " CV_VERSION
         "\n"
         "  HDF5 " +
         std::to_string(H5_VERS_MAJOR) + "." + std::to_string(H5_VERS_MINOR) + "." + std::to_string(H5_VERS_RELEASE) +
         "\n" + "  " + mpi_text + "\n" + "  libtiff " + std::to_string(TIFFLIB_MAJOR_VERSION) + "." +
         std::to_string(TIFFLIB_MINOR_VERSION) + "." + std::to_string(TIFFLIB_MICRO_VERSION) + "\n" +
         "  yaml-cpp, spdlog, CLI11, nlohmann-json, pugixml (Debian 12)";
}

}  // namespace tessera::app
