"""Where a model may be written (models/output.py): --overwrite replaces a model, never another directory."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from toprcli.cli.main import app
from toprcli.errors import UserError
from toprcli.models.output import check_model_out


def test_overwrite_replaces_only_a_model(tmp_path, monkeypatch):
    """`topr init-model . --overwrite` in a project replaced the project with the model: src/ was gone."""
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    (project / "src" / "important.txt").write_text("precious")
    monkeypatch.chdir(project)
    r = CliRunner().invoke(app, ["init-model", ".", "--overwrite"])
    assert r.exit_code == 2 and "holds the working directory" in r.output and len(r.output.strip().splitlines()) == 1
    r = CliRunner().invoke(app, ["init-model", str(project / "src"), "--overwrite"])
    assert r.exit_code == 2 and "holds no model (no config.json)" in r.output
    assert (project / "src" / "important.txt").read_text() == "precious"
    assert CliRunner().invoke(app, ["init-model", "models/tiny"]).exit_code == 0
    again = CliRunner().invoke(app, ["init-model", "models/tiny", "--overwrite", "--seed", "1"])  # a model: replaced
    assert again.exit_code == 0, again.output


def test_a_new_or_empty_dir_is_fine_and_a_file_is_not(tmp_path):
    check_model_out(tmp_path / "new", overwrite=False)
    (tmp_path / "empty").mkdir()
    check_model_out(tmp_path / "empty", overwrite=False)
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="is not a directory"):
        check_model_out(tmp_path / "f", overwrite=True)
