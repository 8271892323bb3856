#!/usr/bin/env bash
# Checks a Debian package of tapegrad (tools/dev.sh package): its fields and dependencies (dpkg-deb -I), its
# contents (dpkg-deb -c), and the program run from an unpacked copy in a scratch folder. With --install, also
# apt-get installs it, trains with /usr/bin/tapegrad, builds examples/custom-op with a plain
# find_package(tapegrad) and runs its gradcheck, builds a program with pkg-config, imports the Python module (where
# the package has it), then removes the package again.
#   bash tools/package_check.sh tapegrad_<version>_<arch>.deb [--install]
set -euo pipefail
deb=$(realpath "$1")
install=${2:-}
source_dir=$(realpath "$(dirname "$0")/..")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "package check: $*" >&2; exit 1; }

info=$(dpkg-deb -I "$deb")
echo "$info"
field() { echo "$info" | sed -n "s/^ $1: //p"; }
[ "$(field Package)" = tapegrad ] || fail "Package is not tapegrad"
depends=$(field Depends)
for lib in libopenblas libfmt libstdc++6 libc6 libopenblas-dev libfmt-dev nlohmann-json3-dev; do
  [[ ",$depends" == *[\ ,]$lib* ]] || fail "Depends lacks $lib: $depends"
done
mkdir -p "$scratch/unpacked" "$scratch/work"
dpkg-deb -x "$deb" "$scratch/unpacked"
if readelf -d "$scratch/unpacked/usr/bin/tapegrad" | grep -q 'NEEDED.*libdnnl'; then
  [[ "$depends" == *libdnnl* ]] || fail "the program links oneDNN but Depends lacks it: $depends"
fi
recommends=$(field Recommends)
[[ "$recommends" == *graphviz* && "$recommends" == *python3-torch* ]] || fail "Recommends: '$recommends'"

contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
for path in ./usr/bin/tapegrad ./usr/include/tapegrad/tapegrad.hpp ./usr/include/tapegrad/ops/ops.hpp \
            ./usr/share/tapegrad/data/tinyshakespeare.txt ./usr/share/tapegrad/docs/derivations.md \
            ./usr/share/tapegrad/tools/torch_bench.py ./usr/share/doc/tapegrad/README.md \
            ./usr/share/doc/tapegrad/changelog.md; do
  grep -qx -- "$path" <<<"$contents" || fail "no $path in the package"
done
for pattern in '/libtapegrad\.a$' '/cmake/tapegrad/tapegradConfig\.cmake$' '/pkgconfig/tapegrad\.pc$'; do
  grep -q -- "$pattern" <<<"$contents" || fail "nothing matching $pattern in the package"
done
echo "package check: fields, dependencies and contents as expected"

# The unpacked program, from a scratch folder: it finds its share folder beside its bin folder.
cd "$scratch/work"
"$scratch/unpacked/usr/bin/tapegrad" --version
"$scratch/unpacked/usr/bin/tapegrad" train --max-iters 3 --eval-interval 3 --eval-iters 1 --n-layer 1 | tail -2
"$scratch/unpacked/usr/bin/tapegrad" explain softmax | grep -q "share/tapegrad/docs/derivations.md §" ||
  fail "explain from the unpacked copy names no derivation section"
echo "package check: the unpacked program trains and explains"

# The Python module, where the package has it: imported from the unpacked copy, it checks a numpy op.
if grep -q '/dist-packages/tapegrad/_tapegrad.*\.so$' <<<"$contents"; then
  [[ "$depends" == *python3-numpy* ]] || fail "the package holds the Python module but Depends lacks python3-numpy"
  PYTHONPATH="$scratch/unpacked/usr/lib/python3/dist-packages" /usr/bin/python3 -c \
    "import numpy as np, tapegrad; assert tapegrad.gradcheck(np.sin, (np.ones(3),), vjp=lambda g, x: g * np.cos(x))" ||
    fail "the unpacked Python module does not import or check"
  echo "package check: the unpacked Python module imports and checks"
fi

if [ "$install" = --install ]; then
  as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$deb" >/dev/null
  trap 'as_root apt-get remove -y -qq tapegrad >/dev/null; rm -rf "$scratch"' EXIT
  /usr/bin/tapegrad train --max-iters 3 --eval-interval 3 --eval-iters 1 --n-layer 1 --name installed | tail -2
  cmake -S "$source_dir/examples/custom-op" -B "$scratch/custom-op" -G Ninja -D CMAKE_BUILD_TYPE=Release >/dev/null
  grep -q '^tapegrad_DIR:PATH=/usr/lib/' "$scratch/custom-op/CMakeCache.txt" ||
    fail "find_package(tapegrad) did not take the installed package: $(grep '^tapegrad_DIR' "$scratch/custom-op/CMakeCache.txt")"
  cmake --build "$scratch/custom-op" >/dev/null
  "$scratch/custom-op/custom_op" | tail -3
  printf '#include <tapegrad/tapegrad.hpp>\nint main() { tapegrad::Tape tape; return static_cast<int>(tape.num_nodes()); }\n' \
    > "$scratch/pc.cpp"
  # shellcheck disable=SC2046  # pkg-config's flags are words
  g++ -std=c++20 "$scratch/pc.cpp" -o "$scratch/pc" $(pkg-config --cflags --libs tapegrad) && "$scratch/pc" ||
    fail "a program built with pkg-config --cflags --libs tapegrad did not build or run"
  if grep -q '/dist-packages/tapegrad/' <<<"$contents"; then
    (cd "$scratch" && /usr/bin/python3 -c "import tapegrad; print('import tapegrad:', tapegrad.__file__)") ||
      fail "python3 -c 'import tapegrad' fails with the package installed"
  fi
  echo "package check: installed with apt-get; train, find_package(tapegrad), pkg-config and import tapegrad work"
fi
