#!/usr/bin/env bash
# Builds the llama.cpp peer once into the user cache, for `llada bench --peer` (docs/peer.md).
#
#   scripts/peer/llama_cpp.sh            build (or say that it is already built) and print where
#   scripts/peer/llama_cpp.sh --force    rebuild even when the binaries are present
#
# Source: the llama.cpp tree vendored in the source distribution of llama-cpp-python (pinned
# below), fetched with pip. Binaries land in
#   ${LLADA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llada}/peer/llama.cpp-<version>/bin/
# (the same cache directory the `llada` binary uses). The x86 instruction-set flags are set
# explicitly from /proc/cpuinfo; GGML_NATIVE and AMX stay off (native builds on an AMX Xeon died
# with SIGILL). The flags used are written to build-flags.txt beside the binaries.
#
# Slow: about 20 minutes on two cores (it builds under `nice -n 15` with -j${JOBS:-2}).
# Not run by CI. Needs: python3 with pip, a C/C++ compiler, cmake (pip installs one if absent).
set -euo pipefail

version=0.3.36
jobs="${JOBS:-2}"
force=0
for a in "$@"; do
  case "$a" in
    --force) force=1 ;;
    -h | --help)
      sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "llama_cpp.sh: unknown argument '$a' (try --help)" >&2
      exit 2
      ;;
  esac
done

if [ -n "${LLADA_CACHE:-}" ]; then
  cache="$LLADA_CACHE"
elif [ -n "${XDG_CACHE_HOME:-}" ]; then
  cache="$XDG_CACHE_HOME/llada"
else
  cache="$HOME/.cache/llada"
fi
root="$cache/peer/llama.cpp-$version"
bin="$root/bin"
# llama-completion is the plain text-completion tool of recent trees; older ones had llama-cli.
targets=(llama-bench llama-diffusion-cli llama-speculative-simple llama-completion llama-server
  llama-quantize)

have_all() {
  [ -f "$bin/build-flags.txt" ] || return 1
  for t in "${targets[@]}"; do
    if [ "$t" = llama-completion ]; then
      [ -x "$bin/llama-completion" ] || [ -x "$bin/llama-cli" ] || return 1
    else
      [ -x "$bin/$t" ] || return 1
    fi
  done
}

if [ "$force" = 0 ] && have_all; then
  echo "llama_cpp.sh: llama.cpp $version is already built in $bin (nothing to do; --force rebuilds)"
  echo "llama_cpp.sh: $(grep '^flags' "$bin/build-flags.txt")"
  exit 0
fi

# --- tools -----------------------------------------------------------------------------------
if ! command -v cmake > /dev/null 2>&1; then
  echo "llama_cpp.sh: cmake not found; installing it with pip"
  python3 -m pip install --quiet cmake
fi
command -v cmake > /dev/null 2>&1 || {
  echo "llama_cpp.sh: cmake is still not on PATH after 'python3 -m pip install cmake'" >&2
  exit 1
}
for c in cc c++; do
  command -v "$c" > /dev/null 2>&1 || {
    echo "llama_cpp.sh: no C/C++ compiler ($c) on PATH" >&2
    exit 1
  }
done

# --- source ----------------------------------------------------------------------------------
src_root="$root/src"
src="$src_root/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
  mkdir -p "$src_root"
  dl="$src_root/download"
  mkdir -p "$dl"
  if ! ls "$dl"/llama_cpp_python-"$version".tar.gz > /dev/null 2>&1; then
    echo "llama_cpp.sh: fetching the llama-cpp-python $version source distribution with pip"
    # Preparing the sdist's metadata needs scikit-build-core; without build isolation pip uses
    # the installed one (and cmake), so install those first.
    python3 -m pip install --quiet scikit-build-core cmake > /dev/null 2>&1 || true
    python3 -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
      "llama-cpp-python==$version" -d "$dl" ||
      python3 -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$dl"
  fi
  tarball="$dl/llama_cpp_python-$version.tar.gz"
  [ -f "$tarball" ] || {
    echo "llama_cpp.sh: pip did not leave $tarball" >&2
    exit 1
  }
  echo "llama_cpp.sh: extracting $tarball"
  tar -xzf "$tarball" -C "$src_root" "llama_cpp_python-$version/vendor/llama.cpp" \
    "llama_cpp_python-$version/CHANGELOG.md"
fi
changelog="$src_root/llama_cpp_python-$version/CHANGELOG.md"
tarball="$src_root/download/llama_cpp_python-$version.tar.gz"
if [ ! -f "$changelog" ] && [ -f "$tarball" ]; then
  tar -xzf "$tarball" -C "$src_root" "llama_cpp_python-$version/CHANGELOG.md" || true
fi
[ -f "$src/CMakeLists.txt" ] || {
  echo "llama_cpp.sh: no llama.cpp tree at $src" >&2
  exit 1
}
# The one the vendored tree has: llama-completion (recent) or llama-cli (older).
if [ ! -d "$src/tools/completion" ]; then
  targets=("${targets[@]/llama-completion/llama-cli}")
fi

# --- CPU flags -------------------------------------------------------------------------------
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2> /dev/null | cut -d: -f2) "
has() { [[ "$cpu_flags" == *" $1 "* ]]; }
onoff() { if has "$1"; then echo ON; else echo OFF; fi; }
isa=()
arch="$(uname -m)"
if [ "$arch" = x86_64 ]; then
  isa+=("-DGGML_SSE42=$(onoff sse4_2)")
  isa+=("-DGGML_AVX=$(onoff avx)")
  isa+=("-DGGML_AVX2=$(onoff avx2)")
  isa+=("-DGGML_BMI2=$(onoff bmi2)")
  isa+=("-DGGML_FMA=$(onoff fma)")
  isa+=("-DGGML_F16C=$(onoff f16c)")
  isa+=("-DGGML_AVX_VNNI=$(onoff avx_vnni)")
  isa+=("-DGGML_AVX512=$(onoff avx512f)")
  isa+=("-DGGML_AVX512_VBMI=$(onoff avx512vbmi)")
  isa+=("-DGGML_AVX512_VNNI=$(onoff avx512_vnni)")
  isa+=("-DGGML_AVX512_BF16=$(onoff avx512_bf16)")
  isa+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
fi
# The sdist carries no git history; its changelog names the llama.cpp commit it vendors, which
# llama-bench then reports (build_commit) instead of "unknown".
commit="$(sed -n "/^## \[$version\]/,/^## \[/p" "$changelog" 2> /dev/null | grep -o 'llama\.cpp@[0-9a-f]\{7,40\}' | head -n1 | cut -d@ -f2 || true)"
common=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF)
if [ -n "$commit" ]; then
  common+=("-DLLAMA_BUILD_COMMIT=$commit")
fi

# --- build -----------------------------------------------------------------------------------
build="$root/build"
echo "llama_cpp.sh: configuring llama.cpp $version in $build"
echo "llama_cpp.sh: flags ${isa[*]}"
start=$(date +%s)
nice -n 15 cmake -S "$src" -B "$build" "${common[@]}" "${isa[@]}" > "$root/configure.log" 2>&1 || {
  tail -n 30 "$root/configure.log" >&2
  echo "llama_cpp.sh: cmake configure failed (log: $root/configure.log)" >&2
  exit 1
}
echo "llama_cpp.sh: building ${targets[*]} with -j$jobs (slow: about 20 minutes on two cores)"
nice -n 15 cmake --build "$build" --config Release -j "$jobs" --target "${targets[@]}"
secs=$(($(date +%s) - start))

mkdir -p "$bin"
for t in "${targets[@]}"; do
  cp -f "$build/bin/$t" "$bin/$t"
done
{
  echo "llama.cpp ${commit:-(commit unknown)} vendored in llama-cpp-python $version"
  echo "cpu $(grep -m1 'model name' /proc/cpuinfo 2> /dev/null | cut -d: -f2 | sed 's/^ *//')"
  echo "flags ${common[*]} ${isa[*]}"
  echo "compiler $(c++ --version | head -n1)"
  echo "build_seconds $secs"
} > "$bin/build-flags.txt"
"$bin/llama-bench" --help > /dev/null 2>&1 || {
  echo "llama_cpp.sh: the built llama-bench does not run (try: $bin/llama-bench --help)" >&2
  exit 1
}
echo "llama_cpp.sh: built in ${secs}s; binaries in $bin"
ls "$bin"
