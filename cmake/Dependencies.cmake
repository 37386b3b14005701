# Third-party libraries, all from Debian 12 packages (scripts/install-deps.sh installs them).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
# MPI: Open MPI, or SimGrid's SMPI for the simulator build (TESSERA_SMPI, sim/README.md). Everything that talks
# MPI links tessera_mpi.
add_library(tessera_mpi INTERFACE)
if(TESSERA_SMPI)
  find_path(SMPI_INCLUDE_DIR smpi/mpi.h REQUIRED)
  find_library(SIMGRID_LIBRARY simgrid REQUIRED)
  # SMPI's mpi.h comes first, so every `#include <mpi.h>` is SimGrid's.
  target_include_directories(tessera_mpi SYSTEM BEFORE INTERFACE ${SMPI_INCLUDE_DIR}/smpi)
  target_link_libraries(tessera_mpi INTERFACE ${SIMGRID_LIBRARY})
else()
  find_package(MPI REQUIRED COMPONENTS C)
  target_link_libraries(tessera_mpi INTERFACE MPI::MPI_C)
endif()
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(yaml-cpp REQUIRED)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(pugixml REQUIRED)
find_package(TIFF REQUIRED)
find_package(JPEG REQUIRED)
# DICOM slides (io/dicom_slide.h): DCMTK parses and decodes JPEG-LS, OpenJPEG decodes JPEG 2000.
find_package(DCMTK REQUIRED CONFIG)
pkg_check_modules(OPENJPEG REQUIRED IMPORTED_TARGET libopenjp2)
pkg_check_modules(OPENSLIDE REQUIRED IMPORTED_TARGET openslide)
# libdeflate: the heatmap TIFF's tiles compressed on several threads (io/tiff_writer.h), as libtiff itself does.
pkg_check_modules(LIBDEFLATE REQUIRED IMPORTED_TARGET libdeflate)
# xxHash: the checksum of the shards' pixels the tile job records and checks on resume (preprocessing/tile_resume.h).
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
# cpp-httplib (tessera view's server): Debian builds it as a library; its flags (TLS, compression) come with it.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)

# Debian splits OpenCV into per-module -dev packages; the CMake config only ships with the
# full meta package, so the three modules Tessera uses are located directly.
find_path(OpenCV_INCLUDE_DIR opencv2/core.hpp PATH_SUFFIXES opencv4 REQUIRED)
add_library(tessera_opencv INTERFACE)
foreach(module core imgproc imgcodecs)
  find_library(OpenCV_${module}_LIBRARY opencv_${module} REQUIRED)
  target_link_libraries(tessera_opencv INTERFACE ${OpenCV_${module}_LIBRARY})
endforeach()
target_include_directories(tessera_opencv SYSTEM INTERFACE ${OpenCV_INCLUDE_DIR})

add_library(tessera_hdf5 INTERFACE)
target_include_directories(tessera_hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
target_link_libraries(tessera_hdf5 INTERFACE ${HDF5_C_LIBRARIES})
target_compile_definitions(tessera_hdf5 INTERFACE ${HDF5_C_DEFINITIONS})

# Debian's dnnl-config.cmake insists on OpenCL development files (its GPU runtime); Tessera uses the CPU
# engine only, so the library and headers are located directly.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
add_library(tessera_dnnl INTERFACE)
target_include_directories(tessera_dnnl SYSTEM INTERFACE ${DNNL_INCLUDE_DIR})
target_link_libraries(tessera_dnnl INTERFACE ${DNNL_LIBRARY})
