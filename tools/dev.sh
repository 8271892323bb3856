#!/usr/bin/env bash
# Set-up, build and test in one place, for a fresh Debian machine (root, or a user with sudo).
#   bash tools/dev.sh demo       install what is missing, build, train the default model on Tiny Shakespeare
#   bash tools/dev.sh test       install what is missing (PyTorch too), build, run every test (ctest), then the
#                                product-dependent ones again with each product backend forced (OpenBLAS, oneDNN)
#   bash tools/dev.sh sanitize   the same tests built with AddressSanitizer + UndefinedBehaviorSanitizer
#   bash tools/dev.sh fuzz [S]   installs clang, runs each libFuzzer target for S seconds (60) (tools/fuzz.sh)
#   bash tools/dev.sh valgrind   installs valgrind, memchecks a short training run and a gradcheck (tools/valgrind.sh)
#   bash tools/dev.sh package [--install]  build tapegrad_<version>_<arch>.deb (CPack, in build-package/) and check
#                                it (tools/package_check.sh); --install also installs it with apt-get, uses it, removes it
#   bash tools/dev.sh lint       flake8 over the Python files (.flake8), clang-format's check of the C++ files
#                                (.clang-format) (CI runs it; `clang-format -i FILE` lays a C++ file out)
#   bash tools/dev.sh web        the workbook's pages (docs/web.md): engine and checker in WebAssembly (emscripten),
#                                the pages in build-web/site/, then their test in headless Chromium (build-web/browser-test/)
#   bash tools/dev.sh deps [PACKAGE...] | build
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(g++ cmake ninja-build ccache pkg-config libopenblas-dev libdnnl-dev libfmt-dev libcli11-dev nlohmann-json3-dev doctest-dev libutfcpp-dev graphviz
          python3-dev pybind11-dev python3-pytest)
JOBS=$(nproc 2>/dev/null || echo 2)

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

deps() {
  local missing=()
  for p in "${PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

build() {  # build DIR [cmake options...]; TAPEGRAD_WERROR=ON in the environment: warnings as errors (CI)
  local dir=$1; shift
  cmake -S . -B "$dir" -G Ninja -DTAPEGRAD_WERROR="${TAPEGRAD_WERROR:-OFF}" "$@" >/dev/null
  ninja -C "$dir" -j "$JOBS"
}

case "${1:-}" in
  deps) shift; deps "$@" ;;  # extra packages may follow
  lint)  # the files git tracks: Python through flake8 (unused and undefined names, imports, layout at 120 columns),
         # C++ through clang-format --dry-run (a file it would lay out otherwise fails, with the lines)
    deps python3-flake8 clang-format
    git ls-files -z '*.py' | xargs -0 /usr/bin/python3 -m flake8
    git ls-files -z '*.cpp' '*.hpp' | xargs -0 clang-format --dry-run --Werror ;;
  build) deps; build build ;;
  demo)
    deps; build build
    ./build/tapegrad train --overwrite ;;  # a second demo starts the run over
  test)
    # PyTorch too: the Python module's tests (python/tests) check torch ops and compare with torch, and the
    # cross-checks of label "torch" run against it; without it they would be skipped, not run.
    deps python3-torch; build build
    (cd build && ctest --output-on-failure -j "$JOBS")
    # The engine, op, attention and training tests once more with each product backend forced (the run above
    # follows the rule of ops/products/products.hpp, which mixes them on AVX-512 CPUs).
    if ! ./build/tapegrad --version | grep -q "built without oneDNN"; then
      for backend in openblas onednn; do
        echo "== products on $backend only (TAPEGRAD_GEMM=$backend)"
        (cd build && TAPEGRAD_GEMM=$backend ctest --output-on-failure -j "$JOBS" -L 'engine|ops|attention|training')
      done
    fi ;;
  sanitize)
    deps; build build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTAPEGRAD_SANITIZE=ON
    # All but bf16_training (two 2000-step trainings, minutes under the sanitizers) and memory_estimate (resident
    # memory under AddressSanitizer is mostly its shadow): the test step runs both.
    (cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$JOBS" -LE 'bf16|rss') ;;
  fuzz)  # only this step needs clang and its fuzzer runtime
    deps clang libclang-rt-14-dev
    shift; bash tools/fuzz.sh "$@" ;;
  package)  # a Release build for /usr, for every CPU of the architecture (no x86-64-v3), without the tests
    deps dpkg-dev file; build build-package -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
      -DTAPEGRAD_X86_64_V3=OFF -DTAPEGRAD_BUILD_TESTS=OFF
    (cd build-package && rm -f tapegrad_*.deb && cpack -G DEB >/dev/null)
    deb=$(ls build-package/tapegrad_*.deb)
    echo "built $deb"
    shift; bash tools/package_check.sh "$deb" "$@" ;;
  valgrind)
    deps valgrind; build build
    bash tools/valgrind.sh ;;
  web)  # Debian's emscripten, its optimizer's acorn, KaTeX and Chromium; the program the test compares with is
         # build/tapegrad (TAPEGRAD_CLI= another), built here only where it is missing
    deps emscripten node-acorn libjs-katex chromium
    export NODE_PATH=/usr/share/nodejs${NODE_PATH:+:$NODE_PATH}  # Debian's acorn, ahead of another Node.js's modules
    emcmake cmake -S web -B build-web/module -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
    nice -n 10 ninja -C build-web/module -j "$JOBS"
    /usr/bin/python3 web/generate_pages.py --module build-web/module/tapegrad.js --out build-web/site
    cli=${TAPEGRAD_CLI:-build/tapegrad}
    if [ ! -x "$cli" ]; then
      cmake -S . -B build -G Ninja -DTAPEGRAD_WERROR="${TAPEGRAD_WERROR:-OFF}" >/dev/null
      ninja -C build -j "$JOBS" tapegrad_cli
    fi
    /usr/bin/python3 web/browser_test.py --site build-web/site --cli "$cli" --out build-web/browser-test ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
