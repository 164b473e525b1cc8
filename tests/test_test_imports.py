"""No test module imports another test module: what tests share lives in a `tests/<topic>_helpers.py` module (or, for
fixtures, in conftest.py), so that a test file can be run, moved or deleted alone.

Every `import` in every Python file under tests/ and in conftest.py is read with `ast` (those inside functions too),
and an imported name counts as a test module when it is one of the suite's files named as pytest collects them:
`test_*` (tests/ is on the path) or `tests.test_*`.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(REPO / "tests").rglob("*.py"), REPO / "conftest.py"])


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for each import; `from package import name` yields `package.name` too, as it may be a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def is_test_module(module: str) -> bool:
    """`test_x` (tests/ is on the path) or `tests.test_x` / `tests.gpu.test_x`; not a name like
    `kinfolk.eval_tasks.execution.test_program`, a function of the package."""
    parts = module.split(".")
    return parts[-1].startswith("test_") and (len(parts) == 1 or parts[0] == "tests")


def test_modules_among(imports: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(line, module) for line, module in imports if is_test_module(module)]


test_modules_among.__test__ = False  # a helper, not a test


def test_no_file_under_tests_imports_a_test_module():
    assert len(SOURCES) > 50  # the walk found the suite
    found = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in SOURCES
        for line, module in test_modules_among(imported_modules(ast.parse(path.read_text(encoding="utf-8"))))
    ]
    assert found == []


def test_the_check_finds_each_way_of_importing_a_test_module():
    source = """
import test_a
import tests.test_b as b
from test_c import helper
from tests import test_d
from tests.test_e import helper


def inside():
    from test_f import helper
"""
    assert test_modules_among(imported_modules(ast.parse(source))) == [
        (2, "test_a"),
        (3, "tests.test_b"),
        (4, "test_c"),
        (5, "tests.test_d"),
        (6, "tests.test_e"),
        (10, "test_f"),
    ]
    helpers = "from sft_helpers import config\nimport two_process_helpers\nfrom kinfolk.eval_tasks.execution import test_program\n"
    assert test_modules_among(imported_modules(ast.parse(helpers))) == []
