"""The package's layers run one way: a module imports only modules of its own layer or below; the
tests' kit stays outside the package."""

import ast
import configparser
from fnmatch import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "provided_code"

# Lowest first. data, networks, losses and metrics are peers below training; prediction, the
# clinic's path, the folder scoring and commissioning stand beside training (none imports another,
# tested below); the DICOM node (a server around the clinic's path) above them; the command lines sit on
# top. A module of apps/ has a layer of its own.
LAYERS = (
    ("constants", "errors", "infra", "sites", "beams", "model_spec", "data_folder"),
    ("data", "networks", "losses", "metrics", "dicom", "config", "presets"),
    ("inference", "plots", "run_folder", "folds", "exclusions", "tolerances", "trust", "deployed_model"),
    ("training", "apps.predict", "apps.score_folder", "apps.clinic", "apps.commission"),
    ("apps.node",),
    ("apps.cli", "apps.dicom_cli", "apps.demo", "apps.console", "apps.__init__", "__init__", "__main__"),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
BESIDE_TRAINING = ("apps.predict", "apps.score_folder", "apps.clinic", "apps.commission")


def _top(module: str) -> str:
    """``provided_code.training.step`` -> ``training``; ``provided_code.apps.cli`` -> ``apps.cli``."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    return ".".join(parts[:2]) if parts[0] == "apps" and len(parts) > 1 else parts[0]


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("provided_code"):
            yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("provided_code"):
                    yield alias.name, node.lineno


def test_no_module_imports_one_above_it():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = "provided_code." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        own = _top(module)
        assert own in RANK, f"{path}: put this module into a layer of {__file__}"
        for imported, line in _imports(path):
            other = _top(imported)
            if RANK[other] > RANK[own]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}")
    assert not upward, "imports that run up a layer:\n" + "\n".join(upward)


def test_prediction_does_not_import_training_nor_training_prediction():
    """Prediction, the clinic's path and the folder scoring stand beside training: a trained model
    is loaded from its folder (run_folder), below both."""
    crossing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = _top("provided_code." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        for imported, line in _imports(path):
            other = _top(imported)
            if (own in BESIDE_TRAINING and other == "training") or (own == "training" and other.startswith("apps")):
                crossing.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}")
    assert not crossing, "imports between training and prediction:\n" + "\n".join(crossing)


def test_metrics_does_no_file_io():
    for path in (PACKAGE / "metrics").rglob("*.py"):
        source = path.read_text()
        tree = ast.parse(source)
        calls = {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                 for node in ast.walk(tree) if isinstance(node, ast.Call)}
        assert not calls & {"open", "read_csv", "to_csv", "write_text", "read_text", "write_text_atomic", "load_split",
                            "read_sparse_csv"}, path


def test_only_the_sites_module_knows_openkbps_structure_list():
    """OpenKBP's structures, in its channel order, live in sites/openkbp.json alone: no module
    imports a structure tuple from elsewhere or spells several of the ten names out in a row (an
    OpenKBP phantom's anatomy, names one by one, is data of its own; a list is a second home)."""
    import json

    openkbp_names = {s["name"] for s in json.loads((PACKAGE / "sites" / "openkbp.json").read_text())["structures"]}
    import_of_a_tuple, spelled = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "sites":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any(a.name in ("STRUCTURES", "OARS", "TARGETS", "PRESCRIPTIONS_GY")
                                                        for a in node.names):
                import_of_a_tuple.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                named = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in openkbp_names]
                if len(named) >= 3:
                    spelled.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {named}")
    assert not import_of_a_tuple, "imports of a structure tuple:\n" + "\n".join(import_of_a_tuple)
    assert not spelled, "OpenKBP's structures spelled out outside provided_code/sites:\n" + "\n".join(spelled)


def _modules_named(path: Path):
    """Every module an import of ``path`` names, absolute, with its line (``from a import b`` names
    ``a.b`` when ``a`` is a top-level package: ``from tests import conftest``)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if "." in node.module:
                yield node.module, node.lineno
            else:
                for alias in node.names:
                    yield f"{node.module}.{alias.name}", node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_package_imports_nothing_of_the_tests():
    """The tests and their kit (``tests/kit/``) are outside the product's import graph."""
    found = [f"{path.relative_to(REPO)}:{line} imports {module}" for path in sorted(PACKAGE.rglob("*.py"))
             for module, line in _modules_named(path) if _under(module, "tests")]
    assert not found, "the package imports test code:\n" + "\n".join(found)


def test_the_scripts_and_the_kit_import_of_the_tests_only_the_kit():
    """What the benchmarks share with the tests is the kit: no script imports a test module
    (``tests.test_*``, ``tests.conftest``) or anything else of ``tests/``, and neither does the kit."""
    found = [f"{path.relative_to(REPO)}:{line} imports {module}"
             for path in sorted([*(REPO / "scripts").glob("*.py"), *(REPO / "tests" / "kit").glob("*.py")])
             for module, line in _modules_named(path) if _under(module, "tests") and not _under(module, "tests.kit")]
    assert not found, "imports of tests/ outside tests/kit/:\n" + "\n".join(found)


def test_the_package_ships_no_test_code_and_needs_none_of_its_dependencies():
    """setup.cfg's packages are found by a pattern that leaves ``tests`` and ``tests.kit`` out, and
    scikit-image (the kit's DICOM writer traces contours with it) is in the dev extra only."""
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert setup["options"]["packages"].strip() == "find:", "setup.cfg lists its packages: check it ships no tests"
    include = setup["options.packages.find"]["include"].split()
    assert not [package for package in ("tests", "tests.kit") if any(fnmatch(package, rule) for rule in include)], include
    requirements = {"install_requires": setup["options"]["install_requires"],
                    **{f"extra {name}": text for name, text in setup["options.extras_require"].items()}}
    assert "scikit-image" in requirements.pop("extra dev")
    assert not [where for where, text in requirements.items() if "scikit-image" in text]
def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, modules: set[str]):
    """The package's modules ``path`` imports (at its top or inside a function): ``from a.b import c``
    is the module ``a.b.c`` when there is one, else ``a.b``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("provided_code"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield submodule if submodule in modules else node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("provided_code"))


def test_no_modules_import_each_other_in_a_circle():
    """Imports run one way inside a layer too: no module reaches itself through the modules it
    imports (a circle, even through an import inside a function, means two modules that are one)."""
    paths = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    graph = {name: {other for other in _imported_modules(path, set(paths)) if other in paths and other != name}
             for name, path in paths.items()}

    def reaches(start):
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += graph[name]
        return seen

    circles = sorted(f"{name} <-> {other}" for name in graph for other in graph[name]
                     if name < other and name in reaches(other))
    assert not circles, "modules that import each other (through a chain):\n" + "\n".join(circles)


# No site, model spec or declared inputs are defaulted below the command lines (apps/): the caller (a
# command line's --site, a model's config.json through its ModelSpec) says which; a default would
# make OpenKBP's (or the prostate's) the answer of every caller that forgot to ask. Only a reader of a
# file written before sites existed may take one for OpenKBP's, in its body, not as a default (the
# cache: a file without a `site` attribute; CompactInputs: a checkpoint's layer without the site's
# fields; a config.json without `site`: config.ABSENT_MEANS).
IDENTITY_PARAMETERS = ("site", "spec", "inputs")


def _below_the_command_lines(module: str) -> bool:
    return not _top(module).startswith("apps")


def _site_defaults(tree: ast.AST):
    """``(line, where)`` of each parameter named ``site``, ``spec`` or ``inputs`` with a default,
    and each class attribute ``site`` given one (a dataclass field's default)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = args.posonlyargs + args.args
            defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
            for arg, default in [*zip(positional, defaults), *zip(args.kwonlyargs, args.kw_defaults)]:
                if arg.arg in IDENTITY_PARAMETERS and default is not None:
                    yield node.lineno, f"{getattr(node, 'name', 'lambda')}({arg.arg}={ast.unparse(default)})"
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                        and statement.target.id == "site" and _gives_a_value(statement.value)):
                    yield statement.lineno, f"{node.name}.site = {ast.unparse(statement.value)}"


def _gives_a_value(value: ast.expr | None) -> bool:
    """A class attribute's value is a default unless it is none, or a ``dataclasses.field(...)``
    without ``default`` or ``default_factory`` (``field(kw_only=True)``: a required field)."""
    if value is None:
        return False
    if isinstance(value, ast.Call) and ast.unparse(value.func) in ("dataclasses.field", "field"):
        return any(keyword.arg in ("default", "default_factory") for keyword in value.keywords)
    return True


def test_no_site_or_model_spec_is_defaulted_below_the_command_lines():
    defaulted = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = "provided_code." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if not _below_the_command_lines(module):
            continue
        defaulted += [f"{path.relative_to(PACKAGE.parent)}:{line} {where}"
                      for line, where in _site_defaults(ast.parse(path.read_text()))
                      # the one config of a run: its defaults are the command line's (documented there);
                      # the run's ModelSpec is resolved from it at the edge (config.spec)
                      if not where.startswith("TrainConfig.site")]
    assert not defaulted, "a site or model spec defaulted (say which at the call):\n" + "\n".join(defaulted)


def test_the_development_guide_lists_the_layers():
    """docs/development.md's table of the layers has one row per layer of ``LAYERS``, lowest first,
    naming exactly its modules: the guide cannot go stale unnoticed."""
    import re

    text = (REPO / "docs" / "development.md").read_text()
    table = text[text.index("| layer | what |"):].split("\n\n")[0].splitlines()[2:]
    rows = [tuple(re.findall(r"`([^`]+)`", row.split("|")[1])) for row in table]
    assert rows == [tuple(layer) for layer in LAYERS]
