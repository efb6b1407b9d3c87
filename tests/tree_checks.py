"""What the source-tree checks (layering_test.py, strategy_names_test.py,
function_length_test.py) share: their command line and the small trees their selftests write."""

import pathlib
import sys


def write_tree(root, files):
    """Writes {relative path: text} under root, making the folders."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def selftest_mistakes(title, check, clean, mistakes):
    """Runs check on the tree `clean` ({path: text}), which must pass, then on it with each of
    `mistakes` ((path, text, what the report must start with)) added in turn, which must each be
    reported; prints "<title> selftest OK" with the count."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        write_tree(root, clean)
        errors, _, _ = check(root)
        if errors:
            sys.exit("selftest: the clean tree fails:\n" + "\n".join(errors))
        for rel, text, expected in mistakes:
            write_tree(root, {rel: text})
            errors, _, _ = check(root)
            if not any(e.startswith(expected) for e in errors):
                sys.exit(f"selftest: {rel} not reported as {expected!r}; got {errors}")
            (root / rel).unlink()
    print(f"{title} selftest OK: {len(mistakes)} mistakes caught")


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
