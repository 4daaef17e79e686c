"""docs/compatibility.md: every test a row names exists (file, and test function where one is named)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "compatibility.md"


def named_tests(row: str) -> list[tuple[Path, list[str]]]:
    """(file, test names) for each `path.py[::test]...` a row names; a bare module name is under test/e2e/."""
    out = []
    for ref in re.findall(r"`([\w/]*test_\w+\.py)(?:\[[\w.-]+\])?((?:::\w+)?)`", row):
        path, test = ref
        file = REPO / path if "/" in path else REPO / "test" / "e2e" / path
        out.append((file, [test.removeprefix("::")] if test else []))
    for test in re.findall(r"`::(\w+)`", row):  # "`module::a`, `::b`": b in the same module
        out.append((out[-1][0], [test]))
    return out


def test_every_row_names_a_test_or_says_why_there_is_none():
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    assert len(rows) > 20
    for row in rows[1:]:
        refs = named_tests(row)
        assert refs or "cannot run on the CPU route" in row or "refuses it without" in row, row
        for file, tests in refs:
            assert file.is_file(), (row, file)
            source = file.read_text()
            for test in tests:
                assert f"def {test}(" in source, (row, test)


def test_the_readme_points_to_the_table():
    assert "docs/compatibility.md" in (REPO / "README.md").read_text()
