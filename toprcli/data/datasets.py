"""Prompt datasets: one spec for every command.

Reads a :class:`~toprcli.config.DatasetSpec` and returns :class:`Example` rows
(stable ``prompt_id``, question, gold ``answer`` for the verifier, full gold
``solution`` for supervised warm starts), then renders prompts with a plain
``{question}`` template or the tokenizer's chat template.

Sources: Hugging Face hub ids (``openai/gsm8k`` with config ``main``), a local
dataset directory laid out like a hub repo (``train.jsonl``/``test.jsonl``),
local ``.jsonl``/``.json``/``.parquet``/``.csv`` files, and the built-in datasets:
``builtin:arith`` (generated from a seed) and ``builtin:gsm8k`` (GSM8K's train and test
splits, shipped as package data with their MIT licence in ``toprcli/data/gsm8k/``).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toprcli.config import DatasetSpec
from toprcli.data.arith import arith_problems
from toprcli.errors import UserError
from toprcli.shards import read_file_metadata

# Built-in datasets: the arithmetic task is generated; GSM8K ships as package data (splits train, test).
BUILTIN_DATASETS = ("arith", "gsm8k")
GSM8K_DIR = Path(__file__).resolve().parent / "gsm8k"
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
# Hub datasets that need a config name, and the one users almost always mean.
HUB_DEFAULT_CONFIGS = {"openai/gsm8k": "main", "gsm8k": "main"}


@dataclass(frozen=True)
class Example:
    prompt_id: str
    question: str
    answer: str | None  # the gold reference the verifier compares against
    solution: str | None = None  # a full gold solution, for supervised warm starts


@dataclass(frozen=True)
class Preset:
    """How a family of datasets maps to questions, gold answers and prompts."""

    name: str
    question_columns: tuple[str, ...]
    answer_columns: tuple[str, ...]
    template: str  # plain-text prompt, {question} is replaced
    chat_instruction: str  # user message for chat templates, {question} is replaced
    verifier: str

    def gold(self, raw: str | None) -> str | None:
        if raw is None:
            return None
        if self.name in ("gsm8k", "arith"):
            return gsm8k_gold(raw)
        if self.name == "math":
            return last_boxed(raw) or raw.strip()
        return raw


GSM8K_INSTRUCTION = (
    "Solve the math problem step by step. Give the final answer on its own line as '#### <number>'."
)
MATH_INSTRUCTION = "Solve the problem step by step. Put the final answer in \\boxed{}."

PRESETS: dict[str, Preset] = {
    "arith": Preset(
        name="arith",
        question_columns=("question",),
        answer_columns=("answer",),
        template="Question: {question}\nAnswer:",
        chat_instruction="{question}",
        verifier="gsm8k",
    ),
    "gsm8k": Preset(
        name="gsm8k",
        question_columns=("question",),
        answer_columns=("answer",),
        template=GSM8K_INSTRUCTION + "\n\nQuestion: {question}\nAnswer:",
        chat_instruction=GSM8K_INSTRUCTION + "\n\n{question}",
        verifier="gsm8k",
    ),
    "math": Preset(
        name="math",
        question_columns=("problem", "question"),
        answer_columns=("answer", "solution"),
        template=MATH_INSTRUCTION + "\n\nProblem: {question}\nSolution:",
        chat_instruction=MATH_INSTRUCTION + "\n\n{question}",
        verifier="math",
    ),
    # What `topr verifier-data` writes: the question is the whole verification text (the problem,
    # the candidate solution, the request for a verdict), the answer the label Yes/No.
    "verification": Preset(
        name="verification",
        question_columns=("question",),
        answer_columns=("answer",),
        template="{question}\nVerdict:",
        chat_instruction="{question}",
        verifier="judge",
    ),
    "none": Preset(
        name="none",
        question_columns=("question", "problem", "prompt", "input", "instruction"),
        answer_columns=("answer", "solution", "output", "target", "label"),
        template="{question}",
        chat_instruction="{question}",
        verifier="exact",
    ),
}

_GSM8K_GOLD = re.compile(r"####\s*(.+?)\s*$", re.S)


@functools.lru_cache(maxsize=64)  # keyed by mtime: render_prompt resolves the preset once per example
def _stage_of_file(path: str, mtime_ns: int) -> str | None:
    try:
        return read_file_metadata(path).get("stage")
    except Exception:  # not a toprcli file, or not readable: loading it reports the real problem
        return None


def _written_by(source: str) -> str | None:
    """The toprcli stage that wrote a local Parquet file (its ``toprcli`` metadata), else None."""
    path = Path(source).expanduser()
    if path.suffix.lower() != ".parquet" or not path.is_file():
        return None
    return _stage_of_file(str(path), path.stat().st_mtime_ns)


def gsm8k_gold(raw: str) -> str:
    """The number after ``####`` in a GSM8K-style solution, or the whole value."""
    m = _GSM8K_GOLD.search(raw)
    return (m.group(1) if m else raw).strip().replace(",", "")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def resolve_preset(spec: DatasetSpec) -> Preset:
    if spec.preset != "auto":
        return PRESETS[spec.preset]
    src = spec.source.lower()
    if src.startswith("builtin:arith"):
        return PRESETS["arith"]
    if _written_by(spec.source) == "verifier-data":
        return PRESETS["verification"]
    name = Path(src).name if Path(spec.source).exists() else src
    if "gsm8k" in src or "gsm8k" in name:
        return PRESETS["gsm8k"]
    if "math" in name:
        return PRESETS["math"]
    return PRESETS["none"]


# -- loading ------------------------------------------------------------------


def _load_rows(spec: DatasetSpec) -> list[dict[str, Any]]:
    """Raw rows of the requested split, from whichever source the spec names."""
    src = spec.source
    if src.startswith("builtin:"):
        return _load_builtin(spec)

    import datasets

    datasets.disable_progress_bars()
    path = Path(src).expanduser()
    try:
        if path.is_file():
            fmt = LOCAL_FORMATS.get(path.suffix.lower())
            if fmt is None:
                raise UserError(
                    f"{path}: unsupported file type {path.suffix!r} — use .jsonl, .json, .parquet or .csv"
                )
            ds = _load_local(datasets, fmt, path)
        elif path.is_dir() or "/" in src or re.fullmatch(r"[\w.-]+", src):
            if not path.exists() and (src.startswith((".", "/", "~")) or Path(src).suffix.lower() in LOCAL_FORMATS):
                raise UserError(f"dataset file not found: {src} — check the path")
            # A hub id, or a local directory laid out like a hub dataset repo.
            config_name = spec.config_name
            if config_name is None and src.rstrip("/") in HUB_DEFAULT_CONFIGS:
                config_name = HUB_DEFAULT_CONFIGS[src.rstrip("/")]
            ds = datasets.load_dataset(str(path) if path.is_dir() else src, config_name, split=spec.split)
        else:
            raise UserError(f"unknown dataset {src!r} — pass a hub id, a local file, or builtin:arith")
    except UserError:
        raise
    except ValueError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot load dataset {src!r} split {spec.split!r}: {msg} — check the split and config name") from None
    except (FileNotFoundError, ConnectionError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"cannot load dataset {src!r}: {msg} — check the hub id (and network), or pass a local file"
        ) from None
    except Exception as e:  # datasets raises many types (DatasetNotFoundError, ...)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot load dataset {src!r}: {msg} — check the hub id, config name and split") from None
    if spec.limit is not None:
        ds = ds.select(range(min(spec.limit, len(ds))))
    return ds.to_list()


def _load_builtin(spec: DatasetSpec) -> list[dict[str, Any]]:
    name = spec.source.split(":", 1)[1]
    if name == "arith":
        n = spec.limit if spec.limit is not None else spec.size
        return arith_problems(spec.split, n, seed=spec.seed, level=spec.level)
    if name != "gsm8k":
        raise UserError(f"unknown built-in dataset {spec.source!r} — choose one of: {', '.join('builtin:' + b for b in BUILTIN_DATASETS)}")
    path = GSM8K_DIR / f"{spec.split}.jsonl"
    if not path.is_file():
        raise UserError(f"builtin:gsm8k has no split {spec.split!r} — choose train or test")
    import datasets

    datasets.disable_progress_bars()
    ds = _load_local(datasets, "json", path)
    if spec.limit is not None:
        ds = ds.select(range(min(spec.limit, len(ds))))
    return ds.to_list()


def _load_local(datasets: Any, fmt: str, path: Path) -> Any:
    """A local file through ``datasets``; a file it cannot read is named with the line (or cause)."""
    import logging

    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # its "Failed to read file" log line would precede ours
    try:
        return datasets.load_dataset(fmt, data_files=str(path), split="train")
    except Exception as e:
        where = _diagnose_local(path) or (str(e).splitlines()[0] if str(e) else type(e).__name__)
        raise UserError(f"cannot read {path}: {where} — fix the file (or remove the bad rows)") from None
    finally:
        logger.setLevel(level)


def _diagnose_local(path: Path) -> str | None:
    """Where a local .jsonl/.json/.csv/.parquet file is broken, in words (line numbers 1-based)."""
    import csv
    import json

    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        return f"line {n} is not valid JSON ({e.msg} at column {e.colno})"
                    if not isinstance(row, dict):
                        return f"line {n} is a JSON {type(row).__name__}, not an object of column values"
        elif suffix == ".json":
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                return f"not valid JSON at line {e.lineno}, column {e.colno} ({e.msg})"
        elif suffix == ".csv":
            with open(path, encoding="utf-8", newline="") as f:
                reader = csv.reader(f, strict=True)
                header = next(reader, [])
                for row in reader:
                    if len(row) != len(header):
                        return f"line {reader.line_num} has {len(row)} fields, the header has {len(header)}"
        elif suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.read_metadata(path)
    except UnicodeDecodeError as e:
        return f"not UTF-8 text ({e.reason} at byte {e.start})"
    except csv.Error as e:
        return f"line {reader.line_num}: {e}"
    except Exception as e:  # pyarrow: not a Parquet file, truncated, ...
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


def _pick_column(columns: list[str], explicit: str | None, candidates: tuple[str, ...], what: str, src: str) -> str | None:
    if explicit is not None:
        if explicit not in columns:
            raise UserError(
                f"dataset {src!r} has no column {explicit!r} for the {what} — columns are: {', '.join(columns)}"
            )
        return explicit
    return next((c for c in candidates if c in columns), None)


def prompt_ids(questions: list[str], split: str) -> list[str]:
    """Stable ids from content: a reordered file keeps its ids; duplicates get a suffix."""
    seen: dict[str, int] = {}
    out = []
    for q in questions:
        base = f"{split}-{hashlib.sha1(q.encode()).hexdigest()[:12]}"
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.append(base if k == 0 else f"{base}-{k + 1}")
    return out


def load_examples(spec: DatasetSpec) -> list[Example]:
    """The examples of a dataset spec, with stable prompt ids and gold answers."""
    preset = resolve_preset(spec)
    rows = _load_rows(spec)
    if not rows:
        raise UserError(f"dataset {spec.source!r} split {spec.split!r} is empty — check the source and split")
    columns = list(rows[0].keys())
    q_col = _pick_column(columns, spec.question_column, preset.question_columns, "question", spec.source)
    if q_col is None:
        raise UserError(
            f"dataset {spec.source!r} has no question column (looked for {', '.join(preset.question_columns)}) — "
            f"columns are: {', '.join(columns)}; set dataset.question_column"
        )
    a_col = _pick_column(columns, spec.answer_column, preset.answer_columns, "answer", spec.source)
    id_col = _pick_column(columns, spec.id_column, ("id",) if preset.name in ("arith", "verification") else (), "id", spec.source)

    questions = [str(r[q_col]) for r in rows]
    ids = [str(r[id_col]) for r in rows] if id_col else prompt_ids(questions, spec.split)
    if id_col and len(set(ids)) != len(ids):
        raise UserError(f"dataset {spec.source!r}: column {id_col!r} has duplicate ids — pick a unique id column")
    examples = []
    for pid, q, r in zip(ids, questions, rows):
        raw = None if a_col is None or r.get(a_col) is None else str(r[a_col])
        examples.append(Example(prompt_id=pid, question=q, answer=preset.gold(raw), solution=raw))
    return examples


# -- rendering ----------------------------------------------------------------


def render_prompt(example: Example, spec: DatasetSpec, tokenizer: Any | None = None) -> str:
    """The prompt text exactly as the model sees it."""
    preset = resolve_preset(spec)
    if spec.chat_template:
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise UserError("dataset.chat_template is set but the tokenizer has no chat template — turn it off or use an instruct model")
        instruction = spec.template or preset.chat_instruction
        messages = []
        if spec.system_prompt:
            messages.append({"role": "system", "content": spec.system_prompt})
        messages.append({"role": "user", "content": instruction.replace("{question}", example.question)})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    template = spec.template or preset.template
    if "{question}" not in template:
        raise UserError(f"prompt template {template!r} has no {{question}} placeholder — add one")
    return template.replace("{question}", example.question)


def encode_prompt(text: str, tokenizer: Any, spec: DatasetSpec) -> list[int]:
    """Token ids fed to the engine. Chat templates already carry BOS; plain text gets it added."""
    return list(tokenizer(text, add_special_tokens=not spec.chat_template)["input_ids"])


def default_verifier(spec: DatasetSpec) -> str:
    return resolve_preset(spec).verifier
