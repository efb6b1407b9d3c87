"""What the source-tree checks (layering_test.py, strategy_names_test.py) share: their command
line and the small trees their selftests write."""

import pathlib
import sys


def write_tree(root, files):
    """Writes {relative path: text} under root, making the folders."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def main(doc, check, selftest):
    """`SCRIPT SOURCE_DIR` prints check(root)'s problems and fails, or its line of success;
    `SCRIPT selftest` runs selftest(). check returns (problems, success line, failure line)."""
    if len(sys.argv) != 2:
        sys.exit(doc)
    if sys.argv[1] == "selftest":
        return selftest()
    errors, ok, failed = check(pathlib.Path(sys.argv[1]))
    for e in errors:
        print(e)
    if errors:
        sys.exit(failed)
    print(ok)
