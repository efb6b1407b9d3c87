#!/usr/bin/env python3
"""No strategy's name is written outside its own file: what a strategy does is asked of it
(its traits, its virtuals, its options, the registry), never decided by comparing its name.

    strategy_names_test.py SOURCE_DIR
    strategy_names_test.py selftest      the check on a small tree with one of each mistake

The names are those the strategy files declare (`StrategyTraits{.name = "…"` in
src/cp/strategies/*.cpp). Every string literal of the library, the tools and the binding (C++
outside comments; Python through its syntax tree) that equals one of them fails the test,
unless it is
  - in the strategy file that declares it (its own name, nowhere another's),
  - an entry of ALLOWED below, each with its reason,
  - or, in Python, a docstring (documentation, run as doctests) or a parameter's default (the
    signature shows the default; the library looks it up in the registry like any name).
Tests, benchmarks, examples and docs name the strategies they check, measure and explain, and
are not scanned. Prints "strategy names OK" and the counts when there is nothing to report.
"""

import ast
import re
import sys

import tree_checks

CPP_DIRS = ["include/ulysses", "src", "tools", "python/src"]
PY_DIRS = ["python/ulysses"]
CPP_SUFFIXES = {".cpp", ".hpp", ".h", ".cc", ".cu"}
NAME = re.compile(r'StrategyTraits\s*\{\s*\.name\s*=\s*"([^"]+)"')
# Comments and character literals are matched so that what they hold is not taken for a string.
TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|"((?:\\.|[^"\\\n])*)"|\'(?:\\.|[^\'\\\n])*\'', re.S)
ALLOWED = {
    ("include/ulysses/cp/cp_config.hpp", "a2a"): "CpConfig's default cp_comm_type (Megatron's): the one place the "
    "default is written; the tools and the balancer read CpConfig().cp_comm_type",
    (
        "include/ulysses/comm/communicator.hpp",
        "p2p",
    ): "isend's default byte-counter name (point-to-point), not the strategy",
}


def declared_names(root):
    """{name: the strategy file declaring it}."""
    names = {}
    for f in sorted((root / "src/cp/strategies").glob("*.cpp")):
        for name in NAME.findall(f.read_text()):
            names[name] = f.relative_to(root).as_posix()
    if not names:
        sys.exit(f"{root}/src/cp/strategies: no strategy declares a name")
    return names


def cpp_literals(text):
    """(line, string) of every string literal outside comments."""
    for m in TOKEN.finditer(text):
        if m.group(1) is not None:
            yield text.count("\n", 0, m.start()) + 1, m.group(1)


def py_literals(text):
    """(line, string) of every str constant but docstrings and parameter defaults."""
    tree = ast.parse(text)
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skipped.add(id(first.value))
        if isinstance(node, ast.arguments):
            skipped.update(id(d) for d in node.defaults + node.kw_defaults if d is not None)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            yield node.lineno, node.value


def files_of(root, dirs, suffixes):
    return sorted(p for d in dirs for p in (root / d).rglob("*") if p.suffix in suffixes and p.is_file())


def check(root):
    names = declared_names(root)
    errors, scanned = [], 0
    sources = [(f, cpp_literals) for f in files_of(root, CPP_DIRS, CPP_SUFFIXES)]
    sources += [(f, py_literals) for f in files_of(root, PY_DIRS, {".py"})]
    for f, literals in sources:
        scanned += 1
        rel = f.relative_to(root).as_posix()
        for line, s in literals(f.read_text(errors="replace")):
            if s in names and names[s] != rel and (rel, s) not in ALLOWED:
                errors.append(f"{rel}:{line}: the strategy name {s!r} outside {names[s]}: ask the strategy instead")
    ok = f"strategy names OK: {len(names)} strategies, {scanned} files, no name outside its own file"
    return errors, ok, f"strategy names: {len(errors)} outside their files"


SELFTEST_FILES = {
    "src/cp/strategies/ring.cpp": 'return make(StrategyTraits{.name = "ring"});\n',
    "src/cp/strategies/star.cpp": 'return make(StrategyTraits{\n    .name = "star"});\n'
    '// a comment may say "ring"\nconst char* q = "\\"ring\\" quoted";\n',
    "include/ulysses/cp/cp_config.hpp": '// the default is "ring"\n',
    "python/ulysses/ok.py": 'def f(strategy="ring"):\n    """f(strategy="ring")"""\n',
}
# Each mistake, the file it goes in, and what the report must say.
SELFTEST_MISTAKES = [
    (
        "src/plan/bad.cpp",
        'bool ring(const Row& r) { return r.name == "ring"; }\n',
        "src/plan/bad.cpp:1: the strategy name 'ring'",
    ),
    (
        "src/cp/strategies/other.cpp",
        'return make(StrategyTraits{.name = "other"});\nauto x = "star";\n',
        "src/cp/strategies/other.cpp:2: the strategy name 'star' outside src/cp/strategies/star.cpp",
    ),
    (
        "python/ulysses/bad.py",
        'def f(s):\n    return s == "star"\n',
        "python/ulysses/bad.py:2: the strategy name 'star'",
    ),
]


def selftest():
    tree_checks.selftest_mistakes("strategy names", check, SELFTEST_FILES, SELFTEST_MISTAKES)


if __name__ == "__main__":
    tree_checks.main(__doc__, check, selftest)
