"""Continuation log-probs on both backends, and a verifier's P(Yes) built from them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from toprcli.generation.verdicts import spelling_ids, verdict_scores

PROMPTS = [[1] + [40 + i, 41, 42 + i % 3, 30] * (1 + i % 3) for i in range(6)]
CONTINUATIONS = [[50], [51, 52], [53, 54, 55], [], [56, 57], [58]]


def reference(model_dir, prompts, continuations) -> list[float]:
    """Σ log softmax of each continuation token, one plain fp32 transformers forward per pair."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p, c in zip(prompts, continuations):
            if not c:
                out.append(0.0)
                continue
            logits = lm(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
            out.append(float(torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None]).sum()))
    return out


def test_hf_continuation_logprobs_match_a_plain_forward(hf_backend, tiny_model_dir):
    got = hf_backend.continuation_logprobs(PROMPTS, CONTINUATIONS)
    assert got == pytest.approx(reference(tiny_model_dir, PROMPTS, CONTINUATIONS), abs=1e-4)
    assert got[3] == 0.0  # an empty continuation has probability 1


@pytest.mark.vllm
def test_vllm_continuation_logprobs_match_the_hf_backend(vllm_backend, hf_backend):
    got = vllm_backend.continuation_logprobs(PROMPTS, CONTINUATIONS)
    assert got == pytest.approx(hf_backend.continuation_logprobs(PROMPTS, CONTINUATIONS), abs=1e-4)


def test_p_yes_sums_the_spellings_and_normalises(hf_backend, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    spellings = spelling_ids(tok)
    assert len(spellings["Yes"]) == 2 and spellings["Yes"][0] == tok("Yes", add_special_tokens=False)["input_ids"]
    scores, mass = verdict_scores(hf_backend, tok, PROMPTS[:3])
    lp = {v: [hf_backend.continuation_logprobs(PROMPTS[:3], [s] * 3) for s in spellings[v]] for v in ("Yes", "No")}
    yes = np.exp(np.array(lp["Yes"])).sum(axis=0)
    no = np.exp(np.array(lp["No"])).sum(axis=0)
    assert scores == pytest.approx(yes / (yes + no)) and mass == pytest.approx(yes + no)
    assert all(0 < s < 1 for s in scores) and all(0 < m <= 1 for m in mass)
    assert not any(math.isnan(s) for s in scores)


def test_a_sentencepiece_verdict_is_scored_with_and_without_its_leading_space():
    """A SentencePiece tokenizer that always adds the leading space encodes "Yes" and " Yes" as ▁Yes alone; the
    no-space piece a chat turn starts with after a newline once went unscored (its mass counted as no verdict)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "▁Yes": 1, "Yes": 2, "▁No": 3, "No": 4, "▁": 5}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")
    assert tokenizer("Yes", add_special_tokens=False)["input_ids"] == tokenizer(" Yes", add_special_tokens=False)["input_ids"] == [1]
    assert spelling_ids(tokenizer) == {"Yes": [[1], [2]], "No": [[3], [4]]}
