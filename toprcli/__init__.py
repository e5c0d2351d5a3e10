"""toprcli: offline, iterative RL of language models from verifiable rewards with TOPR.

TOPR is Tapered Off-Policy REINFORCE (Le Roux et al., 2025, arXiv 2503.14286).
"""

from __future__ import annotations

import os

# OpenMP spin-waiting makes torch 10-20x slower whenever another process (a
# verifier pool, a vLLM engine) holds a core on small machines. Passive waiting
# costs nothing measurable when the cores are free. Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
