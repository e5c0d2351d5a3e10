"""The transformers backend: a KV-cached sampling loop with the same columns as vLLM.

Reads a model directory (or hub id); writes no files. For machines without
vLLM, and as a cross-check of the engine's log-probs.

Sampling is our own loop over the model's forward (with a ``DynamicCache``),
not ``model.generate``: ``generate`` fills every sampling field a call leaves
unset from the checkpoint's ``generation_config.json`` — instruct checkpoints
ship temperature, top-p, top-k and repetition penalties there — so the
distribution sampled would not be the one asked for, and the stored μ would
be wrong. Here the only processing is :func:`toprcli.sampling.processed_logits`
(temperature, min-p, top-k, top-p in vLLM's order), the same function the
trainer computes log π with; the behaviour log-prob of each sampled token is
read from the same processed distribution it was drawn from.

Prompts are batched with left padding (attention mask and position ids from
the mask, so padding does not change the result beyond float rounding) and
sorted by length so each batch wastes little padding. Completions end after
the first EOS (kept, with its log-prob, like vLLM), at ``max_new_tokens``, or
where the model's context is full.

Seeds: tokens are drawn from the global torch RNG for the whole batch, so
results are reproducible per (shard, batch); :meth:`HFBackend.generate` reseeds
from the requests' seeds before each batch.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from toprcli.errors import UserError
from toprcli.generation.base import (
    BackendOptions,
    Completion,
    ProgressEvent,
    ProgressFn,
    PromptRequest,
    SamplingParams,
    cuda_available,
    derive_seed,
    release_cuda_cache,
    resolve_dtype,
)
from toprcli.generation.model_info import config_context_length, first_line, same_architecture, stop_token_ids


class HFBackend:
    """A transformers causal LM sampled token by token through :mod:`toprcli.sampling`, batched with left padding."""

    name = "hf"

    def __init__(self, options: BackendOptions) -> None:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.options = options
        self.engine_version = transformers.__version__
        self.on_gpu = cuda_available()
        self.device = torch.device("cuda" if self.on_gpu else "cpu")
        self.dtype = resolve_dtype(options.dtype, self.on_gpu)
        self.model = options.model
        self.reloads: list[dict] = []
        self._torch = torch
        self._auto_model = AutoModelForCausalLM
        # The caller's, given back by close(): transformers' bars ("Loading weights" would break ours) and torch's generator
        # (reseed() seeds it per shard; a notebook's was left at the last shard's seed).
        self._callers: tuple[bool, Any] | None = (transformers.utils.logging.is_progress_bar_enabled(), torch.random.get_rng_state())
        transformers.utils.logging.disable_progress_bar()
        t0 = time.perf_counter()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(options.model)
        except Exception as e:
            raise UserError(f"cannot load the tokenizer of {options.model}: {first_line(e)} — check the model dir") from None
        self.net = self._load(options.model)
        self.start_seconds = time.perf_counter() - t0
        ctx = options.max_model_len or config_context_length(self.net.config)
        # Unknown context (no length key in the config): only max_new_tokens bounds a completion.
        self.max_model_len = int(ctx) if ctx else 2**31 - 1
        # As vLLM: the tokenizer's eos and the generation config's (a chat fine-tune's tokenizer may end turns with another).
        self.eos_token_ids = stop_token_ids(self.tokenizer.eos_token_id, self.net.generation_config.eos_token_id)
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.net.generation_config.pad_token_id
        if pad is None:
            pad = min(self.eos_token_ids) if self.eos_token_ids else 0
        self.pad_token_id = int(pad)
        self.info = {
            "backend": "hf",
            "engine_version": self.engine_version,
            "device": self.device.type,
            "dtype": self.dtype,
            "batch_size": options.batch_size,
            "max_model_len": self.max_model_len,
            "logprobs_mode": "processed (after temperature, min-p, top-k, top-p)",
            "engine_start_s": round(self.start_seconds, 2),
        }

    def _load(self, model: str) -> Any:
        dtype = getattr(self._torch, self.dtype)
        try:
            net = self._auto_model.from_pretrained(model, dtype=dtype)
        except Exception as e:
            raise UserError(f"cannot load model {model}: {first_line(e)} — check the model dir") from None
        return net.to(self.device).eval()

    def close(self) -> None:
        if getattr(self, "net", None) is not None:
            self.net = None
            gc.collect()
            release_cuda_cache()
        if getattr(self, "_callers", None) is not None:
            import transformers

            bars, rng = self._callers
            self._torch.random.set_rng_state(rng)
            if bars:
                transformers.utils.logging.enable_progress_bar()
            self._callers = None

    def __enter__(self) -> HFBackend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def reseed(self, seed: int) -> None:
        self._torch.manual_seed(int(seed))

    def load_weights(self, model_dir: str, *, force_restart: bool = False) -> dict:
        """Load ``model_dir``'s weights (state dict into the same module when shapes match)."""
        t0 = time.perf_counter()
        mode = "restart"
        if not force_restart and self.net is not None:
            try:
                if same_architecture(self.model, str(model_dir)):
                    new = self._auto_model.from_pretrained(str(model_dir), dtype=getattr(self._torch, self.dtype))
                    self.net.load_state_dict(new.state_dict())
                    del new
                    mode = "inplace"
            except Exception:
                mode = "restart"
        if mode == "restart":
            self.net = self._load(str(model_dir))
        self.model = str(model_dir)
        rec = {"mode": mode, "seconds": round(time.perf_counter() - t0, 3), "model": str(model_dir)}
        self.reloads.append(rec)
        return rec

    # -- sampling -------------------------------------------------------------

    def generate(
        self,
        requests: list[PromptRequest],
        params: SamplingParams,
        *,
        progress: ProgressFn | None = None,
    ) -> list[list[Completion]]:
        if self.net is None:
            raise RuntimeError("the hf backend is closed")
        results: list[list[Completion] | None] = [None] * len(requests)
        # Longest first: similar lengths share a batch (less padding), and an
        # out-of-memory error shows up on the first batch.
        # Ties broken by seed, so the same requests in another order make the same batches.
        order = sorted(
            range(len(requests)),
            key=lambda i: (-len(requests[i].prompt_token_ids), requests[i].seed if requests[i].seed is not None else -1, i),
        )
        bs = max(1, self.options.batch_size)
        done_prompts = done_tokens = 0
        for start in range(0, len(order), bs):
            idx = order[start : start + bs]
            batch = [requests[i] for i in idx]
            if any(r.seed is not None for r in batch):
                self.reseed(derive_seed(*(r.seed for r in batch)))
            for i, comps in zip(idx, self._generate_batch(batch, params)):
                results[i] = comps
                done_tokens += sum(len(c.token_ids) for c in comps)
            done_prompts += len(batch)
            if progress is not None:
                progress(ProgressEvent(done_prompts, done_prompts * params.n, done_tokens))
        return results  # type: ignore[return-value]

    def continuation_logprobs(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[float]:
        """Σ log P(continuation tokens | prompt) per pair, batched (left padding, logits of the last positions only)."""
        import torch

        if self.net is None:
            raise RuntimeError("the hf backend is closed")
        seqs = [list(p) + list(c) for p, c in zip(prompts, continuations)]
        out = [0.0] * len(seqs)
        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
        bs = max(1, self.options.batch_size)
        with torch.inference_mode():
            for start in range(0, len(order), bs):
                idx = order[start : start + bs]
                width = max(len(seqs[i]) for i in idx)
                keep = max(len(continuations[i]) for i in idx)
                ids = torch.full((len(idx), width), self.pad_token_id, dtype=torch.long)
                mask = torch.zeros((len(idx), width), dtype=torch.long)
                for row, i in enumerate(idx):
                    ids[row, width - len(seqs[i]) :] = torch.tensor(seqs[i], dtype=torch.long)
                    mask[row, width - len(seqs[i]) :] = 1
                ids, mask = ids.to(self.device), mask.to(self.device)
                positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: positions from the mask
                logits = self.net(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep + 1).logits
                logq = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, keep, V): predicts the last `keep` tokens
                for row, i in enumerate(idx):
                    c = len(continuations[i])
                    if c:
                        targets = torch.tensor(continuations[i], device=self.device)
                        out[i] = float(logq[row, keep - c :].gather(1, targets[:, None]).sum())
        return out

    def _generate_batch(self, batch: list[PromptRequest], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` samples of each prompt: one KV-cached decoding loop over the whole batch.

        Our own loop, not ``model.generate``: transformers fills every sampling field a call
        leaves unset from the checkpoint's ``generation_config.json`` (instruct models ship
        temperature, top-p, top-k and repetition penalties there), which would silently change
        the distribution and make the stored μ wrong. Here the only processing is
        :func:`toprcli.sampling.processed_logits`, the same code the trainer uses.
        """
        import torch
        from transformers import DynamicCache

        from toprcli.sampling import processed_logits

        n = params.n
        lengths = [len(r.prompt_token_ids) for r in batch]
        width = max(lengths)
        if self.max_model_len - max(lengths) < 1:
            raise UserError(f"a prompt of {max(lengths)} tokens leaves no room in the model's context of {self.max_model_len} — pass --skip-long")
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, r in enumerate(batch):
            L = len(r.prompt_token_ids)
            ids[row, width - L :] = torch.tensor(r.prompt_token_ids, dtype=torch.long)
            mask[row, width - L :] = 1
        # n samples per prompt: repeat each row n times (row k*n + j is sample j of prompt k).
        ids = ids.repeat_interleave(n, dim=0).to(self.device)
        mask = mask.repeat_interleave(n, dim=0).to(self.device)
        rows = ids.shape[0]
        processing = params.processing()
        eos = torch.tensor(sorted(self.eos_token_ids) or [-1], device=self.device)
        # Each row stops at max_new_tokens or where its prompt fills the context.
        caps = torch.tensor([min(params.max_new_tokens, self.max_model_len - L) for L in lengths], device=self.device)
        caps = caps.repeat_interleave(n)  # (R,)
        max_new = int(caps.max())

        cache = DynamicCache()
        step_ids, positions = ids, (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: positions from the mask
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        n_real = torch.zeros(rows, dtype=torch.long, device=self.device)  # sampled tokens per row
        tokens, logprobs = [], []
        with torch.inference_mode():
            for step in range(max_new):
                logits = self.net(
                    input_ids=step_ids, attention_mask=mask, position_ids=positions,
                    past_key_values=cache, use_cache=True, logits_to_keep=1,
                ).logits[:, -1]  # (R, V)
                if processing.greedy:  # vLLM reports the T = 1 log-softmax for greedy requests
                    logq = torch.log_softmax(logits.float(), dim=-1)
                    tok = logq.argmax(dim=-1)
                else:
                    logq = torch.log_softmax(processed_logits(logits, processing), dim=-1)  # (R, V)
                    tok = torch.multinomial(logq.exp(), 1).squeeze(1)
                lp = logq.gather(1, tok[:, None]).squeeze(1)
                tok = torch.where(done, torch.full_like(tok, self.pad_token_id), tok)
                tokens.append(tok)
                logprobs.append(lp)
                n_real += (~done).long()
                done |= torch.isin(tok, eos) | (caps <= step + 1)
                if bool(done.all()):
                    break
                step_ids = tok[:, None]
                positions = positions[:, -1:] + 1
                mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype, device=self.device)], dim=1)
        seqs = torch.stack(tokens, dim=1).cpu()  # (R, steps)
        lps = torch.stack(logprobs, dim=1).float().cpu()
        n_real = n_real.cpu().tolist()
        results: list[list[Completion]] = []
        for k in range(len(batch)):
            comps = []
            for j in range(n):
                row = k * n + j
                toks = seqs[row, : n_real[row]].tolist()
                reason = "stop" if toks and toks[-1] in self.eos_token_ids else "length"
                comps.append(Completion(token_ids=toks, logprobs=lps[row, : n_real[row]].tolist(), finish_reason=reason))
            results.append(comps)
        return results


def processed_logprobs(
    net: Any,
    prompt_token_ids: list[list[int]],
    completion_token_ids: list[list[int]],
    params: SamplingParams,
) -> list[list[float]]:
    """log μ of given completions under ``net`` with the sampler's processing, one forward each.

    The distribution the backends sample from (:mod:`toprcli.sampling`), at
    every completion token: a cross-check of stored behaviour log-probs (fp32
    recomputation on exactly the stored tokens).
    """
    import torch

    from toprcli.sampling import token_logprobs

    device = next(net.parameters()).device
    processing = params.processing()
    if processing.greedy:
        from toprcli.sampling import Processing

        processing = Processing()
    out = []
    with torch.inference_mode():
        for prompt, comp in zip(prompt_token_ids, completion_token_ids):
            if not comp:
                out.append([])
                continue
            ids = torch.tensor([list(prompt) + list(comp)], device=device)
            logits = net(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
            lp, _ = token_logprobs(logits, torch.tensor(comp, device=device), processing)
            out.append(lp.tolist())
    return out
