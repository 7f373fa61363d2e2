"""docs/scenario.md is generated from the specs (issue 12, item 11): regenerating it must give
the committed file, so a field added or changed without regenerating fails here."""

from pathlib import Path

from pydantic import BaseModel, Field

from clustersim.fields import PositiveInt
from clustersim.reports.docs import main, render, section
from clustersim.simulator.inputs.specs import ModelSpec, ParallelSpec, TrainingSpec

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "scenario.md"


def test_committed_reference_is_what_the_specs_generate():
    assert COMMITTED.read_text(encoding="utf-8") == render(), (
        "docs/scenario.md is out of date: run python -m clustersim.reports.docs")


def test_every_spec_field_is_listed_with_its_description():
    text = render()
    for spec in (ModelSpec, TrainingSpec, ParallelSpec):
        for name, field in spec.model_fields.items():
            assert f"| `{name}` |" in text
            assert field.description and " ".join(field.description.split()) in text


def test_a_field_without_description_still_renders():
    # other engineers add spec fields in parallel; the generator must not fail on them
    class Grown(BaseModel):
        width: PositiveInt = Field(description="described")
        depth: PositiveInt | None = None
        kinds: dict[str, float] = {}

    rows = section("grown", Grown, "A spec with one undocumented field.").splitlines()
    assert "| `width` | int > 0 | required | described |" in rows
    assert "| `depth` | int > 0 \\| null | `null` |  |" in rows
    assert "| `kinds` | mapping of str to float | `{}` |  |" in rows


def test_check_flag_reports_a_stale_file(tmp_path):
    stale = tmp_path / "scenario.md"
    stale.write_text("old")
    assert main(["--out", str(stale), "--check"]) == 1
    assert main(["--out", str(stale)]) == 0 and main(["--out", str(stale), "--check"]) == 0
