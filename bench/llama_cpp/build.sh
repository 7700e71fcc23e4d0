# bench/llama_cpp/build.sh — sourced by the llama.cpp comparisons: builds a
# target of the llama.cpp that a llama-cpp-python sdist vendors.
#
#   source bench/llama_cpp/build.sh
#   build_llama_cpp WORK VERSION TARGET [ISA]   # prints the binary's path
#
# Downloads the sdist into WORK (pip download, source only), unpacks it and
# builds TARGET (llama-bench, llama-server) in WORK/llama.cpp-VERSION-build
# (Release, -march=native), each step skipped when its output is there.
# ISA avx2 builds for an AVX2-only machine instead (AVX2, FMA, F16C, no
# AVX-512), in WORK/llama.cpp-VERSION-avx2-build.
# Progress goes to stderr; a failed build prints its log's tail and returns 1.
#
#   llama_cpp_python WORK                   # prints a python with numpy and PyYAML
#
# python3 when it has both (write_gguf.py and gguf-py need them), else a
# virtual environment in WORK/py that it makes once.

build_llama_cpp() {
  local work=$1 version=$2 target=$3 isa=${4:-native}
  local sdist=$work/llama_cpp_python-$version.tar.gz
  local src=$work/llama_cpp_python-$version/vendor/llama.cpp
  local build_dir=$work/llama.cpp-$version-build isa_args=(-DGGML_NATIVE=ON)
  case $isa in
    native) ;;
    avx2)
      build_dir=$work/llama.cpp-$version-avx2-build
      isa_args=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
        -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF)
      ;;
    *)
      printf '== build_llama_cpp: ISA %s: expected native or avx2\n' "$isa" >&2
      return 1
      ;;
  esac
  local binary=$build_dir/bin/$target
  if [ ! -f "$sdist" ]; then
    printf '== downloading llama-cpp-python %s (source)\n' "$version" >&2
    python3 -m pip download --no-deps --no-binary :all: -d "$work" \
      "llama-cpp-python==$version" >&2 || return 1
  fi
  if [ ! -f "$src/CMakeLists.txt" ]; then
    tar -xzf "$sdist" -C "$work" || return 1
  fi
  if [ ! -x "$binary" ]; then
    # The sdist carries the vendored llama.cpp's git metadata (a shallow
    # clone under .git/modules), which llama.cpp's CMake reads for its build
    # commit. Git must not look above the work directory: there it would
    # find Baton's repository and stamp llama.cpp with Baton's commit.
    local cmake_args=(
      -S "$src" -B "$build_dir"
      -DCMAKE_BUILD_TYPE=Release
      "${isa_args[@]}"
      -DLLAMA_CURL=OFF  # model downloads; recent trees no longer have the option
      -DLLAMA_OPENSSL=OFF
      -DLLAMA_BUILD_TESTS=OFF
      -DLLAMA_BUILD_EXAMPLES=OFF
      -DLLAMA_BUILD_SERVER=ON
      -DLLAMA_BUILD_APP=OFF
      -DBUILD_SHARED_LIBS=OFF
    )
    if command -v ninja >/dev/null; then cmake_args+=(-G Ninja); fi
    if command -v ccache >/dev/null; then
      cmake_args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    fi
    printf '== building %s in %s\n' "$target" "$build_dir" >&2
    local started=$SECONDS log=$build_dir-$target.log
    if ! { GIT_CEILING_DIRECTORIES=$work cmake "${cmake_args[@]}" &&
      cmake --build "$build_dir" --target "$target" -j "$(nproc)"; } >"$log" 2>&1; then
      tail -30 "$log" >&2
      printf '== llama.cpp build failed; log: %s\n' "$log" >&2
      return 1
    fi
    printf '== built %s in %s s\n' "$target" "$((SECONDS - started))" >&2
  fi
  printf '%s\n' "$binary"
}

llama_cpp_python() {
  local work=$1 python=python3
  if ! python3 -c 'import numpy, yaml' 2>/dev/null; then
    python=$work/py/bin/python
    if ! "$python" -c 'import numpy, yaml' 2>/dev/null; then
      printf '== installing numpy and PyYAML into %s/py\n' "$work" >&2
      python3 -m venv --system-site-packages "$work/py" >&2 || return 1
      "$python" -m pip install --quiet numpy pyyaml >&2 || return 1
    fi
  fi
  printf '%s\n' "$python"
}
