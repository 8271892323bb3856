"""The package's modules import one another downhill: no module reaches itself through the package's own imports
(at the top of a file or inside a function), so each can be read, and imported, without the ones above it."""

import ast

from conftest import SOURCE_DIR


def test_the_package_has_no_import_circle():
    package = SOURCE_DIR / "python" / "tapegrad"
    imports = {}
    for path in package.glob("*.py"):
        imports[path.stem] = {node.module for node in ast.walk(ast.parse(path.read_text()))
                              if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
    assert len(imports) > 10
    for start in imports:
        seen = set()
        stack = [(start, [start])]
        while stack:
            module, path = stack.pop()
            for imported in imports.get(module, ()):
                assert imported != start, f"import circle: {' → '.join(path + [imported])}"
                if imported not in seen:
                    seen.add(imported)
                    stack.append((imported, path + [imported]))


def test_the_python_package_has_the_library_version():
    import re

    cmake = re.search(r"project\(tapegrad VERSION ([0-9.]+)", (SOURCE_DIR / "CMakeLists.txt").read_text()).group(1)
    pyproject = re.search(r'^version = "([0-9.]+)"', (SOURCE_DIR / "pyproject.toml").read_text(), re.M).group(1)
    assert pyproject == cmake
    assert f"## {cmake} — " in (SOURCE_DIR / "docs" / "changelog.md").read_text()
    import tapegrad
    assert tapegrad.__version__ == cmake
