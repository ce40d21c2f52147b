"""Compare `memra run --json` tokens (e.g. from the GPU) with the CPU reference's greedy
tokens under each numerics (f32: exact math; q8: the GPU q8 path's roundings; llamacpp).

    python3 experiments/compare_run_reference.py RUN_OUTPUT_FILE [MODEL] > result.json

RUN_OUTPUT_FILE holds the JSON line memra run --json printed. For each numerics: the first
position where the tokens differ and the reference's top-2 logit margin there (< 0.05 is a
near-tie), or that all tokens are equal.
"""
import json
import sys

from memra.model.aliases import resolve
from memra.model.gguf import open_gguf
from memra.cpu.reference import ReferenceModel, greedy_with_margins


def main():
    lines = open(sys.argv[1]).read().splitlines()
    run = json.loads(next(line for line in lines if line.startswith("{")))
    model = sys.argv[2] if len(sys.argv) > 2 else run["model"]
    g = open_gguf(resolve(model))
    ids, got = run["prompt_ids"], run["tokens"]
    out = {"model": model, "prompt_ids": ids, "gpu_tokens": got, "device": run.get("device")}
    for num in ("f32", "q8", "llamacpp"):
        _, toks, margins = greedy_with_margins(ReferenceModel(g, numerics=num), ids, len(got))
        i = next((i for i, (a, b) in enumerate(zip(got, toks)) if a != b), None)
        out[num] = {"tokens": toks, "first_divergence": i, "margin_there": None if i is None else margins[i],
                    "near_tie": None if i is None else margins[i] < 0.05}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
