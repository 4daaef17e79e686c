"""What the test suite proves, per module: tests collected in each tier and assert statements written.

    python -m sglang_evs.testing.inventory [TEST_DIR] [--json]

A change that moves, merges or shares tests compares this before and after (`docs/testing.md`): no module may
lose tests or asserts unless they moved to another module. Run it where the tests run (`scripts/cpu_env.sh`).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path


def assert_statements(path: Path) -> int:
    """`assert` statements in a module, those in its helpers and fixtures included."""
    return sum(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(path.read_text())))


def collected(test_dir: Path, marks: str) -> Counter:
    """Test items per module file that pytest collects under `-m marks`."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(test_dir), "-m", marks, "--collect-only", "-q", "-p", "no:cacheprovider"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return Counter(line.split("::")[0] for line in done.stdout.splitlines() if "::" in line)


def inventory(test_dir: Path) -> dict[str, dict[str, int]]:
    quick, slow = collected(test_dir, "not slow and not rehearsal"), collected(test_dir, "slow and not rehearsal")
    root = test_dir.resolve().parent
    table = {}
    for path in sorted(test_dir.rglob("*.py")):
        name = str(path.resolve().relative_to(root))
        table[name] = {"quick": quick[name], "slow": slow[name], "asserts": assert_statements(path)}
    return {name: row for name, row in table.items() if any(row.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_dir", nargs="?", default="test", type=Path)
    parser.add_argument("--json", action="store_true", help="one JSON object, module -> counts")
    args = parser.parse_args()
    table = inventory(args.test_dir)
    if args.json:
        print(json.dumps(table, indent=1))
        return
    print(f"{'module':70} {'quick':>6} {'slow':>6} {'asserts':>8}")
    for name, row in table.items():
        print(f"{name:70} {row['quick']:6} {row['slow']:6} {row['asserts']:8}")
    totals = {key: sum(row[key] for row in table.values()) for key in ("quick", "slow", "asserts")}
    print(f"{'total':70} {totals['quick']:6} {totals['slow']:6} {totals['asserts']:8}")


if __name__ == "__main__":
    main()
