"""What a module imports, read from its source: the import-direction tests ask it."""

from __future__ import annotations

import ast
from pathlib import Path


def top_level_imports(path: Path) -> set[str]:
    """The top-level packages a module imports, wherever in it the import stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found
