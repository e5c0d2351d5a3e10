"""Shared fixtures. The built-in tiny model is built once per session; so is the vLLM engine."""

from __future__ import annotations

import os

# Before torch loads: passive OpenMP waits and one intra-op thread per test process, so
# the suite does not collapse when a verifier pool or a vLLM engine holds the other core.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GSM8K_DIR = REPO.parent / "shared" / "datasets" / "gsm8k"


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    if not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.fail(f"GSM8K files not found at {GSM8K_DIR} (the repo expects ../shared/datasets/gsm8k)")
    return GSM8K_DIR


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The built-in tiny model (random weights), built once per session."""
    from toprcli.models.tiny import build_tiny_model

    return Path(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0))
