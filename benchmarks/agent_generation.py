"""Batched generation speed of a Qwen2.5-VL model as the agent calls it (planner prompt + one screenshot).

Without --model it builds the tiny random test model (coda_agent.tiny), so the figure measures the agent's
generation path (chat template, image processing, batched `generate` with log-probs), not a real model's
quality. On a GPU (`--device cuda`) the same script times a real checkpoint: --model /path/to/Qwen2.5-VL-7B.
Usage: python benchmarks/agent_generation.py [--model DIR] [--batch 1 4 8] [--new-tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from coda_agent.models import SamplingParams, TransformersVLM
from coda_agent.planner import Planner
from coda_agent.tiny import build_tiny_qwen2_5_vl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint directory (default: build the tiny test model)")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda when there is one)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    path = a.model or build_tiny_qwen2_5_vl(tempfile.mkdtemp(prefix="coda-tiny-") + "/m")
    vlm = TransformersVLM(path, device=a.device)
    planner = Planner(vlm, "kalgebra")
    shot = np.random.default_rng(0).integers(0, 255, (800, 1280, 3), dtype=np.uint8)
    conv = planner.conversation("Store 3^4 in a variable named a.", [], shot)
    params = SamplingParams(max_new_tokens=a.new_tokens, temperature=1.0, logprobs=True)
    vlm.generate([conv], params)  # warm-up
    print(f"model={vlm.name} device={vlm.device} screen=1280x800 new_tokens<={a.new_tokens}")
    print(f"{'batch':>5} {'s/batch p50':>12} {'new tok/s':>10} {'prompt tok':>10}")
    for b in a.batch:
        secs, toks = [], []
        for r in range(a.repeats):
            t0 = time.perf_counter()
            gens = vlm.generate(
                [conv] * b, SamplingParams(max_new_tokens=a.new_tokens, temperature=1.0, logprobs=True, seed=r)
            )
            secs.append(time.perf_counter() - t0)
            toks.append(sum(len(g.token_ids) for g in gens))
        p50 = statistics.median(secs)
        print(f"{b:>5} {p50:>12.3f} {sum(toks) / sum(secs):>10.1f} {gens[0].prompt_tokens:>10}")


if __name__ == "__main__":
    main()
