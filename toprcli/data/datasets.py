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

import dataclasses
import functools
import hashlib
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toprcli.config import DatasetSpec
from toprcli.data import formats
from toprcli.data.arith import arith_problems
from toprcli.data.local_files import LOCAL_FORMATS, few_shot_source, local_suffix, read_local
from toprcli.errors import UserError
from toprcli.shards import read_file_metadata

# Built-in datasets: the arithmetic task is generated; GSM8K ships as package data (splits train, test).
BUILTIN_DATASETS = ("arith", "gsm8k")
GSM8K_DIR = Path(__file__).resolve().parent / "gsm8k"
# Hub datasets that need a config name, and the one users almost always mean.
HUB_DEFAULT_CONFIGS = {"openai/gsm8k": "main", "gsm8k": "main"}


@dataclass(frozen=True)
class Example:
    prompt_id: str
    question: str  # the problem (for chat datasets: the last user message)
    answer: str | None  # the gold reference the verifier compares against
    solution: str | None = None  # a full gold solution, for supervised warm starts and few-shot prompts
    messages: tuple | None = None  # a chat dataset's conversation, rendered as given (formats.py)
    data_source: str | None = None  # verl's data_source: which verifier scores the row
    shots: tuple = ()  # few-shot examples shown before the problem
    preset: str | None = None  # the preset the dataset resolved to: the prompt is rendered as the gold was read
    verbatim: bool = False  # the question is a `prompt` column's (TRL's name for the model's input): rendered as written


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
            return formats.gsm8k_gold(raw)
        if self.name == "math":
            return formats.last_boxed(raw) or raw.strip()
        if self.name in ("trl", "messages"):  # a reference solution: the verifiers' own rules (#### n or a number, \boxed{})
            return formats.gsm8k_gold(raw) if "####" in raw or _BARE_NUMBER.fullmatch(raw) else formats.last_boxed(raw) or raw.strip()
        return raw


# Where instruction-style files keep the question and the gold: GSM8K's and MATH's presets read them too, so a
# file recognised by its content (`#### n`, a boxed solution) in these columns is read by the preset it was recognised as.
OTHER_QUESTION_COLUMNS = ("prompt", "instruction", "input")  # Alpaca: the instruction, its input after it (_question)
OTHER_ANSWER_COLUMNS = ("solution", "output", "target", "ground_truth")
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
        question_columns=("question", "problem", *OTHER_QUESTION_COLUMNS),
        answer_columns=("answer", *OTHER_ANSWER_COLUMNS),
        template=GSM8K_INSTRUCTION + "\n\nQuestion: {question}\nAnswer:",
        chat_instruction=GSM8K_INSTRUCTION + "\n\n{question}",
        verifier="gsm8k",
    ),
    "math": Preset(
        name="math",
        question_columns=("problem", "question", *OTHER_QUESTION_COLUMNS),
        answer_columns=("answer", *OTHER_ANSWER_COLUMNS),
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
    # Chat datasets (formats.py): the prompt is a conversation rendered as given; these say where the gold is.
    "verl": Preset("verl", ("prompt",), ("reward_model.ground_truth",), "{question}", "{question}", verifier="data_source"),
    "trl": Preset("trl", ("prompt",), ("answer", "solution", "ground_truth", "completion"), "{question}", "{question}", verifier="math"),
    "messages": Preset("messages", ("messages",), ("answer", "solution"), "{question}", "{question}", verifier="math"),
    "none": Preset(
        name="none",
        question_columns=("question", "problem", *OTHER_QUESTION_COLUMNS),
        answer_columns=("answer", *OTHER_ANSWER_COLUMNS, "label"),
        template="{question}",
        chat_instruction="{question}",
        verifier="exact",
    ),
}


@functools.lru_cache(maxsize=64)  # keyed by mtime: render_prompt resolves the preset once per example
def _stage_of_file(path: str, mtime_ns: int) -> str | None:
    try:
        return read_file_metadata(path).get("stage")
    except Exception:  # not a toprcli file, or not readable: loading it reports the real problem
        return None


def _written_by(source: str) -> str | None:
    """The toprcli stage that wrote a local Parquet file, or a directory's first one (its ``toprcli`` metadata), else None."""
    path = Path(source).expanduser()
    if path.is_dir():
        path = next(iter(sorted(path.glob("*.parquet"))), path)
    if path.suffix.lower() != ".parquet" or not path.is_file():
        return None
    return _stage_of_file(str(path), path.stat().st_mtime_ns)


def resolve_preset(spec: DatasetSpec, row: dict[str, Any] | None = None) -> Preset:
    """The spec's preset; ``auto``: a chat format detected from a row's columns, else from the source's name."""
    if spec.preset != "auto":
        return PRESETS[spec.preset]
    if row is not None and (fmt := formats.detect(row)):
        preset = PRESETS[fmt]
        if fmt == "trl" and isinstance(row.get("label"), bool) and not spec.answer_column:  # its completions were judged, right or wrong
            raise UserError(f"{spec.source} is a TRL unpaired-preference dataset (prompt, completion, label): a completion is no gold "
                            "answer there — give the gold answer's column with --answer-column, or use a prompt dataset")
        if fmt in ("trl", "messages") and "####" in _reference(row, spec, preset):  # GSM8K-style references: math-verify
            return dataclasses.replace(preset, verifier="gsm8k")  # would read another number than the `#### n` line
        return preset
    src = spec.source.lower()
    if src.startswith("builtin:arith"):
        return PRESETS["arith"]
    if _written_by(spec.source) == "verifier-data":
        return PRESETS["verification"]
    name = Path(src).name if Path(spec.source).expanduser().exists() else src
    if "gsm8k" in name or "gsm8k" in src and "math" not in name:  # the file's own name first: gsm8k-rl/math500.jsonl is MATH
        return PRESETS["gsm8k"]
    if "math" in name:
        return PRESETS["math"]
    return _by_content(row, spec) or PRESETS["none"]


def _by_content(row: dict[str, Any] | None, spec: DatasetSpec) -> Preset | None:
    """A file named after neither, by its question and answer columns (the ones the spec names, else the first of the
    usual ones it has, as the presets read them): GSM8K's ``#### n`` answers, or a problem with a boxed solution."""
    if not _column_text(row, spec.question_column, PRESETS["none"].question_columns):
        return None
    answer = _column_text(row, spec.answer_column, PRESETS["none"].answer_columns)
    if "####" in answer:
        return PRESETS["gsm8k"]
    if "\\boxed" in answer or not spec.answer_column and "\\boxed" in _column_text(row, None, ("solution",)):
        return PRESETS["math"]
    if _BARE_NUMBER.fullmatch(answer):  # a number as the gold ("72", 72, "1,200", "-3/4"): read as GSM8K's, not exact text
        return PRESETS["gsm8k"]
    return None


def _reference(row: dict[str, Any], spec: DatasetSpec, preset: Preset) -> str:
    """A chat row's reference answer: its answer column, else a conversation's final assistant turn."""
    turns = row.get("messages")
    last = turns[-1] if formats.is_messages(turns) and turns else {}
    return _column_text(row, spec.answer_column, preset.answer_columns) or (last.get("content") or "" if last.get("role") == "assistant" else "")


def _column_text(row: dict[str, Any] | None, column: str | None, candidates: tuple[str, ...]) -> str:
    """A row's value in ``column``, else in the first of ``candidates`` it has, as text ("" for none, or not text or a number)."""
    column = column or next((c for c in candidates if row is not None and formats.has_path(row, c)), None)
    value = formats.get_path(row, column) if row is not None and column is not None else None
    return value if isinstance(value, str) else str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


_BARE_NUMBER = re.compile(r"\s*[-−]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?\s*\.?\s*")


# -- loading ------------------------------------------------------------------


def _load_rows(spec: DatasetSpec) -> list[dict[str, Any]]:
    """Raw rows of the requested split, from whichever source the spec names."""
    src = spec.source
    if src.startswith("builtin:"):
        return _load_builtin(spec)

    import datasets

    datasets.disable_progress_bars()
    path = Path(src).expanduser()
    if (stage := _written_by(src)) not in (None, "verifier-data"):  # rendered prompts and completions, ids in another column
        raise UserError(f"{src} was written by topr's {stage} stage, it is not a dataset — pass the dataset it was made from")
    try:
        if path.is_file():
            fmt = LOCAL_FORMATS.get(local_suffix(path))
            if fmt is None:
                raise UserError(f"{path}: unsupported file type {''.join(path.suffixes[-2:])!r} — use .jsonl, .json, .parquet, .csv "
                                "or .tsv (the text ones may be compressed: .gz, .bz2, .xz)")
            ds = read_local(datasets, fmt, path)
        elif path.is_dir() or "/" in src or re.fullmatch(r"[\w.-]+", src):
            if not path.exists() and (src.startswith((".", "/", "~")) or local_suffix(src) in LOCAL_FORMATS):
                raise UserError(f"dataset file not found: {src} — check the path")
            # A hub id, or a local directory laid out like a hub dataset repo.
            config_name = spec.config_name
            if config_name is None and not path.is_dir() and src.rstrip("/") in HUB_DEFAULT_CONFIGS:  # a local gsm8k/ is no hub id
                config_name = HUB_DEFAULT_CONFIGS[src.rstrip("/")]
            if (path / "state.json").is_file():  # one Dataset written by save_to_disk (it has no splits; load_dataset refuses it)
                ds = datasets.load_from_disk(str(path))
                if ds.split is not None and str(ds.split) != spec.split:  # eval's default split test reads what may be the train rows
                    warnings.warn(f"{src} was saved as the {ds.split} split and is read as {spec.split!r} (one saved split has no other) — "
                                  f"pass --split {ds.split} if it is that split (a train_test_split part keeps its parent's name)")
            else:
                ds = datasets.load_dataset(str(path) if path.is_dir() else src, config_name, split=spec.split)
        else:
            raise UserError(f"unknown dataset {src!r} — pass a hub id, a local file, or builtin:arith")
    except UserError:
        raise
    except Exception as e:  # datasets raises many types (DatasetNotFoundError, ...)
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        msg = " ".join(lines[:2] if "config" in str(e).lower() else lines[:1]) or type(e).__name__  # "pick one among the configs: [...]"
        if isinstance(e, ValueError):
            raise UserError(f"cannot load dataset {src!r} split {spec.split!r}: {msg} — check the split and config name{_hub_hint(path)}") from None
        fix = "the hub id (and network), or pass a local file" if isinstance(e, OSError) else "the hub id, config name and split"
        raise UserError(f"cannot load dataset {src!r}: {msg} — check {fix}{_hub_hint(path)}") from None
    if spec.limit is not None:
        ds = ds.select(range(min(spec.limit, len(ds))))
    return ds.to_list()


def _hub_hint(path: Path) -> str:
    return "" if path.exists() else " (a hub id needs the network or the hub's cache; builtin:gsm8k ships with topr)"


def _load_builtin(spec: DatasetSpec) -> list[dict[str, Any]]:
    name = spec.source.split(":", 1)[1]
    if name == "arith":  # --limit takes the first K of the same problems, as for any other source
        return arith_problems(spec.split, spec.size, seed=spec.seed, level=spec.level, at_most=True)[: spec.limit]
    if name != "gsm8k":
        raise UserError(f"unknown built-in dataset {spec.source!r} — choose one of: {', '.join('builtin:' + b for b in BUILTIN_DATASETS)}")
    path = GSM8K_DIR / f"{spec.split}.jsonl"
    if not path.is_file():
        raise UserError(f"builtin:gsm8k has no split {spec.split!r} — choose train or test")
    import datasets

    datasets.disable_progress_bars()
    ds = read_local(datasets, "json", path)
    if spec.limit is not None:
        ds = ds.select(range(min(spec.limit, len(ds))))
    return ds.to_list()


def _pick_column(row: dict[str, Any], explicit: str | None, candidates: tuple[str, ...], what: str, spec: DatasetSpec) -> str | None:
    """The column (or dotted path into struct columns) holding ``what``: the one asked for, else the first candidate present."""
    if explicit is not None:
        if formats.has_path(row, explicit):
            return explicit
        if "." in explicit and local_suffix(spec.source) in (".csv", ".tsv"):
            raise UserError(f"dataset {spec.source!r}: CSV files have no nested columns, so {explicit!r} cannot be a path — use a flat column or another format")
        raise UserError(f"dataset {spec.source!r} has no column {explicit!r} for the {what} — columns are: {', '.join(row)}")
    return next((c for c in candidates if formats.has_path(row, c)), None)


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
    """The examples of a dataset spec, with stable prompt ids, gold answers and (few_shot) their shots."""
    rows = _load_rows(spec)
    if not rows:
        raise UserError(f"dataset {spec.source!r} split {spec.split!r} is empty — check the source and split")
    probe = _probe_row(rows)
    preset = resolve_preset(spec, probe)
    q_col = _pick_column(probe, spec.question_column, preset.question_columns, "question", spec)
    if q_col is None:
        raise UserError(
            f"dataset {spec.source!r} has no question column (looked for {', '.join(preset.question_columns)}) — "
            f"columns are: {', '.join(rows[0])}; name it with --question-column (dataset.question_column in a config)"
        )
    a_col = _pick_column(probe, spec.answer_column, preset.answer_columns, "answer", spec)
    id_col = _pick_column(probe, spec.id_column, ("id",) if preset.name in ("arith", "verification") else (), "id", spec)
    parts = [_question(r, q_col, preset, f"dataset {spec.source!r} row {n}, column {q_col!r}", a_col is not None) for n, r in enumerate(rows)]
    if a_col is None and all(reference is None for _, _, reference in parts):  # caught before hours of generation, not at scoring
        warnings.warn(f"dataset {spec.source!r} has no answer column (looked for {', '.join(preset.answer_columns)}; columns are: "
                      f"{', '.join(probe)}): every gold answer is empty and a verifier that needs one will fail — name it with --answer-column (dataset.answer_column)")
    keys = [json.dumps(m) if m else q for q, m, _ in parts]  # a conversation is identified by all of it
    ids = [str(formats.get_path(r, id_col)) for r in rows] if id_col else prompt_ids(keys, spec.split)
    if id_col and len(set(ids)) != len(ids):
        raise UserError(f"dataset {spec.source!r}: column {id_col!r} has duplicate ids — pick a unique id column")
    examples = []
    for n, (pid, (q, messages, reference), r) in enumerate(zip(ids, parts, rows)):
        raw = formats.gold_text(formats.get_path(r, a_col) if a_col else None, reference, f"dataset {spec.source!r} row {n}, column {a_col!r}")
        # The worked solution (few-shot, warm start): verl's extra_info.answer, else a solution column beside the answer's.
        solution = _text(formats.get_path(r, "extra_info.answer") if preset.name == "verl" else r.get("solution") if a_col != "solution" else None)
        solution = solution or (reference if a_col else None)
        examples.append(Example(pid, q, preset.gold(raw), solution or raw, messages, _text(r.get("data_source")), preset=preset.name,
                                verbatim=q_col == "prompt"))
    if a_col is not None and (missing := sum(not (e.answer or "").strip() for e in examples)):  # verl's model-RM rows: ground_truth null
        warnings.warn(f"dataset {spec.source!r}: {missing} of {len(examples)} rows have no gold answer (column {a_col!r} empty, or no answer in it): a verifier "
                      "that needs one checks none of them (verdict error; curate leaves them out) — fill or drop those rows")
    if spec.few_shot:
        source, split = few_shot_source(spec.source, spec.few_shot_split)
        try:
            pool = [e for e in load_examples(dataclasses.replace(spec, source=source, split=split, few_shot=0, limit=None)) if e.solution]
        except UserError as e:  # about the shots' split, not the one asked for
            raise UserError(f"few-shot examples (--few-shot-split {spec.few_shot_split}): {e}") from None
        examples = [dataclasses.replace(e, shots=tuple(formats.choose_shots(pool, e.prompt_id, e.question, spec.few_shot, spec.few_shot_seed)))
                    for e in examples]
    return examples


def _probe_row(rows: list[dict[str, Any]], n: int = 100) -> dict[str, Any]:
    """The first row with its empty (null) columns filled from the next rows: what columns and format are read from."""
    probe = dict(rows[0])
    for key in [k for k, v in probe.items() if v is None]:
        probe[key] = next((r.get(key) for r in rows[1:n] if r.get(key) is not None), None)
    return probe


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _question(row: dict[str, Any], column: str, preset: Preset, where: str, gold_named: bool = False) -> tuple[str, tuple | None, str | None]:
    """(question, conversation or None, reference solution or None) of one row. A text column is the question under
    every preset (verl's extra_info.question too); ``gold_named``: the gold is --answer-column's, so a conversation
    that ends with the user's turn is whole."""
    value = formats.get_path(row, column)
    if value is None or isinstance(value, str) and not value.strip():
        raise UserError(f"{where}: no question (empty) — fix or drop that row, or pick another --question-column")
    if isinstance(value, dict):
        raise UserError(f"{where}: the question is a mapping (fields: {', '.join(map(str, list(value)[:4]))}) — name the field that holds it "
                        f"(--question-column {column}.FIELD)")
    if formats.is_saved_chat(value):  # it would reach the model as the text "[{'role': 'user', ..."
        raise UserError(f"{where}: the question is a conversation saved as text ({value[:40]}...) — save the dataset as JSONL or "
                        "Parquet, with the turns as a list of {role, content} (a CSV holds them only as text)")
    if not isinstance(value, (list, tuple)) and (isinstance(value, str) or preset.name not in ("verl", "messages")):
        extra = row.get("input") if column == "instruction" else None  # Alpaca: the instruction's input goes with it
        return str(value) + (f"\n\n{extra}" if isinstance(extra, str) and extra.strip() else ""), None, None
    messages, reference = formats.check_messages(value, where), None
    if preset.name == "messages" and not (gold_named and messages[-1]["role"] == "user"):
        messages, reference = formats.split_reference(messages, where)
    if not any(m["role"] == "user" for m in messages):
        raise UserError(f"{where}: the conversation has no user turn — the last user message is the question")
    return formats.last_user(messages), tuple(messages), reference


# -- rendering ----------------------------------------------------------------


def render_prompt(example: Example, spec: DatasetSpec, tokenizer: Any | None = None) -> str:
    """The prompt text exactly as the model sees it: a chat dataset's conversation as given, or the preset's
    instruction around the question; few-shot examples first; ``system_prompt`` where there is no system turn."""
    if example.messages is not None and not spec.chat_template:
        raise UserError(f"dataset {spec.source!r} holds chat messages — pass --chat-template (dataset.chat_template: true) to render them")
    if example.messages is not None and spec.template is not None:  # recorded as used, and the conversation rendered as given
        raise UserError(f"dataset {spec.source!r} holds chat messages, rendered as given: --template does nothing there — drop it "
                        "(an instruction for every prompt goes in --system-prompt)")
    if spec.template is not None and "{question}" not in spec.template:  # the chat instruction too: the problem must be in it
        raise UserError(f"prompt template {spec.template!r} has no {{question}} placeholder — add one")
    if spec.chat_template:
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise UserError("--chat-template is on (dataset.chat_template) but the tokenizer has no chat template — turn it off or use an instruct model")
        if example.messages is not None:
            messages, shots = list(example.messages), [(s.question, s.solution) for s in example.shots]
        else:
            instruction = spec.template or ("{question}" if example.verbatim else _preset_of(example, spec).chat_instruction)
            messages = [{"role": "user", "content": instruction.replace("{question}", example.question)}]
            shots = [(instruction.replace("{question}", s.question), s.solution) for s in example.shots]
        messages = formats.with_shots(formats.with_system(messages, spec.system_prompt), shots)
        prefill = messages[-1]["role"] == "assistant"  # a prompt that ends with the model's first words: it goes on from them (TRL's way)
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=not prefill, continue_final_message=prefill)
        except Exception as e:  # jinja2.TemplateError: a template's own raise_exception, e.g. Gemma's "System role not supported"
            if type(e).__module__.split(".")[0] != "jinja2":
                raise
            system = " — drop --system-prompt (or the rows' system turns)" if any(m["role"] == "system" for m in messages) else ""
            raise UserError(f"the tokenizer's chat template refused prompt {example.prompt_id}: {e}{system}") from None
    template = spec.template or ("{question}" if example.verbatim else _preset_of(example, spec).template)
    shots = "".join(f"Question: {s.question}\nAnswer: {s.solution}\n\n" for s in example.shots)
    return shots + template.replace("{question}", example.question)


def _preset_of(example: Example, spec: DatasetSpec) -> Preset:
    return PRESETS[example.preset] if example.preset else resolve_preset(spec)


def encode_prompt(text: str, tokenizer: Any, spec: DatasetSpec) -> list[int]:
    """Token ids fed to the engine. Chat templates already carry BOS; plain text gets it added."""
    return list(tokenizer(text, add_special_tokens=not spec.chat_template)["input_ids"])


def default_verifier(spec: DatasetSpec) -> str:
    """The verifier a dataset's answers are checked with (``data_source``: per row, verl's source names it)."""
    if spec.preset != "auto":
        return PRESETS[spec.preset].verifier
    rows = _load_rows(dataclasses.replace(spec, limit=min(spec.limit or 100, 100), few_shot=0))
    return resolve_preset(spec, _probe_row(rows) if rows else None).verifier  # the rows load_examples reads the preset from
