"""User text (paths, config values) printed by the CLI is text: `[v1]` or `[/b]` in a path is never rich markup."""

from __future__ import annotations


from typer.testing import CliRunner

from toprcli.cli.main import app


def test_a_path_with_brackets_is_printed_as_written(tmp_path, monkeypatch):
    """`init-model 'models/[exp]tiny'` showed models/tiny; a ROLL value `run[/b]` was a MarkupError after the file was
    written."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["init-model", "models/[exp]tiny"])
    assert r.exit_code == 0 and "models/[exp]tiny" in r.output, r.output
    roll = tmp_path / "roll.yaml"
    roll.write_text("exp_name: 'run[/b]'\npretrain: /data/[v1]/model\nresponse_length: 64\n")
    r = CliRunner().invoke(app, ["config", "import-roll", str(roll), "--out", str(tmp_path / "o.yaml"), "--allow-unknown"])
    assert r.exit_code == 0, r.output
    assert "/data/[v1]/model" in r.output and "run[/b]" in r.output


def test_table_numbers_read_at_a_glance():
    """tokens/s showed as 19342.4597, and an invalid rate of 0.99999999 as "1" beside "1.0" elsewhere."""
    from toprcli.cli.common import _fmt

    assert [_fmt(v) for v in (19342.4597, 0.99999999, 1.0, 5.0, 0.12345, 2e-4, 3e6, 12345, None)] == [
        "19,342.5", "1.0", "1.0", "5.0", "0.1235", "0.0002", "3e+06", "12,345", "–"]
