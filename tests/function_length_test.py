#!/usr/bin/env python3
"""No function of the library, the tools or the binding is longer than a screen (60 lines).

    function_length_test.py SOURCE_DIR
    function_length_test.py selftest      the check on a small tree with one of each mistake

A function's lines run from the first line of its declaration (its template line, its return
type) to its closing brace, blank lines and comments included: what a reader scrolls through.

C++ (src, tools, python/src): comments, string and character literals (raw strings too) and
preprocessor lines are blanked, then braces are matched. A brace at namespace or class scope
opens a function when the text before it (back to the previous `;`, `{` or `}`) holds a `(`
with no `=` before it (`operator=` aside) and is not a namespace, class, struct, union or enum
head; a brace followed by `,` or `{` initialises a member in a constructor's list, and the
body comes after it. A macro that defines a function (`PYBIND11_MODULE(…) {`) counts as one.
What a function holds — lambdas, local classes — counts toward it, not on its own.
Python (python/ulysses): every `def`, from its `def` line to its last line, through the syntax
tree; a nested function counts both on its own and within the one around it.

Prints "function length OK" and the counts when there is nothing to report.
"""

import ast
import re

import tree_checks

LIMIT = 60
CPP_DIRS = ["src", "tools", "python/src"]
PY_DIRS = ["python/ulysses"]
CPP_SUFFIXES = {".cpp", ".hpp", ".h", ".cc", ".cu"}
# Raw strings first (they may hold quotes), then comments, strings and character literals.
LEXEME = re.compile(r'R"([^(\s]*)\(.*?\)\1"|//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
PREPROCESSOR = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
SCOPE_HEAD = re.compile(r"^(?:template\s*<.*>\s*)?(?:namespace|class|struct|union|enum|extern)\b", re.S)
OPERATOR = re.compile(r"\boperator\s*[^\s(]+")


def blank(text):
    """The text with comments, literals and preprocessor lines replaced by spaces, newlines kept."""

    def spaces(m):
        return re.sub(r"[^\n]", " ", m.group(0))

    return LEXEME.sub(spaces, PREPROCESSOR.sub(spaces, text))


def opens_function(head):
    head = OPERATOR.sub("operator", head.strip())
    if not head or SCOPE_HEAD.match(head) or "(" not in head:
        return False
    return "=" not in head[: head.index("(")]


def cpp_functions(text):
    """(first line, last line, name) of every function defined at namespace or class scope."""
    code = blank(text)
    scopes = []  # one per open brace at namespace/class scope: True for a namespace or class
    found, start = [], 0  # start: where the current declaration's text begins
    i = 0
    while i < len(code):
        c = code[i]
        if c in ";}":
            if c == "}" and scopes:
                scopes.pop()
            start = i + 1
        elif c == "{":
            head = code[start:i]
            if all(scopes) and opens_function(head):
                end, depth = i, 0
                while end < len(code):
                    depth += {"{": 1, "}": -1}.get(code[end], 0)
                    if depth == 0:
                        break
                    end += 1
                after = code[end + 1 :].lstrip()[:1]
                if after in (",", "{"):  # a member initialised by braces: the body comes later
                    i = end + 1
                    continue
                first = code.count("\n", 0, start + len(head) - len(head.lstrip())) + 1
                name = head[: head.index("(")].split()[-1:] or ["?"]
                found.append((first, code.count("\n", 0, end) + 1, name[0]))
                i, start = end, end + 1
            else:
                scopes.append(all(scopes) and bool(SCOPE_HEAD.match(head.strip())))
                start = i + 1
        i += 1
    return found


def py_functions(text):
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.lineno, node.end_lineno, node.name


def files_of(root, dirs, suffixes):
    return sorted(p for d in dirs for p in (root / d).rglob("*") if p.suffix in suffixes and p.is_file())


def check(root):
    errors, functions = [], 0
    sources = [(f, cpp_functions) for f in files_of(root, CPP_DIRS, CPP_SUFFIXES)]
    sources += [(f, py_functions) for f in files_of(root, PY_DIRS, {".py"})]
    for f, parse in sources:
        rel = f.relative_to(root).as_posix()
        for first, last, name in parse(f.read_text(errors="replace")):
            functions += 1
            if last - first + 1 > LIMIT:
                errors.append(f"{rel}:{first}: {name} is {last - first + 1} lines (at most {LIMIT})")
    ok = f"function length OK: {functions} functions in {len(sources)} files, none over {LIMIT} lines"
    return errors, ok, f"function length: {len(errors)} functions over {LIMIT} lines"


def body(n):
    return "".join(f"  x += {i};\n" for i in range(n))


SELFTEST_FILES = {
    "src/ok.cpp": "namespace a {\nstruct S {\n  int f() const {\n" + body(50) + "  }\n};\n"
    'const char* s = "{ ( {";\n// a comment {\nint g(int x = 1) {\n  auto l = [&] { return 1; };\n'
    "  return x;\n}\nint table[] = {\n" + "  1,\n" * 80 + "};\n}  // namespace a\n",
    "tools/ok.cpp": 'const char* help = R"(\n' + "{\n" * 80 + ')";\nbool operator==(int, int) { return true; }\n',
    "python/ulysses/ok.py": "def f():\n" + "    x = 1\n" * 50,
}
SELFTEST_MISTAKES = [
    (
        "src/long.cpp",
        "namespace a {\ntemplate <class T>\nT f(T x)\n{\n" + body(57) + "}\n}\n",
        "src/long.cpp:2: f is 61",
    ),
    ("src/module.cpp", "PYBIND11_MODULE(m, x) {\n" + body(60) + "}\n", "src/module.cpp:1: PYBIND11_MODULE is 62"),
    ("tools/member.hpp", "class C {\n  void g() {\n" + body(59) + "  }\n};\n", "tools/member.hpp:2: g is 61"),
    ("src/ctor.cpp", "C::C(int x)\n    : a_{x}, b_{x} {\n" + body(59) + "}\n", "src/ctor.cpp:1: C::C is 62"),
    ("python/ulysses/long.py", "def h():\n" + "    y = 2\n" * 60, "python/ulysses/long.py:1: h is 61"),
]


def selftest():
    tree_checks.selftest_mistakes("function length", check, SELFTEST_FILES, SELFTEST_MISTAKES)


if __name__ == "__main__":
    tree_checks.main(__doc__, check, selftest)
