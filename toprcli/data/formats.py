"""The dataset formats the ecosystem publishes, read as they are written.

* **Chat messages**: a prompt column holding ``[{"role": ..., "content": ...}, ...]`` (TRL's
  conversational format, verl's ``prompt``) is kept as a conversation and rendered with the
  tokenizer's chat template exactly as given — its own system turn kept, no instruction added.
* **Nested columns**: ``reward_model.ground_truth`` reads a field of a struct column; a column
  literally named ``a.b`` wins over the path.
* **Formats, detected from the columns** (never the file name):
  ``verl`` — ``prompt`` messages and ``reward_model.ground_truth`` (``data_source`` kept);
  ``trl`` — ``prompt`` messages and an ``answer``/``solution`` column;
  ``messages`` — a ``messages`` conversation whose last assistant turn is the reference solution (an
  ``answer``/``solution`` column beside it is the gold, the turn the worked solution).
* **Few-shot prompts**: k solved examples from another split, chosen per problem from a seed and
  the problem's id (so a resumed or resharded run picks the same ones), never the problem itself.
"""

from __future__ import annotations

import ast
import decimal
import json
import math
import random
import re
from typing import Any

from toprcli.errors import UserError

ROLES = ("system", "user", "assistant", "tool")
def get_path(row: dict[str, Any], column: str) -> Any:
    """``row[column]``, or the field a dotted path names inside struct columns (a literal key wins)."""
    if column in row:
        return row[column]
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def has_path(row: dict[str, Any], column: str) -> bool:
    if column in row:
        return True
    head, _, rest = column.partition(".")
    return bool(rest) and isinstance(row.get(head), dict) and has_path(row[head], rest)


def is_messages(value: Any) -> bool:
    """Does ``value`` look like a chat conversation (a non-empty list of role/content mappings)?"""
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def is_saved_chat(value: Any) -> bool:
    """Is ``value`` a conversation written out as text (pandas' ``to_csv`` of a messages column, or ``json.dumps``)?"""
    if not isinstance(value, str) or not value.lstrip().startswith("[{") or "role" not in value:
        return False
    try:
        parsed = json.loads(value)
    except ValueError:
        try:
            parsed = ast.literal_eval(value.strip())  # Python's repr, as to_csv writes a list of dicts: literals only, never run
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return False
    return is_messages(parsed)


def check_messages(value: Any, where: str) -> list[dict[str, str]]:
    """``value`` as a list of {"role", "content"} messages, or one clear error naming the row."""
    if not isinstance(value, (list, tuple)) or not value:
        raise UserError(f"{where}: expected a list of chat messages [{{role, content}}, ...], got {str(value)[:80]!r}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise UserError(f"{where}: message {i} must be a mapping with string 'role' and 'content', got {str(m)[:80]!r}")
        if m["role"] not in ROLES:
            raise UserError(f"{where}: message {i} has role {m['role']!r} — use one of {', '.join(ROLES)}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def detect(row: dict[str, Any]) -> str | None:
    """The format a row is written in: verl, trl (conversational, or text prompt-completion), messages, or None (plain columns)."""
    if is_messages(row.get("prompt")) or isinstance(row.get("prompt"), str) and has_path(row, "reward_model.ground_truth"):
        return "verl" if has_path(row, "reward_model.ground_truth") else "trl"  # verl's prompt: a conversation, or its text
    if is_messages(row.get("messages")):
        return "messages"
    if isinstance(row.get("prompt"), str) and "completion" in row:  # TRL's standard (text) prompt-completion
        return "trl"
    return None


def gold_text(value: Any, reference: str | None, where: str) -> str | None:
    """The gold of a row: its answer column's ``value`` (a short gold beats the conversation's last assistant turn, as
    OpenR1-Math's ``answer`` beside its ``messages``), else the ``reference`` turn. A conversational value (TRL's
    ``completion``) is its last turn's content; a list of one answer (verl's ``ground_truth: ["42"]``) is that answer."""
    blank = value is None or isinstance(value, str) and not value.strip()
    if blank or reference is not None and isinstance(value, (list, tuple)) and not is_messages(value) and len(value) != 1:
        return reference if reference is not None or value is None else value  # no one answer in the column: the conversation's own
    if is_messages(value):
        return value[-1]["content"] if value else None
    if isinstance(value, (list, tuple)):  # several accepted answers: a verifier checks against one gold, and "['4', 'four']" matches none
        if len(value) != 1:
            raise UserError(f"{where}: the gold answer is a list of {len(value)} ({str(value)[:80]}), and a verifier checks one gold "
                            f"per prompt — keep one answer per row, or point --answer-column at a column that holds one")
        value = value[0]
    if isinstance(value, float) and value.is_integer():  # JSON answers 5 and 2.5 in one column are read as floats: 5 is "5"
        return str(int(value))
    if isinstance(value, float) and math.isfinite(value):  # 1e-05 is "0.00001": a gold a number reader reads
        return f"{decimal.Decimal(repr(value)):f}"
    return None if value is None else str(value)


def split_reference(messages: list[dict[str, str]], where: str) -> tuple[list[dict[str, str]], str]:
    """A ``messages`` conversation → (the prompt turns, the last assistant turn's content)."""
    if messages[-1]["role"] != "assistant":
        raise UserError(f"{where}: the conversation must end with the assistant's reference answer, it ends with a {messages[-1]['role']!r} turn — or name the gold answer's column with --answer-column")
    if not any(m["role"] == "user" for m in messages[:-1]):
        raise UserError(f"{where}: the conversation has no user turn before the reference answer")
    return messages[:-1], messages[-1]["content"]


def last_user(messages: list[dict[str, str]]) -> str:
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def with_system(messages: list[dict[str, str]], system_prompt: str | None) -> list[dict[str, str]]:
    """The conversation with ``system_prompt`` first, only where it has no system turn of its own."""
    if system_prompt and not any(m["role"] == "system" for m in messages):
        return [{"role": "system", "content": system_prompt}, *messages]
    return list(messages)


def with_shots(messages: list[dict[str, str]], shots: list[tuple[str, str]]) -> list[dict[str, str]]:
    """Few-shot turns (user question, assistant solution) after the leading system turns."""
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system":
        lead += 1
    turns = [t for q, a in shots for t in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]
    return [*messages[:lead], *turns, *messages[lead:]]


def choose_shots(pool: list[Any], prompt_id: str, question: str, k: int, seed: int) -> list[Any]:
    """k examples of ``pool`` for one problem: seeded by (seed, prompt id), never the problem itself."""
    rng = random.Random(f"{seed}:{prompt_id}")
    drawn = rng.sample(range(len(pool)), min(len(pool), k + 1))  # one spare: the problem may be drawn
    picked = [pool[i] for i in drawn if pool[i].question != question][:k]
    if len(picked) < k:  # the problem drawn twice (a pool with duplicates): draw on from the rest
        rest = sorted(set(range(len(pool))) - set(drawn))
        picked += [pool[i] for i in rng.sample(rest, len(rest)) if pool[i].question != question][: k - len(picked)]
    if len(picked) < k:
        raise UserError(f"few_shot {k}: the few-shot split has only {len(pool)} solved examples to choose from — lower dataset.few_shot")
    return picked


def gsm8k_gold(raw: str) -> str:
    """The answer after the last ``####`` of a GSM8K-style solution, to the end of its line (the verifiers read
    the last one; a reference may go on, as MetaMathQA's ``#### 18\nThe answer is: 18``), or the whole value."""
    tail = raw.rsplit("####", 1)[1].strip() if "####" in raw else raw
    return tail.split("\n", 1)[0].strip().replace(",", "")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; ``\\boxed 5`` (MATH writes it so) is ``5``."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    end = start + (6 if text.startswith("\\boxed", start) else 5)
    after = re.match(r"([ \t]*)(\{?)([^\s${}]*)", text[end:])
    if not after.group(2):  # no brace of its own (never a later, unrelated one): ``\boxed 5``, or nothing
        return after.group(3) if after.group(1) and after.group(3) else None
    i = end + len(after.group(1))
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None
