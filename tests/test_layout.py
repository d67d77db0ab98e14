"""The package's structure: no import cycles (imports inside functions included), the
import rule of docs/design.md §The import rule, the kernel package's depth, ruff clean, a
README layout section that matches the tree, and design citations that name a section of
docs/design.md."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = SRC / "distnn"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(module: str) -> set[str]:
    """Every distnn module ``module`` imports, at top level or inside functions. ``from X
    import name`` counts as importing X.name when that is a module, else X."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = (_resolve(module, is_package, node.level, node.module) if node.level
                      else node.module or "")
            names = []
            for alias in node.names:
                sub = f"{origin}.{alias.name}"
                names.append(sub if sub in MODULES else origin)
        else:
            continue
        found.update(n for n in names if n.split(".")[0] == "distnn" and n != module)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_import_of_distnn_resolves():
    # A lazy import of a module that no longer exists only fails when its function runs.
    missing = {m: sorted(d for d in deps if d not in MODULES) for m, deps in GRAPH.items()}
    assert {m: d for m, d in missing.items() if d} == {}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_lazy_imports():
    # A check that cannot fail is no check: the parser must see an import made inside a
    # function body (run.build imports the model zoo lazily).
    assert "distnn.models" in GRAPH["distnn.run.build"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def _levels(graph: dict[str, set[str]], prefix: str) -> dict[str, list[str]]:
    """Per module of package ``prefix`` (its __init__ included), its longest chain of
    imports inside the package, itself first: the module's level is the chain's length
    (a module that imports none of the others is on level 1). The graph has no cycles."""
    inside = {m: {d for d in deps if d == prefix or d.startswith(prefix + ".")} - {m}
              for m, deps in graph.items() if m == prefix or m.startswith(prefix + ".")}
    chains: dict[str, list[str]] = {}

    def chain(m: str) -> list[str]:
        if m not in chains:
            chains[m] = [m] + max((chain(d) for d in sorted(inside[m])), key=len, default=[])
        return chains[m]
    return {m: chain(m) for m in inside}


KERNEL_LEVELS = 8  # issue 57: shared types on the ground floor, the registry above the methods


def test_the_levels_are_the_longest_chains():
    toy = {"p": {"p.a", "p.b"}, "p.a": {"p.b", "q"}, "p.b": set(), "q": {"p.b"}}
    assert {m: len(c) for m, c in _levels(toy, "p").items()} == {"p": 3, "p.a": 2, "p.b": 1}
    assert _levels(toy, "p")["p"] == ["p", "p.a", "p.b"]


def test_the_kernel_package_is_at_most_8_import_levels_deep():
    # imports inside functions count (GRAPH sees them), so a level is not hidden by one
    deepest = max(_levels(GRAPH, "distnn.kernels").values(), key=len)
    assert len(deepest) <= KERNEL_LEVELS, " -> ".join(deepest)


def _imports_under(prefix: str) -> dict[str, set[str]]:
    return {m: deps for m, deps in GRAPH.items()
            if m == prefix or m.startswith(prefix + ".")}


ONE_WAY = [
    ("distnn.kernels", ("distnn.",)),  # kernels import nothing of distnn
    ("distnn.fileio", ("distnn.",)),
    ("distnn.nn", ("distnn.distributed", "distnn.training", "distnn.rules", "distnn.cli",
                   "distnn.data")),
    ("distnn.optim", ("distnn.distributed", "distnn.training", "distnn.rules", "distnn.cli")),
    ("distnn.data", ("distnn.distributed", "distnn.training", "distnn.rules", "distnn.cli")),
    ("distnn.distributed", ("distnn.training", "distnn.rules", "distnn.cli")),
    ("distnn.rules", ("distnn.training", "distnn.cli")),
    ("distnn.training", ("distnn.cli", "distnn.search", "distnn.run")),
    ("distnn.run", ("distnn.cli", "distnn.search")),
    ("distnn.search", ("distnn.cli",)),  # search -> training -> rules -> distributed
    ("distnn.models", ("distnn.torch", "distnn.distributed", "distnn.training",
                       "distnn.run", "distnn.cli")),  # the run builder wraps torch modules
    # the cost model reads the rules' declarations; the launcher reads checkpoints; the
    # emulated cluster runs commands: none of them imports the others' concepts or above
    ("distnn.costmodel", ("distnn.training", "distnn.run", "distnn.cli", "distnn.launch",
                          "distnn.cluster", "distnn.search")),
    ("distnn.launch", ("distnn.run", "distnn.cli", "distnn.costmodel", "distnn.cluster",
                       "distnn.search", "distnn.rules", "distnn.distributed")),
    ("distnn.cluster", ("distnn.run", "distnn.cli", "distnn.costmodel", "distnn.training",
                        "distnn.search", "distnn.rules", "distnn.distributed")),
    # torch modules in distnn's trainer come from run/ (TorchModel is the Model protocol);
    # hvd.elastic reads the launcher's commit store
    ("distnn.torch", ("distnn.training", "distnn.rules", "distnn.run", "distnn.cli",
                      "distnn.search", "distnn.models", "distnn.costmodel", "distnn.cluster")),
]
# the top of the house: what may import every package
TOP = {"distnn.cli"}


@pytest.mark.parametrize("lower, forbidden", ONE_WAY)
def test_layers_import_one_way(lower, forbidden):
    bad = {m: sorted(d for d in deps if d.startswith(forbidden) and not d.startswith(lower))
           for m, deps in _imports_under(lower).items()}
    assert {m: d for m, d in bad.items() if d} == {}


def test_every_package_has_an_import_rule():
    # A new package (launch/, costmodel/, cluster/ were once cluster/) is held to the rule
    # only once it has a line above: a package without one fails here.
    top_level = {".".join(m.split(".")[:2]) for m in MODULES if m != "distnn"}
    assert top_level - {lower for lower, _ in ONE_WAY} - TOP == set()
    assert {lower for lower, _ in ONE_WAY} | TOP <= top_level  # no line for a gone package


def test_only_the_distributed_package_imports_mpi4py():
    users = []
    for module, path in MODULES.items():
        if module.startswith("distnn.distributed"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "mpi4py" for n in names):
                users.append(module)
    assert users == []


def test_old_dist_name_still_works():
    import distnn
    import distnn.dist
    from distnn import dist
    assert dist is distnn.distributed is distnn.dist


def test_no_package_is_named_like_build_output():
    # ruff's and black's default excludes (and many .gitignore templates) skip these.
    skipped = {"dist", "build", "_build", "site-packages", "node_modules"}
    assert sorted(p.name for p in PKG.rglob("*") if p.is_dir() and p.name in skipped) == []


def _ruff() -> list[str] | None:
    exe = Path(sys.executable).parent / "ruff"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ruff")
    return [found] if found else None


def test_ruff_is_clean():
    ruff = _ruff()
    assert ruff is not None, "ruff is in the [test] extra: run bash scripts/setup.sh"
    proc = subprocess.run(ruff + ["check", "--output-format", "concise", "src", "tests",
                                  "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The MPI layer is really checked (not excluded as build output).
    listed = subprocess.run(ruff + ["check", "--show-files", "src"], cwd=ROOT,
                            capture_output=True, text=True).stdout
    assert "distributed/comm.py" in listed


def test_readme_layout_matches_the_tree():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\s*(?:src/distnn/)?([a-z_]+)/\s", section, re.M))
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert packages - listed == set(), "packages missing from README's Layout section"
    assert listed - packages - {"src", "tests", "benchmarks", "scripts", "examples",
                                "distnn"} == set(), "README lists packages that do not exist"


DESIGN_DOC = ROOT / "docs" / "design.md"
# A citation: docs/design.md, a section sign, then the section's name up to the first
# ) , ; : quote or backquote, or the end of the line.
CITATION = re.compile(r"docs/design\.md §([^),;:`'\"\n]+)")


def _design_sections() -> list[str]:
    """docs/design.md's headings without their numbers ("4.4 One step: ..." -> "One
    step: ...")."""
    headings = re.findall(r"^#{2,4} +(.+?)\s*$", DESIGN_DOC.read_text(), re.M)
    return [re.sub(r"^\d+(\.\d+)*\.? +", "", h) for h in headings]


def _cited_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in ("src", "tests", "benchmarks"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def test_design_citations_name_sections_that_exist():
    # Citations of the house rules used to name a file outside the repository; each one now
    # names a heading of docs/design.md (its section on gradient averaging, its rule 6).
    sections = _design_sections()
    assert {"Gradient averaging", "Randomness and seeds", "The import rule"} <= set(sections)
    assert any(s.startswith("Rule 7:") for s in sections)
    bad, cited = [], 0
    for path in _cited_files():
        text = path.read_text(errors="replace")
        for name in CITATION.findall(text):
            name = name.strip().rstrip(".")
            cited += 1
            if not any(s == name or s.startswith(name + ":") for s in sections):
                bad.append(f"{path.relative_to(ROOT)}: §{name}")
        if re.search(r"\bDESIGN(\.md| rule)", text):
            bad.append(f"{path.relative_to(ROOT)}: cites DESIGN outside the repository")
    assert cited >= 5  # the check sees the citations it is meant to check
    assert bad == []


def test_test_modules_have_unique_names():
    """The test folders are not packages, so pytest imports each test file by its name
    alone: two ``test_plan.py`` in two folders stop the whole suite at collection ("import
    file mismatch"), which happened once."""
    seen: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("*.py"):
        if path.name != "conftest.py" and "__pycache__" not in path.parts:
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
