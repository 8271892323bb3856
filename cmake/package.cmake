# cpack -G DEB (tools/dev.sh package): one Debian package, tapegrad_<version>_<arch>.deb, holding all that
# cmake --install installs: the program, the static library and its headers, the CMake package and pkg-config file,
# and share/tapegrad/. Configure its build with -D CMAKE_INSTALL_PREFIX=/usr (the library then goes to Debian's
# multiarch folder, lib/<triplet>) and -D TAPEGRAD_X86_64_V3=OFF (a package runs on every CPU of its architecture).
#
# Depends: what the program links, computed by dpkg-shlibdeps from the shared libraries it loads (OpenBLAS, fmt,
# oneDNN, OpenMP's libgomp, the C++ runtime), and the development packages that find_package(tapegrad) and
# pkg-config --libs tapegrad look up for the library (cmake/tapegradConfig.cmake.in, cmake/tapegrad.pc.in).
# Where the Python module is built (python/CMakeLists.txt), the package holds it in Debian's python3 path
# (/usr/lib/python3/dist-packages/tapegrad) and depends on that python3 and python3-numpy.
# Recommends: Graphviz (tapegrad graph --format svg|png) and PyTorch (bench --vs-torch, the cross-checks, and
# tapegrad.gradcheck on torch ops).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME tapegrad)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "reverse- and forward-mode autodiff with hand-derived attention derivatives")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION  # below the summary line
    "A small C++20 engine in which every node (matrix products, softmax, the row normalization
beta(x) = x/(1+|x|), layer norm, the attention family) carries a hand-derived vector-Jacobian and
Jacobian-vector product beside its forward pass, a gradchecker that compares them with finite
differences in float64 and diagnoses a wrong rule, and a character-level GPT trained on the
bundled Tiny Shakespeare.
.
This package holds the tapegrad program (train, gradcheck, explain, claim, graph, bench), the
static library with its headers, CMake package (find_package(tapegrad)) and pkg-config file,
and the files the program reads, under /usr/share/tapegrad; where built, the Python module
tapegrad (the gradchecker on PyTorch and numpy ops, the engine on numpy arrays).")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # tapegrad_<version>_<arch>.deb
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "The tapegrad developers")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(TAPEGRAD_DEB_DEV_DEPENDS "libopenblas-dev, libfmt-dev, nlohmann-json3-dev")
if(TAPEGRAD_HAVE_ONEDNN)
  string(APPEND TAPEGRAD_DEB_DEV_DEPENDS ", libdnnl-dev")
endif()
if(TAPEGRAD_PYTHON_DEB_DEPENDS)
  string(APPEND TAPEGRAD_DEB_DEV_DEPENDS ", ${TAPEGRAD_PYTHON_DEB_DEPENDS}")
endif()
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${TAPEGRAD_DEB_DEV_DEPENDS}")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "graphviz, python3-torch")
set(CPACK_STRIP_FILES ON)
include(CPack)
