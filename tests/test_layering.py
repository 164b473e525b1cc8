"""Imports point down only: foundations ← components ← apps.

Every `import` in the installed package is read with `ast` (those inside functions too, where upward imports hide)
and checked against the layer of the importing module:

1. foundations (kinfolk's shared cores: tokens, logprobs, layout, atomic, tensors, stats, divergence, drift, figures,
   data, compat, ...) import no kinfolk component and no app;
2. components (plugins, trainers, callbacks, eval_tasks) import foundations, never an app, and another component
   only along a listed edge of a method's own pipeline;
3. apps (the command line, `kinfolk compare`, the lab, and the integrations into other tools such as axolotl) may
   import anything.
"""

import ast
from pathlib import Path

import pytest

from kinfolk.lazy import lazy_exports

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"kinfolk": "kinfolk", "plugins": "kinfolk.plugins", "trainers": "kinfolk.trainers",
           "callbacks": "kinfolk.callbacks", "eval_tasks": "kinfolk.eval_tasks"}  # fmt: skip
COMPONENTS = ("kinfolk.plugins", "kinfolk.trainers", "kinfolk.callbacks", "kinfolk.eval_tasks")
APPS = ("kinfolk.commands", "kinfolk.compare", "kinfolk.lab", "kinfolk.integrations", "kinfolk.__main__")
# The package root registers the ATLAS tuner when PEFT is imported: `import kinfolk` must make adapters loadable.
ROOT_EXCEPTIONS = {"kinfolk.plugins.atlas"}
# Component -> component edges inside one method's pipeline, with the reason.
SIDEWAYS = {
    ("kinfolk.trainers.layer_distillation_trainer", "kinfolk.plugins.adapt.layer_map"): "ADAPT's distillation aligns "
    "each student layer with the teacher block that ADAPT's layer map names",
    ("kinfolk.callbacks", "kinfolk.eval_tasks"): "measurement: the lm-eval callback runs kinfolk's own tasks",
    ("kinfolk.plugins.adapt.distillation", "kinfolk.trainers"): "ADAPT's distillation runs the layer-distillation "
    "trainer between its init-student and delta merges",
}


def module_name(path: Path) -> str:
    relative = path.relative_to(REPO)
    parts = [FOLDERS[relative.parts[0]], *relative.parts[1:]]
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(".".join(parts).split("."))


def within(name: str, prefixes) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def layer(name: str) -> str:
    if within(name, APPS):
        return "app"
    if within(name, COMPONENTS):
        return "component"
    return "foundation"


def lazy_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """The modules a package imports on first use of their names (`kinfolk.lazy.lazy_exports(__name__, EXPORTS)`,
    EXPORTS a dict literal of {module: names}, given inline or by a module-level name)."""
    literals = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports" and len(node.args) == 2:
            exports = node.args[1]
            exports = literals.get(exports.id) if isinstance(exports, ast.Name) else exports
            found += [(key.lineno, key.value) for key in getattr(exports, "keys", []) if isinstance(key, ast.Constant)]
    return found


def kinfolk_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = lazy_imports(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if within(name, ("kinfolk",))]


def allowed(importer: str, imported: str) -> bool:
    mine, theirs = layer(importer), layer(imported)
    if mine == "app" or imported == "kinfolk":  # `from kinfolk import __version__`
        return True
    if importer == "kinfolk" and imported in ROOT_EXCEPTIONS:
        return True
    if mine == "foundation":
        return theirs == "foundation"
    if theirs == "app":
        return False
    if theirs == "foundation" or importer.split(".")[:2] == imported.split(".")[:2]:
        return True
    return any(within(importer, (source,)) and within(imported, (target,)) for source, target in SIDEWAYS)


def installed_modules() -> list[Path]:
    return sorted(path for folder in FOLDERS for path in (REPO / folder).rglob("*.py"))


def test_the_tree_is_read():
    names = {module_name(path) for path in installed_modules()}
    assert {
        "kinfolk.tokens",
        "kinfolk.divergence.kernels",
        "kinfolk.plugins.atlas.layer",
        "kinfolk.commands.sft",
    } <= names


@pytest.mark.parametrize("path", installed_modules(), ids=lambda path: str(path.relative_to(REPO)))
def test_imports_point_down(path):
    importer = module_name(path)
    wrong = [f"line {line}: {name}" for line, name in kinfolk_imports(path) if not allowed(importer, name)]
    assert not wrong, f"{importer} ({layer(importer)}) imports upward or sideways: {wrong}"


def test_the_rule_catches_upward_imports():
    assert not allowed("kinfolk.tokens", "kinfolk.plugins.atlantis")  # foundation -> component
    assert not allowed("kinfolk.divergence.caches", "kinfolk.commands")  # foundation -> app
    assert not allowed("kinfolk.trainers.weighted_sft_trainer", "kinfolk.plugins.atlas.config")  # sideways
    assert not allowed("kinfolk.plugins.atlas.config", "kinfolk.commands.sft_atlas_options")  # component -> app
    assert not allowed("kinfolk.callbacks.evaluation", "kinfolk.lab.demo.report")  # component -> app
    assert allowed("kinfolk.commands.sft_atlas_options", "kinfolk.plugins.atlas.config")  # apps compose components
    assert allowed("kinfolk.plugins.adapt.plan", "kinfolk.plugins.adapt.checkpoint")  # inside one component
    assert allowed("kinfolk.integrations.axolotl.plugin", "kinfolk.commands.sft_atlas_options")  # an app
    assert not allowed("kinfolk.callbacks.retained_kl", "kinfolk.integrations.axolotl.args")  # component -> app


# ------------------------------------------------------------------------------------------ import circles
MODULES = {module_name(path): path for path in installed_modules()}


def is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def imported_modules(importer: str) -> set[str]:
    """The kinfolk modules `importer` runs when its imports run (those inside functions too): each imported module
    (`from X import Y` imports X.Y when Y is a submodule) and the packages above it that do not hold `importer`
    (importing X.Y runs X's `__init__` first, unless X is already being imported as the importer's parent)."""
    tree = ast.parse(MODULES[importer].read_text(encoding="utf-8"))
    names = {name for _, name in lazy_imports(tree)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES}
            names |= submodules
            if len(submodules) < len(node.names):  # a name X itself defines (or re-exports): X's own code runs
                names.add(node.module)
    found = set()
    for name in names:
        if not within(name, ("kinfolk",)) or name == "kinfolk":
            continue  # the root sets `__version__` before anything and imports the tuner only from PEFT's import hook
        parts = name.split(".")
        for end in range(1, len(parts) + 1):
            above = ".".join(parts[:end])
            if above in MODULES and (above == name or not within(importer, (above,))):
                found.add(above)
    return found


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, and modules importing themselves (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(node: str) -> None:  # iterative enough for a tree of a few hundred modules
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_import_circle():
    graph = {name: imported_modules(name) for name in MODULES}
    circles = import_circles(graph)
    assert not circles, "import circles (imports inside functions count): " + "; ".join(
        " <-> ".join(circle) for circle in circles
    )


def test_the_circle_finder_finds_circles_and_self_imports():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"a"}, "b": set()}) == [["a"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_a_lazy_export_counts_as_an_import_of_its_package():
    assert "kinfolk.plugins.adapt.api" in imported_modules("kinfolk.plugins.adapt")
    lazy = {name for _, name in kinfolk_imports(REPO / "trainers" / "__init__.py")}
    assert "kinfolk.trainers.weighted_sft_trainer" in lazy


def test_an_outside_import_runs_the_package_init_and_a_submodule_counts():
    assert "kinfolk.lab.protocol" in imported_modules("kinfolk.lab.methods.selection")  # runs protocol/__init__
    assert "kinfolk.lab.protocol" not in imported_modules("kinfolk.lab.protocol.runner")  # its own package
    assert "kinfolk.lab.protocol.views" in imported_modules("kinfolk.lab.protocol.runner")


# ------------------------------------------------------------------------------------------ experiments apart
EXPERIMENTS = "kinfolk.lab.experiments"


def experiment_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[3] if within(name, (EXPERIMENTS,)) and len(parts) > 3 else None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_experiment_imports_another_or_a_private_name_of_another_module(name):
    mine = experiment_of(name)
    wrong = []
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and within(node.module, ("kinfolk",)):
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.endswith("__")]
            wrong += [f"line {node.lineno}: {node.module}.{name}" for name in private]
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        wrong += [f"line {node.lineno}: {t}" for t in targets if mine and experiment_of(t) not in (None, mine)]
    assert not wrong, f"{name} imports another experiment or another module's private name: {wrong}"


def test_a_lazily_exported_name_cannot_be_its_own_submodule():
    # `from kinfolk.compare import verdicts` gave the function until `kinfolk.compare.verdicts` was imported, then
    # the module: the order tests ran in decided which
    with pytest.raises(ValueError, match=r"kinfolk\.example exports verdicts, the name of its own submodule"):
        lazy_exports("kinfolk.example", {"kinfolk.example.verdicts": ("Verdict", "verdicts")})
