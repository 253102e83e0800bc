"""benchmarks/mfu.json, the measured MFU `clusterctl plan` uses, is the machine-readable copy of
docs/benchmarks.md: every entry must be readable and must appear in the document."""

from pathlib import Path

from clusterctl.plan.mfu import MEASURED_MFU_PATH, load_measurements

DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


def test_the_table_is_at_the_documented_place_and_loads():
    assert MEASURED_MFU_PATH == Path(__file__).resolve().parents[2] / "benchmarks" / "mfu.json"
    load_measurements()  # raises a one-line error on a malformed entry


def test_every_measured_figure_is_in_docs_benchmarks():
    doc = DOC.read_text()
    for m in load_measurements():
        # the document shows MFU as a percentage with one decimal, next to the date of the run
        assert f"{100 * m.mfu:.1f}%" in doc, f"{m.preset} {m.gpu} {m.fp8_backend}: MFU not in {DOC}"
        assert m.date in doc, f"{m.preset} {m.gpu} {m.fp8_backend}: date {m.date} not in {DOC}"
        assert m.preset in doc
