"""Run ``topr ARGS...`` and SIGKILL this process right after its training checkpoint of step N.

Used by tests (directly, or as the script torchrun launches on every rank): a
real kill of a real process at a chosen point, with no hook in the product.
``KILL_AFTER_CHECKPOINT=N python tests/kill_after_checkpoint.py train ...``
"""

import os
import signal
import sys

import toprcli.training.checkpoint as ckpt

STEP = int(os.environ["KILL_AFTER_CHECKPOINT"])
_save = ckpt.save_checkpoint


def _save_then_die(root, step, *args, **kwargs):
    out = _save(root, step, *args, **kwargs)
    if step >= STEP:
        os.kill(os.getpid(), signal.SIGKILL)
    return out


ckpt.save_checkpoint = _save_then_die

if __name__ == "__main__":
    from toprcli.cli.main import main

    sys.argv = ["topr", *sys.argv[1:]]
    main()
