"""Prompts for a generation run: loaded, rendered, tokenised, and checked against the context.

Used by the generate stage (and so by eval). ``build_prompts`` turns dataset
examples into :class:`Prompt` (the text exactly as fed to the model and its
token ids, never re-tokenised later); ``drop_long`` and ``check_room`` decide,
before any engine starts, what to do with prompts that leave no room for a
completion in the model's context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toprcli.config import GenerateConfig
from toprcli.data.datasets import encode_prompt, load_examples, render_prompt
from toprcli.errors import UserError


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    prompt: str  # rendered: the text exactly as fed to the model
    answer: str | None
    token_ids: list[int]
    question: str | None = None  # the dataset's question before rendering (what a verifier is shown)
    messages: tuple | None = None  # a chat dataset's conversation (kept as the samples' `messages` column)
    data_source: str | None = None  # verl's data_source (kept as a column: score can pick the verifier by it)
    preset: str | None = None  # how the dataset was read and the prompt rendered (datasets.PRESETS): said in the summary


# -- planning -----------------------------------------------------------------


def build_prompts(cfg: GenerateConfig, examples: list | None, tokenizer: Any) -> list[Prompt]:
    """Examples (given, or loaded from ``cfg.dataset``; the first ``dataset.limit``) rendered and tokenised."""
    if examples is None:
        examples = load_examples(cfg.dataset)
    if cfg.dataset.limit is not None:
        examples = examples[: cfg.dataset.limit]
    if not examples:
        raise UserError(f"dataset {cfg.dataset.source!r} has no examples — check the source, split and --limit")
    prompts = []
    for ex in examples:
        text = render_prompt(ex, cfg.dataset, tokenizer)
        prompts.append(Prompt(ex.prompt_id, text, ex.answer, encode_prompt(text, tokenizer, cfg.dataset), ex.question, ex.messages, ex.data_source,
                              f"{ex.preset}{', prompts as written' if ex.verbatim and not cfg.dataset.template else ''}"))
    return prompts


def drop_long(prompts: list[Prompt], context: int | None, skip_long: bool) -> tuple[list[Prompt], list[Prompt]]:
    """Split off prompts that leave no room for a completion; an error unless ``skip_long``."""
    if context is None:
        return prompts, []
    long = [p for p in prompts if len(p.token_ids) >= context]
    if long and not skip_long:
        named = ", ".join(f"{p.prompt_id} ({len(p.token_ids)} tokens)" for p in long[:5])
        more = f" and {len(long) - 5} more" if len(long) > 5 else ""
        raise UserError(
            f"{len(long)} of {len(prompts)} prompts do not fit the model's context of {context} tokens: {named}{more} "
            "— raise --max-model-len if the model allows, shorten the prompts, or (topr generate only: eval scores every "
            "prompt) drop them with --skip-long"
        )
    keep = [p for p in prompts if len(p.token_ids) < context]
    if not keep:
        raise UserError(f"all {len(prompts)} prompts are longer than the model's context of {context} tokens — use shorter prompts or a longer-context model")
    return keep, long


def check_room(prompts: list[Prompt], context: int | None, max_new_tokens: int, clip: bool) -> dict[str, Any] | None:
    """max_new_tokens must fit after every prompt, or be clipped on request (then say how much).

    Returns None when every request is honoured, else what was clipped (for the
    manifest and the summary).
    """
    if context is None or not prompts:
        return None
    longest = max(prompts, key=lambda p: len(p.token_ids))
    short = [p for p in prompts if len(p.token_ids) + max_new_tokens > context]
    if not short:
        return None
    if not clip:
        raise UserError(
            f"max_new_tokens {max_new_tokens} does not fit the model's context of {context} tokens after "
            f"{len(short)} of {len(prompts)} prompts (longest: {longest.prompt_id}, {len(longest.token_ids)} tokens, "
            f"leaves {context - len(longest.token_ids)}) — lower --max-new-tokens (or, with topr generate, pass --clip-to-context "
            "to cut those completions at the context)"
        )
    return {
        "prompts_clipped": len(short),
        "context": context,
        "max_new_tokens_requested": max_new_tokens,
        "max_new_tokens_min_effective": context - len(longest.token_ids),
    }
