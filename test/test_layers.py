"""No module imports a higher layer (docs/architecture.md): read from the imports themselves."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "sglang_evs"

# A folder's modules may import only these of the package's folders (besides its own and the top-level
# sglang_compat, trace and served modules, which import nothing of the package).
ALLOWED = {
    "methods": set(),
    "runtime": set(),
    "multimodal": set(),
    "pruning": {"methods", "multimodal"},
    "models": {"methods", "multimodal", "pruning"},
    "testing": {"methods", "runtime"},
    "bench": {"methods", "models", "pruning", "testing", "runtime"},
}


def imported_folders(path: Path) -> set[str]:
    folders = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            parts = name.split(".")
            if parts[0] == "sglang_evs" and len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
                folders.add(parts[1])
    return folders


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_a_folder_imports_no_higher_layer(folder):
    for path in sorted((PACKAGE / folder).glob("*.py")):
        above = imported_folders(path) - ALLOWED[folder] - {folder}
        assert not above, f"{path.relative_to(PACKAGE)} imports {sorted(above)}"


@pytest.mark.parametrize("module", ["sglang_compat.py", "trace.py", "served.py"])
def test_the_bottom_modules_import_nothing_of_the_package(module):
    tree = ast.parse((PACKAGE / module).read_text())
    imported = [
        "sglang_evs" if node.level else node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    ]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert not [name for name in imported if name.split(".")[0] == "sglang_evs"], module


def test_the_pruning_map_names_every_module():
    described = ast.get_docstring(ast.parse((PACKAGE / "pruning" / "__init__.py").read_text()))
    modules = sorted(path.name for path in (PACKAGE / "pruning").glob("*.py") if path.name != "__init__.py")
    assert [name for name in modules if f"  {name} " not in described] == []


def test_the_check_sees_an_import_across_layers(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from sglang_evs.models.registry import MODELS\nimport sglang_evs.bench.ratios\n")
    assert imported_folders(module) == {"models", "bench"}
