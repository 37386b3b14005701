#!/usr/bin/env bash
# Installs the Debian 12 packages Tessera needs, only when some are missing.
# Idempotent; works as root or through sudo. Used by `make demo`, `make test` and CI.
set -euo pipefail

packages=(
  build-essential cmake pkg-config make
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev
  libopenslide-dev openslide-tools
  libopenmpi-dev openmpi-bin
  libhdf5-dev hdf5-tools
  libdnnl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev libcli11-dev libspdlog-dev nlohmann-json3-dev libpugixml-dev
  libtiff-dev libdeflate-dev libjpeg-dev libxxhash-dev
  libcpp-httplib-dev
  libdcmtk-dev dcmtk libopenjp2-7-dev libgdcm-tools dicom3tools python3-pydicom python3-numpy
  libsimgrid-dev
  ccache stress-ng iproute2 util-linux
  slurm-wlm slurm-client munge libpmix-dev jq
)

# python3-pydicom reads the DICOM tests' pixel data only with python3-numpy, which it merely recommends (and
# recommended packages are not installed here).
# `tessera view`'s page takes OpenSeadragon from the npm registry (viewer/web/package-lock.json), installed by
# `npm ci` at the end. Node and npm: the machine's when it has them (a newer Node brings its own npm, which conflicts
# with Debian's `npm` package), else Debian's nodejs + npm (Node 18).
if ! command -v npm >/dev/null 2>&1; then
  packages+=(nodejs npm)
fi

# `install-deps.sh --browser` adds the headless browser of the `browser` test label (CI installs it, timed).
# `install-deps.sh --bench` adds what the benchmarks compare against (the Python tools people use today), and GNU
# time (scripts/bench-checkpoint.sh reads peak memory with it).
# `install-deps.sh --fuzz` adds what `make fuzz` builds with: clang, its libFuzzer/sanitizer runtimes and its
# OpenMP (the engine, which the detections and config targets link, uses OpenMP).
for option in "$@"; do
  case "$option" in
    --bench) packages+=(python3 python3-openslide python3-h5py python3-numpy python3-pil python3-torch python3-torchvision python3-yaml time) ;;
    --fuzz) packages+=(clang libclang-rt-14-dev libomp-14-dev) ;;
    --browser) packages+=(chromium chromium-driver python3-selenium python3-pil) ;;
    *) echo "install-deps.sh: unknown option '$option' (--bench, --fuzz, --browser)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "tessera: installing missing Debian packages: ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    sudo=()
  elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "tessera: these packages are missing and neither root nor sudo is available: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# OpenSeadragon for `tessera view` (viewer/web), when what is installed is not what the lock file pins.
web="$(cd "$(dirname "$0")/.." && pwd)/viewer/web"
stamp="$web/node_modules/.package-lock.json"
if [ ! -f "$stamp" ] || ! cmp -s <(sed -n '/"node_modules\//,$p' "$web/package-lock.json") \
                                 <(sed -n '/"node_modules\//,$p' "$stamp"); then
  echo "tessera: installing the viewer's npm packages (npm ci in viewer/web)"
  (cd "$web" && npm ci --ignore-scripts --no-audit --no-fund)
fi
