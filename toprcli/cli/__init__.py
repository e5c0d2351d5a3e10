"""Thin typer commands: parse options, build a config, call one library function."""
