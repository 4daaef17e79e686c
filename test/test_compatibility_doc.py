"""docs/compatibility.md: every test a row names exists (file, and test function where one is named), and every
`--enable-*` / `--*-mode` flag of the installed SGLang's ServerArgs is placed: named in the first column of a row,
or set aside in the section of flags that touch neither batches, positions nor embeddings (never both)."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "compatibility.md"
SET_ASIDE = "## Flags that touch neither batches, positions nor embeddings"


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


def table_rows() -> list[str]:
    """The table's rows, its header left out."""
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    return rows[1:]


def flags_in(text: str) -> set[str]:
    """Every command-line flag written in backticks in `text` ("`--pp-size 2`" names --pp-size; a pattern such
    as "`--enable-*`" names none)."""
    words = (word for span in re.findall(r"`([^`]*)`", text) for word in span.split())
    return {word for word in words if re.fullmatch(r"--[a-z0-9][a-z0-9-]*[a-z0-9]", word)}


def is_switch(flag: str) -> bool:
    return flag.startswith("--enable-") or flag.endswith("-mode")


def flags_in_rows() -> set[str]:
    """The flags the table's first column names."""
    return set().union(*(flags_in(row.split("|")[1]) for row in table_rows()))


def set_aside_groups() -> list[str]:
    """The section's groups, one list item each ("- reason: `--flag`, ..."), their wrapped lines joined."""
    text = DOC.read_text()
    assert SET_ASIDE in text, f"docs/compatibility.md lacks its section {SET_ASIDE!r}"
    section = text.split(SET_ASIDE, 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n- ", section)[1:]
    return [" ".join(item.split()) for item in items]


def flags_set_aside() -> set[str]:
    return set().union(*(flags_in(group) for group in set_aside_groups()))


@pytest.fixture(scope="module")
def sglang_switches() -> set[str]:
    """Every `--enable-*` and `--*-mode` flag of the installed SGLang's ServerArgs (its import: about 10 s)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return {flag for action in parser._actions for flag in action.option_strings if is_switch(flag)}


def test_every_row_names_a_test_or_says_why_there_is_none():
    rows = table_rows()
    assert len(rows) > 20
    for row in rows:
        refs = named_tests(row)
        assert refs or "cannot run on the CPU route" in row or "refuses it without" in row, row
        for file, tests in refs:
            assert file.is_file(), (row, file)
            source = file.read_text()
            for test in tests:
                assert f"def {test}(" in source, (row, test)


def test_the_readme_points_to_the_table():
    assert "docs/compatibility.md" in (REPO / "README.md").read_text()


def test_every_switch_of_sglang_has_a_row_or_is_set_aside(sglang_switches):
    unplaced = sglang_switches - flags_in_rows() - flags_set_aside()
    assert not unplaced, (
        f"{len(unplaced)} of SGLang's {len(sglang_switches)} --enable-* / --*-mode flags are neither named in the "
        f"first column of a row of docs/compatibility.md nor set aside under {SET_ASIDE!r}: {sorted(unplaced)}"
    )


def test_no_switch_both_has_a_row_and_is_set_aside():
    assert not flags_in_rows() & flags_set_aside()


def test_every_switch_the_doc_places_is_sglangs(sglang_switches):
    """A flag SGLang dropped or renamed fails here, so the lists stay true across an upgrade."""
    placed = {flag for flag in flags_in_rows() if is_switch(flag)} | flags_set_aside()
    assert placed - sglang_switches == set(), f"not flags of the installed SGLang: {sorted(placed - sglang_switches)}"


def test_every_set_aside_group_gives_its_reason_before_its_flags():
    groups = set_aside_groups()
    assert len(groups) > 5
    for group in groups:
        reason, _, flags = group.partition(": `")
        assert len(reason) > 10 and "`" not in reason and flags_in("`" + flags), group
