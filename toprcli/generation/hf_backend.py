"""The transformers backend: ``model.generate`` with the same columns as vLLM.

Reads a model directory (or hub id); writes no files. For machines without
vLLM, and as a cross-check of the engine's log-probs.

Behaviour log-probs come from the *processed* scores, the distribution that
``generate`` actually samples from: the temperature / top-k / top-p warpers
are passed as our own logits processors (in vLLM's order: temperature, top-k,
top-p) followed by :class:`_SampledLogprobRecorder`, which keeps
``log_softmax`` of the processed scores for one step and, on the next step,
gathers the value at the token that was sampled. Memory stays O(batch × vocab),
unlike ``output_scores`` (O(steps × batch × vocab)).

Prompts are batched with left padding (attention mask and position ids from
the mask, so padding does not change the result beyond float rounding) and
sorted by length so each batch wastes little padding. Completions are cut after
the first EOS (kept, with its log-prob, like vLLM) and at the model's context.

Seeds: transformers samples from the global torch RNG for the whole batch, so
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
    resolve_dtype,
)


def _context_length(config: Any) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


class _SampledLogprobRecorder:
    """A logits processor, last in the list: records log μ of each sampled token.

    At step t it receives the processed scores s_t (B, V) and stores
    ``log_softmax(s_t)``; at step t+1 the token sampled at t is ``input_ids[:, -1]``
    and its log-prob is gathered. The last step's token is gathered by
    :meth:`finish` from the final sequences.
    """

    def __init__(self) -> None:
        self.prev = None  # (B, V) log-probs of the previous step
        self.values: list[Any] = []  # one (B,) tensor per generated token

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.prev is not None:
            self.values.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, last_tokens: Any) -> Any:
        import torch

        if self.prev is not None:
            self.values.append(self.prev.gather(1, last_tokens[:, None]).squeeze(1))
            self.prev = None
        return torch.stack(self.values, dim=1) if self.values else None  # (B, T)


class HFBackend:
    """A transformers causal LM sampling with ``generate``, batched with left padding."""

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
        transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars would break ours
        t0 = time.perf_counter()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(options.model)
        except Exception as e:
            raise UserError(f"cannot load the tokenizer of {options.model}: {_first_line(e)} — check the model dir") from None
        self.net = self._load(options.model)
        self.start_seconds = time.perf_counter() - t0
        ctx = _context_length(self.net.config)
        self.max_model_len = int(options.max_model_len or ctx or 2048)
        eos = self.net.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_token_ids = frozenset([eos] if isinstance(eos, int) else list(eos or []))
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
            "logprobs_mode": "processed (after temperature/top-k/top-p warpers)",
            "engine_start_s": round(self.start_seconds, 2),
        }

    def _load(self, model: str) -> Any:
        dtype = getattr(self._torch, self.dtype)
        try:
            net = self._auto_model.from_pretrained(model, dtype=dtype)
        except Exception as e:
            raise UserError(f"cannot load model {model}: {_first_line(e)} — check the model dir") from None
        return net.to(self.device).eval()

    def close(self) -> None:
        if getattr(self, "net", None) is not None:
            self.net = None
            gc.collect()

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
                from toprcli.generation.vllm_backend import same_architecture

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

    def _generate_batch(self, batch: list[PromptRequest], params: SamplingParams) -> list[list[Completion]]:
        import torch
        from transformers import (
            GenerationConfig,
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        n = params.n
        lengths = [len(r.prompt_token_ids) for r in batch]
        width = max(lengths)
        room = self.max_model_len - min(lengths)
        if room < 1:
            raise UserError(f"a prompt of {min(lengths)} tokens leaves no room in the model's context of {self.max_model_len} — pass --skip-long")
        max_new = min(params.max_new_tokens, room)
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, r in enumerate(batch):
            L = len(r.prompt_token_ids)
            ids[row, width - L :] = torch.tensor(r.prompt_token_ids, dtype=torch.long)
            mask[row, width - L :] = 1
        # n samples per prompt: repeat each row n times (row k*n + j is sample j of prompt k).
        ids = ids.repeat_interleave(n, dim=0).to(self.device)
        mask = mask.repeat_interleave(n, dim=0).to(self.device)

        processors = LogitsProcessorList()
        if not params.greedy:
            if params.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                processors.append(TopKLogitsWarper(top_k=params.top_k, min_tokens_to_keep=1))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(top_p=params.top_p, min_tokens_to_keep=1))
        recorder = _SampledLogprobRecorder()
        processors.append(recorder)
        # A fresh config: the model's own generation_config may carry sampling defaults
        # (temperature, top_p, repetition penalty) that would change μ.
        # Greedy decoding takes no sampling flags (transformers warns about them).
        sampling = {} if params.greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        gen_cfg = GenerationConfig(
            do_sample=not params.greedy,
            **sampling,
            max_new_tokens=max_new,
            min_new_tokens=0,
            eos_token_id=sorted(self.eos_token_ids) or None,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.net.generation_config.bos_token_id,
            num_beams=1,
            use_cache=True,
            return_dict_in_generate=True,
        )
        with torch.inference_mode():
            out = self.net.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg, logits_processor=processors)
        seqs = out.sequences[:, width:].cpu()  # (B*n, T)
        lps = recorder.finish(out.sequences[:, -1])
        lps = lps.cpu() if lps is not None else torch.zeros(seqs.shape)
        eos = self.eos_token_ids
        results: list[list[Completion]] = []
        for k, L in enumerate(lengths):
            cap = min(max_new, self.max_model_len - L)
            comps = []
            for j in range(n):
                row = k * n + j
                toks = seqs[row].tolist()
                vals = lps[row].tolist()
                end, reason = len(toks), "length"
                for t, tok in enumerate(toks):
                    if tok in eos:
                        end, reason = t + 1, "stop"
                        break
                if end > cap:
                    end, reason = cap, "length"
                comps.append(Completion(token_ids=toks[:end], logprobs=vals[:end], finish_reason=reason))
            results.append(comps)
        return results


def processed_logprobs(
    net: Any,
    prompt_token_ids: list[list[int]],
    completion_token_ids: list[list[int]],
    params: SamplingParams,
) -> list[list[float]]:
    """log μ of given completions under ``net`` with the sampler's processing, one forward each.

    The same distribution the backends sample from: logits / temperature, then
    top-k, then top-p (transformers' warpers), then log-softmax; returns the
    value at each completion token. A cross-check of stored behaviour
    log-probs (fp32 recomputation on exactly the stored tokens).
    """
    import torch
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    device = next(net.parameters()).device
    out = []
    with torch.inference_mode():
        for prompt, comp in zip(prompt_token_ids, completion_token_ids):
            if not comp:
                out.append([])
                continue
            ids = torch.tensor([list(prompt) + list(comp)], device=device)
            logits = net(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
            if not params.greedy and params.temperature != 1.0:
                logits = logits / params.temperature
            if not params.greedy and params.top_k > 0:
                logits = TopKLogitsWarper(params.top_k)(None, logits)
            if not params.greedy and params.top_p < 1.0:
                logits = TopPLogitsWarper(params.top_p)(None, logits)
            lp = torch.log_softmax(logits, dim=-1)
            tgt = torch.tensor(comp, device=device)[:, None]
            out.append(lp.gather(1, tgt).squeeze(1).tolist())
    return out


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__
