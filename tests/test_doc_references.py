"""The docs name code that exists: every dotted `kinfolk.…` path quoted in README.md and docs/*.md imports (a module,
or a name a module defines), and every repository path quoted there exists, so a move or a rename that forgets a
page fails here rather than in a reader's hands."""

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOTTED = re.compile(
    r"`(kinfolk(?:\.\w+)+)"
)  # at the start of a quoted span: `kinfolk.drift.log`, `kinfolk.drift.log.load_run(...)`
QUOTED_PATH = re.compile(r"`((?:kinfolk|plugins|trainers|callbacks|eval_tasks|tests|tools|bench|examples)/[\w./-]+)`")


def axolotl_keys() -> set[str]:
    """The keys of the `kinfolk:` block of an axolotl config (docs/axolotl.md quotes them as `kinfolk.<key>`), read
    from the plugin's options without importing axolotl."""
    tree = ast.parse((REPO / "kinfolk" / "integrations" / "axolotl" / "args.py").read_text(encoding="utf-8"))
    options = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "KinfolkOptions")
    return {f"kinfolk.{node.target.id}" for node in options.body if isinstance(node, ast.AnnAssign)}


def resolves(dotted: str) -> bool:
    """Whether `dotted` is a kinfolk module or a name reached from one by attributes."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError as error:
            if error.name != ".".join(parts[:end]):
                raise  # the module exists but fails to import: a real error, not a stale name
            continue
        for name in parts[end:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_the_resolver_tells_real_paths_from_stale_ones():
    assert resolves("kinfolk.drift.log.load_run") and resolves("kinfolk.plugins.atlantis")
    assert not resolves("kinfolk.trainers.atlantis") and not resolves("kinfolk.drift.log.no_such_name")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_quoted_kinfolk_path_imports(page):
    text = page.read_text(encoding="utf-8")
    quoted = {name.rstrip(".") for name in DOTTED.findall(text)} - axolotl_keys()
    quoted = {name for name in quoted if not name.startswith("kinfolk.integrations.axolotl")}  # needs axolotl
    assert not [name for name in sorted(quoted) if not resolves(name)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_quoted_repository_path_exists(page):
    quoted = set(QUOTED_PATH.findall(page.read_text(encoding="utf-8")))
    assert not [path for path in sorted(quoted) if not (REPO / path.rstrip(".")).exists()]
