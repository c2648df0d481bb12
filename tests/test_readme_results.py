"""The README's results come from records (issue 65): its generated section is what
``benchmarks/readme_results.py`` renders from the records it cites, every row cites a record that exists, a
changed number in a record fails the check naming the row, and a missing record or key is a clear error.
Fast: JSON and text only, no model."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import readme_results as results
from readme_results import Cell, RecordError, Row, Table, at

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 150


def cited_records() -> set[str]:
    """Every record a row or a summary of ``TABLES`` reads (paths under bench-results/)."""
    rows = {row.record for table in results.TABLES for row in table.rows}
    speed = {name for _, _, name in results.TRAINING_SPEED}
    return rows | speed | set(results.OUR_TRAINING_RUNS)


@pytest.fixture
def copy_root(tmp_path: Path) -> Path:
    """A copy of the repository's README and of the records it cites (with their markdown tables)."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for name in cited_records():
        for source in (ROOT / "bench-results" / name, (ROOT / "bench-results" / name).with_suffix(".md")):
            if source.is_file():
                target = tmp_path / "bench-results" / source.relative_to(ROOT / "bench-results")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(source, target)
    return tmp_path


def edit_record(root: Path, name: str, edit) -> None:
    """Load record ``name`` under ``root``, ``edit(record)`` in place, write it back."""
    path = root / "bench-results" / name
    record = json.loads(path.read_text(encoding="utf-8"))
    edit(record)
    path.write_text(json.dumps(record, indent=2), encoding="utf-8")


def test_the_readme_section_is_what_the_records_give():
    report = results.check(ROOT)
    assert report == "", report


def test_every_row_cites_a_record_that_exists_and_links_it():
    section = results.split_readme((ROOT / "README.md").read_text(encoding="utf-8"))[1]
    for table in results.TABLES:
        assert table.rows, table.title
        for row in table.rows:
            assert (ROOT / "bench-results" / row.record).is_file(), table.owner(row)
    table_rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| system")]
    assert len(table_rows) == sum(len(table.rows) for table in results.TABLES)
    for line in table_rows:
        assert "](bench-results/" in line.rsplit("|", 2)[-2], f"a row cites no record: {line}"


def test_the_readme_stays_short_and_its_links_are_relative():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    section = results.split_readme(text)[1]
    assert str(ROOT) not in section and "](/" not in section


def test_a_changed_number_fails_the_check_naming_its_row(copy_root: Path):
    assert results.check(copy_root) == ""

    def slower(record):
        record["median_sentences_per_s"]["transformer"]["beam5"] = 12.34

    edit_record(copy_root, "decode-2026-11-25-int8-transformer.json", slower)
    report = results.check(copy_root)
    assert "row 'ours, Transformer (fp32)'" in report
    assert "decode-2026-11-25-int8-transformer.json" in report
    assert "+| ours, Transformer (fp32) | 21.85 / 21.70 | 221.8 | 12.3 |" in report  # the unified diff
    assert results.main(["--check", "--root", str(copy_root)]) == 1
    assert results.main(["--root", str(copy_root)]) == 0  # rewrites the README from the records
    assert results.check(copy_root) == ""
    assert "| 12.3 |" in (copy_root / "README.md").read_text(encoding="utf-8")


def test_a_changed_score_changes_who_leads(copy_root: Path):
    def rnn_ahead(record):
        record["archs"]["rnn-bahdanau"]["budgets"][-1]["test_bleu"] = 43.0

    edit_record(copy_root, "budget-90-2026-11-28.json", rnn_ahead)
    results.write(copy_root)
    text = (copy_root / "README.md").read_text(encoding="utf-8")
    assert "`rnn-bahdanau` at 90 minutes (1 core each) by 0.12 (2026-11-28, [budget-90-2026-11-28]" in text


def test_a_budget_row_shows_an_aer_when_its_record_has_one(copy_root: Path):
    def with_aer(record):
        record["archs"]["rnn-bahdanau"]["budgets"][-1]["aer"] = 0.2875

    edit_record(copy_root, "budget-90-2026-11-28.json", with_aer)
    results.write(copy_root)
    assert "| 39.41 | 0.287 | AMD EPYC AVX512 |" in (copy_root / "README.md").read_text(encoding="utf-8")
    def without_aer(record):
        del record["archs"]["rnn-bahdanau"]["budgets"][-1]["aer"]

    edit_record(copy_root, "budget-90-2026-11-28.json", without_aer)
    results.write(copy_root)
    assert "| 39.41 |  | AMD EPYC AVX512 |" in (copy_root / "README.md").read_text(encoding="utf-8")


def test_a_missing_record_is_an_error_naming_row_and_record(copy_root: Path):
    (copy_root / "bench-results" / "budget-90-2026-11-28.json").unlink()
    with pytest.raises(RecordError, match=r"The race, row '`rnn-bahdanau`' \(bench-results/budget-90-2026-11-28.json\)"
                                          r": no record"):
        results.check(copy_root)
    assert results.main(["--check", "--root", str(copy_root)]) == 2


def test_a_missing_key_is_an_error_naming_row_record_and_key(copy_root: Path):
    def no_beam(record):
        del record["decode"]["beam5"]["bleu"]

    edit_record(copy_root, "peers/onmt_rnn-2026-11-25.json", no_beam)
    with pytest.raises(RecordError, match=r"row 'OpenNMT-py 3.5.1, RNN'.*peers/onmt_rnn-2026-11-25.json has no key "
                                          r"'decode.beam5.bleu'"):
        results.render(copy_root)


def test_a_declared_row_with_a_missing_budget_or_key_raises(copy_root: Path):
    declared = Table("Made up", "for the test.", results.RACE_HEADER,
                     (results.budget_row("budget-90-2026-11-28.json", "transformer-align", 60),))
    with pytest.raises(RecordError, match=r"has no key 'archs.transformer-align.budgets\[budget_minutes=60\]'"):
        results.render(copy_root, (declared,))
    plain = Table("Made up", "for the test.", ("system", "x"), (Row("one", "budget-90-2026-11-28.json",
                                                                    (Cell(at("no", "such", "key")),)),))
    with pytest.raises(RecordError, match=r"Made up, row 'one'.*budget-90-2026-11-28.json has no key 'no'"):
        results.render(copy_root, (plain,))
    gone = Table("Made up", "for the test.", ("system", "x"), (Row("two", "no-such-record.json", (Cell(at("a")),)),))
    with pytest.raises(RecordError, match=r"row 'two' \(bench-results/no-such-record.json\): no record"):
        results.render(copy_root, (gone,))


def test_a_readme_without_markers_is_an_error(copy_root: Path):
    readme = copy_root / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8").replace(results.END, ""), encoding="utf-8")
    with pytest.raises(RecordError, match="no results section"):
        results.check(copy_root)
