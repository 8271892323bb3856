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
