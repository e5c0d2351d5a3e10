"""Peak host memory of writing a gathered policy on rank 0 (``checkpoint.save_gathered``), against loading a second
float32 copy of the model to write it from (what rank 0 did before). Each way runs in a fresh process: the state dict
as FSDP gathers it (every name, float32, on the CPU), then the save; reported: the peak RSS the save adds.

Usage:
  python benchmarks/save_policy_memory.py --model ~/.cache/toprcli/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile

CHILD = r"""
import gc, json, resource, sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
from toprcli.training.checkpoint import save_gathered
src, way, out = sys.argv[1:4]
m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
full = dict(m.state_dict())  # the one copy: the model's own tensors
del m
gc.collect()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if way == "gathered":
    save_gathered(Path(out), full, src, torch.float32)
else:  # a fresh float32 copy loaded, the gathered weights loaded into it, saved
    fresh = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    fresh.load_state_dict(full, strict=False)
    fresh.save_pretrained(out)
print(json.dumps({"way": way, "peak_before_mib": round(before / 1024), "added_peak_mib": round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face model dir")
    args = ap.parse_args()
    for way in ("fresh copy", "gathered"):
        with tempfile.TemporaryDirectory() as out:
            done = subprocess.run([sys.executable, "-c", CHILD, args.model, way, out], capture_output=True, text=True, check=True)
            print(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
