"""A pytest plugin: one table, at the end of the run, of every check tapegrad.testing.assert_gradients made.

    python3 -m pytest -p tapegrad.pytest_plugin tests/
"""

from .testing import RECORDS


def pytest_terminal_summary(terminalreporter):
    if not RECORDS:
        return
    terminalreporter.section("tapegrad checks")
    for line in summary_lines(RECORDS):
        terminalreporter.write_line(line)


def summary_lines(records):
    """A row per check: the test, the op, dtype and device, the verdict, the kinds named, the time; then a total."""
    rows = [("test", "op", "dtype", "device", "verdict", "kinds", "seconds")]
    for r in records:
        rows.append((r.test, r.op, r.dtype, r.device, "passed" if r.passed else "FAILED", ", ".join(r.kinds) or "-",
                     f"{r.seconds:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    failed = sum(not r.passed for r in records)
    lines.append(f"{len(records)} checks: {len(records) - failed} passed, {failed} failed, "
                 f"{sum(r.seconds for r in records):.2f} s")
    return lines
