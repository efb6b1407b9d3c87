#!/usr/bin/env python3
"""Documentation that cannot rot: links, command blocks and docstrings, checked.

    docs_test.py links    SOURCE_DIR
    docs_test.py commands SOURCE_DIR BUILD_DIR PYTHON
    docs_test.py python   SOURCE_DIR BUILD_DIR

links:    every relative link and #anchor of every markdown file resolves (GitHub's slugs).
commands: every ```sh block of the RUN_FILES runs and succeeds, in order, one bash per file,
          in a scratch folder where build/ is BUILD_DIR and the rest is the source tree;
          ```python blocks marked "run with mpirun -n N python3" run that way; ```cpp blocks
          marked "excerpt FILE" must be lines of FILE, in order. Other languages are prose.
python:   every public function, class and method of the package has a docstring, the
          docstrings' examples run (doctest, one process), and the extension's stubs
          (_ulysses.pyi) name exactly what it defines.

Directives are HTML comments on the line before a block (invisible on GitHub):
    <!-- docs-test: sub "OLD" => "NEW" -->       run the block with OLD replaced (a smaller size)
    <!-- docs-test: run with mpirun -n 2 python3 -->
    <!-- docs-test: excerpt examples/minimal/main.cpp -->
    <!-- docs-test: skip REASON -->
"""

import doctest
import inspect
import os
import pathlib
import re
import subprocess
import sys
import tempfile

# The pages whose command blocks a newcomer types first: these run.
RUN_FILES = ["README.md", "docs/getting-started.md"]

# Commands never run from the docs: they ARE the suite (scripts/test runs ctest, which runs this
# test) and its demo (set-up, a full build and minutes of runs); both are run by CI directly.
EXCLUDED_COMMANDS = {
    "scripts/demo": "the demo: set-up, build and several minutes of runs; CI runs it",
    "scripts/test": "the suite itself, which runs this test",
}

# A shell block must say whether it runs: ```sh runs; ```console and ```text are shown only.
# ```bash is refused in RUN_FILES so that every block there made that choice.
SHELL_RUN, SHELL_SHOWN = {"sh"}, {"console", "text"}

SKIP_DIRS = {".git", "build", "node_modules"}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def markdown_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build"))
        for f in sorted(filenames):
            if f.endswith(".md"):
                yield pathlib.Path(dirpath) / f


def blocks(text):
    """(language, body, directives, line number) of every fenced block, and the prose lines."""
    out, prose, lines = [], [], text.split("\n")
    i, pending = 0, []
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            d = DIRECTIVE.match(lines[i])
            if d:
                pending.append(d.group(1))
            elif lines[i].strip():
                pending = []
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3), i + 1
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        out.append((lang, "\n".join(body) + "\n", pending, start))
        pending = []
    return out, prose


def slug(heading):
    """GitHub's anchor for a heading: the rendered text, lower case, punctuation dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, result = {}, set()
        _, prose = blocks(path.read_text(encoding="utf-8"))
        for _, line in prose:
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            result.add(s if n == 0 else f"{s}-{n}")
        cache[path] = result
    return cache[path]


def check_links(root):
    errors, count = [], 0
    for md in markdown_files(root):
        _, prose = blocks(md.read_text(encoding="utf-8"))
        for lineno, line in prose:
            line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                count += 1
                where = f"{md.relative_to(root)}:{lineno}: {target}"
                file_part, _, anchor = target.partition("#")
                dest = (md.parent / file_part).resolve() if file_part else md
                if not dest.exists():
                    errors.append(f"{where}: no such file {dest}")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    errors.append(f"{where}: no heading with anchor #{anchor} in {dest.name}")
                elif anchor and dest.suffix != ".md":
                    errors.append(f"{where}: an anchor into a file that is not markdown")
    return errors, count


def parse_sub(directive):
    m = re.match(r'^sub\s+"(.*)"\s*=>\s*"(.*)"$', directive)
    if not m:
        raise SystemExit(f'bad docs-test directive: {directive!r} (sub "OLD" => "NEW")')
    return m.group(1), m.group(2)


def shell_lines(body, where):
    """The block's lines without the excluded commands (a comment says where they went)."""
    out = []
    for line in body.split("\n"):
        first = line.split()[0] if line.split() else ""
        if first in EXCLUDED_COMMANDS:
            out.append(f"# not run: {first} ({EXCLUDED_COMMANDS[first]})")
            print(f"{where}: {first} excluded: {EXCLUDED_COMMANDS[first]}")
        else:
            out.append(line)
    return "\n".join(out)


def check_excerpt(root, body, target, where):
    """Every code line of the block (comments and blank lines aside) is a line of `target`, in order."""

    def code(line):
        return re.sub(r"\s*//.*$", "", line).strip()

    source = [code(text) for text in (root / target).read_text(encoding="utf-8").split("\n")]
    pos = 0
    for line in body.split("\n"):
        c = code(line)
        if not c:
            continue
        try:
            pos = source.index(c, pos) + 1
        except ValueError:
            return [f"{where}: `{c}` is not a line of {target} (after line {pos})"]
    return []


def script_for(root, rel, scratch):
    """One bash script running the file's blocks in order; excerpt errors; block count."""
    errors, parts, ran = [], ["set -euxo pipefail", "PS4='+ [${SECONDS}s] '"], 0
    for n, (lang, body, directives, lineno) in enumerate(blocks((root / rel).read_text(encoding="utf-8"))[0]):
        where = f"{rel}:{lineno}"
        if any(d.startswith("skip") for d in directives):
            print(f"{where}: skipped ({directives})")
            continue
        for d in directives:
            if d.startswith("sub"):
                old, new = parse_sub(d)
                if old not in body:
                    errors.append(f"{where}: substitution {old!r} not found in the block")
                body = body.replace(old, new)
        excerpt = [d.split(None, 1)[1] for d in directives if d.startswith("excerpt")]
        launch = [d[len("run with ") :] for d in directives if d.startswith("run with ")]
        if excerpt:
            errors += check_excerpt(root, body, excerpt[0], where)
        elif lang in SHELL_RUN:
            parts.append(f"# {where}\n" + shell_lines(body, where))
            ran += 1
        elif lang == "python" and launch:
            script = scratch / f"block{n}.py"
            script.write_text(body)
            parts.append(f"# {where}\nPYTHONPATH=build/python {launch[0]} {script}")
            ran += 1
        elif lang == "bash":
            errors.append(f"{where}: ```bash in a page whose blocks run: say ```sh (runs) or ```console (shown)")
    return "\n".join(parts) + "\n", errors, ran


def check_commands(root, build, python):
    errors = []
    for rel in RUN_FILES:
        with tempfile.TemporaryDirectory(prefix="ulysses-docs-") as tmp:
            scratch = pathlib.Path(tmp)
            for entry in root.iterdir():  # the source tree, with the test's build as build/
                if entry.name not in ("build", ".git"):
                    (scratch / entry.name).symlink_to(entry)
            (scratch / "build").symlink_to(build)
            bin_dir = scratch / ".bin"  # `python3` in the docs is the interpreter the package was built for
            bin_dir.mkdir()
            (bin_dir / "python3").symlink_to(python)
            script, errs, ran = script_for(root, rel, scratch)
            errors += errs
            env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
            result = subprocess.run(["bash", "-c", script], cwd=scratch, env=env)
            print(f"{rel}: {ran} blocks, exit {result.returncode}")
            if result.returncode != 0:
                errors.append(f"{rel}: its blocks failed (exit {result.returncode}); the trace is above")
    return errors


def check_stubs(stub_file, extension):
    """The stubs name exactly what the extension defines: its functions, classes and their members."""
    import ast

    tree = ast.parse(stub_file.read_text(encoding="utf-8"))
    defined = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    errors = [
        f"{stub_file.name}: {name} is not in the extension" for name in sorted(set(defined) - set(dir(extension)))
    ]
    for name in sorted(n for n in dir(extension) if not n.startswith("__")):
        if name not in defined:
            errors.append(f"{stub_file.name}: the extension's {name} has no stub")
        elif isinstance(defined[name], ast.ClassDef) and not issubclass(getattr(extension, name), BaseException):
            stubbed = {f.name for f in defined[name].body if isinstance(f, ast.FunctionDef)} - {"__init__"}
            real = {m for m in dir(getattr(extension, name)) if not m.startswith("_")}
            errors += [f"{stub_file.name}: {name}.{m} has no stub" for m in sorted(real - stubbed)]
            errors += [f"{stub_file.name}: {name}.{m} is not in the extension" for m in sorted(stubbed - real)]
    return errors


def check_python(build):
    sys.path.insert(0, str(build / "python"))
    import ulysses
    import ulysses.torch

    errors, tested = [], 0
    modules = [ulysses, ulysses.torch] + [
        sys.modules[f"ulysses.{m}"] for m in ("_comm", "_infer", "_sharding", "_tensors")
    ]
    for module in modules:
        if not inspect.getdoc(module):
            errors.append(f"{module.__name__}: no module docstring")
        public = getattr(module, "__all__", [n for n in vars(module) if not n.startswith("_")])
        for name in public:
            obj = getattr(module, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)) or not inspect.getdoc(obj):
                if inspect.isfunction(obj) or inspect.isclass(obj):
                    errors.append(f"{module.__name__}.{name}: no docstring")
                continue
            if inspect.isclass(obj):
                for m, f in vars(obj).items():
                    if not m.startswith("_") and inspect.isfunction(f) and not inspect.getdoc(f) and m != "extra_repr":
                        errors.append(f"{module.__name__}.{name}.{m}: no docstring")
        failed, attempted = doctest.testmod(module, verbose=False)
        tested += attempted
        if failed:
            errors.append(f"{module.__name__}: {failed} of {attempted} doctest examples failed (above)")
    errors += check_stubs(pathlib.Path(ulysses.__file__).parent / "_ulysses.pyi", ulysses._ulysses)
    print(f"python: {len(modules)} modules, {tested} doctest examples")
    if tested == 0:
        errors.append("python: no doctest examples found: the docstrings' examples are the test")
    return errors


def main():
    what, root = sys.argv[1], pathlib.Path(sys.argv[2]).resolve()
    if what == "links":
        errors, count = check_links(root)
        print(f"links: {count} relative links checked")
    elif what == "commands":
        errors = check_commands(root, pathlib.Path(sys.argv[3]).resolve(), pathlib.Path(sys.argv[4]))
    elif what == "python":
        errors = check_python(pathlib.Path(sys.argv[3]).resolve())
    else:
        raise SystemExit(f"unknown check {what!r}: links, commands or python")
    for e in errors:
        print("ERROR", e)
    print("docs OK" if not errors else f"{len(errors)} error(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
