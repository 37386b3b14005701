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
  libtiff-dev libjpeg-dev
  libsimgrid-dev
  ccache stress-ng iproute2 util-linux
)

# `install-deps.sh --bench` adds what the benchmarks compare against (the Python tools people use today), and GNU
# time (scripts/bench-checkpoint.sh reads peak memory with it).
# `install-deps.sh --fuzz` adds what `make fuzz` builds with: clang, its libFuzzer/sanitizer runtimes and its
# OpenMP (the engine, which the detections and config targets link, uses OpenMP).
for option in "$@"; do
  case "$option" in
    --bench) packages+=(python3 python3-openslide python3-h5py python3-numpy python3-pil python3-torch time) ;;
    --fuzz) packages+=(clang libclang-rt-14-dev libomp-14-dev) ;;
    *) echo "install-deps.sh: unknown option '$option' (--bench, --fuzz)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

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
