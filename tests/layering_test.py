#!/usr/bin/env python3
"""The include graph against the layers of docs/architecture.md: a layer includes only itself
and the layers below it.

    layering_test.py SOURCE_DIR
    layering_test.py selftest      the check on a small tree with one of each mistake

The layers are the rows of the table under "## Layers" in docs/architecture.md, the top layer
first; its "files" column names each layer's files in backticks: a path with a folder is
relative to the source tree (`*` matches within a folder, `**` across folders), a bare name is
a public header in include/ulysses/. An exact path beats a glob; a file two globs of different
layers match, or none, is an error, so every new file is placed in the table. The paragraph
starting "**White-box headers**" names the only src/ headers code outside src/ may include.

Every `#include "…"` and `#include <ulysses/…>` of every C++ file under include/ulysses, src,
tools, python/src, examples, tests and bench is resolved (the including file's folder, then the
targets' include folders) and fails the test when it
  - goes to a higher layer (upward),
  - climbs out of its top folder by a relative path ("../src/…": past the include folders
    the build declares),
  - reaches a src/ header from outside src/ that is not white-box,
  - or names a file that does not exist (what cannot be resolved cannot be checked).
Prints "layering OK" and the counts when there is nothing to report.
"""

import pathlib
import re
import sys

import tree_checks

SCANNED = ["include/ulysses", "src", "tools", "python/src", "examples", "tests", "bench"]
SUFFIXES = {".cpp", ".hpp", ".h", ".cc", ".cu"}
# The include folders the build gives its targets (CMakeLists.txt), after the file's own.
INCLUDE_DIRS = ["include", "src", "tools", "tests", "tests/emulation"]
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(ulysses/[^>]+)>)', re.M)
CODE = re.compile(r"`([^`]+)`")


def parse_layers(doc):
    """[(name, [patterns])] top layer first, and the white-box patterns, from the doc."""
    lines = doc.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## Layers"))
    layers, white_box, in_white_box = [], [], False
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        in_white_box = line.startswith("**White-box headers**") or (in_white_box and line.strip() != "")
        if in_white_box:
            white_box += CODE.findall(line)
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        patterns = [p if "/" in p else "include/ulysses/" + p for p in CODE.findall(cells[1])]
        layers.append((cells[0], patterns))
    if not layers:
        sys.exit(f"{doc}: no layer table under '## Layers'")
    return layers, white_box


def matches(path, pattern):
    # fnmatch's * crosses '/': keep it inside one folder, and let ** cross them.
    regex = re.escape(pattern).replace(r"\*\*", "\0").replace(r"\*", "[^/]*").replace("\0", ".*")
    return re.fullmatch(regex, path) is not None


def layer_of(path, layers):
    """(index, error): index 0 is the top layer."""
    exact = [i for i, (_, pats) in enumerate(layers) if path in pats]
    if exact:
        return exact[0], None
    hits = sorted({i for i, (_, pats) in enumerate(layers) for p in pats if "*" in p and matches(path, p)})
    if len(hits) == 1:
        return hits[0], None
    if not hits:
        return None, f"{path}: in no layer of the table"
    return None, f"{path}: in several layers ({', '.join(layers[i][0] for i in hits)}): name it exactly"


def resolve(root, source, name):
    """The included file, relative to root, or None."""
    here = (root / source).parent
    for base in [here] + [root / d for d in INCLUDE_DIRS]:
        candidate = (base / name).resolve()
        if candidate.is_file():
            try:
                return candidate.relative_to(root.resolve()).as_posix()
            except ValueError:
                return None
    return None


def check(root):
    layers, white_box = parse_layers(root / "docs/architecture.md")
    files = sorted(
        p.relative_to(root).as_posix()
        for d in SCANNED
        for p in (root / d).rglob("*")
        if p.suffix in SUFFIXES and p.is_file()
    )
    errors, edges = [], 0
    for f in files:
        _, err = layer_of(f, layers)
        if err:
            errors.append(err)
    for f in files:
        mine, _ = layer_of(f, layers)
        for m in INCLUDE.finditer((root / f).read_text(errors="replace")):
            name = m.group(1) or m.group(2)
            target = resolve(root, f, name)
            where = f"{f}: #include {name!r}"
            if target is None:
                errors.append(f"{where}: no such file (in its folder or {', '.join(INCLUDE_DIRS)})")
                continue
            edges += 1
            theirs, _ = layer_of(target, layers)
            if mine is None or theirs is None:
                continue  # reported above
            top = f.split("/")[0]
            if name.startswith("../") and target.split("/")[0] != top:
                errors.append(f"{where}: reaches out of {top}/ by a relative path; include it through the build")
            if theirs < mine:
                errors.append(f"{where}: upward, from {layers[mine][0]} to {layers[theirs][0]}")
            if target.startswith("src/") and not f.startswith("src/"):
                if not any(matches(target, p) for p in white_box):
                    errors.append(f"{where}: a src/ header outside src/ that is not white-box")
    return errors, len(files), edges, len(layers)


SELFTEST_DOC = """# Architecture
## Layers
| layer | files | owns |
|---|---|---|
| tests | `tests/**` | tests |
| upper | `upper.hpp`, `src/upper/*` | the upper layer |
| lower | `lower.hpp`, `src/lower/*`, `src/lower/odd.cpp` | the lower layer |

**White-box headers**: `src/lower/open.hpp`.
## Next
"""
SELFTEST_FILES = {
    "include/ulysses/upper.hpp": '#include "ulysses/lower.hpp"\n',
    "include/ulysses/lower.hpp": "#pragma once\n",
    "src/lower/open.hpp": "",
    "src/lower/closed.hpp": "",
    "src/lower/odd.cpp": '#include "ulysses/lower.hpp"\n',
    "src/upper/up.cpp": '#include "ulysses/upper.hpp"\n#include "lower/open.hpp"\n',
    "tests/t.cpp": '#include <ulysses/upper.hpp>\n#include "lower/open.hpp"\n',
}
# Each mistake, the file it goes in, and what the report must say.
SELFTEST_MISTAKES = [
    ("src/lower/bad.cpp", '#include "ulysses/upper.hpp"\n', "upward, from lower to upper"),
    ("tests/path.cpp", '#include "../src/lower/open.hpp"\n', "reaches out of tests/ by a relative path"),
    ("tests/private.cpp", '#include "lower/closed.hpp"\n', "a src/ header outside src/ that is not white-box"),
    ("tests/missing.cpp", '#include "ulysses/nowhere.hpp"\n', "no such file"),
    ("tools/stray.cpp", "", "tools/stray.cpp: in no layer of the table"),
]


def selftest():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)

        def write(files):
            tree_checks.write_tree(root, files)

        write({"docs/architecture.md": SELFTEST_DOC, **SELFTEST_FILES})
        errors, *_ = check(root)
        assert errors == [], f"a clean tree reported {errors}"
        for path, text, expected in SELFTEST_MISTAKES:
            write({path: text})
            errors, *_ = check(root)
            assert len(errors) == 1 and expected in errors[0], f"{path}: expected {expected!r}, got {errors}"
            (root / path).unlink()
        # src/upper/odd.hpp: in upper by src/upper/*, in lower by src/*/odd.*.
        ambiguous = SELFTEST_DOC.replace("`src/lower/odd.cpp`", "`src/*/odd.*`")
        write({"src/upper/odd.hpp": "", "docs/architecture.md": ambiguous})
        errors, *_ = check(root)
        assert any("in several layers" in e for e in errors), errors
    print(f"layering selftest OK: a clean tree passes, {len(SELFTEST_MISTAKES) + 1} kinds of mistake are reported")


def report(root):
    errors, files, edges, layers = check(root)
    return (
        errors,
        f"layering OK: {files} files in {layers} layers, {edges} includes, none upward",
        f"layering: {len(errors)} problem(s) (docs/architecture.md's table is the rule)",
    )


if __name__ == "__main__":
    tree_checks.main(__doc__, report, selftest)
