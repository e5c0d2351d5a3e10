"""Dataset specs, prompt templates and the built-in arithmetic task."""
