"""Compare a straight run with a run resumed from one of its checkpoints, from the trainer's JSON lines.

    python benchmarks/scripts/resume_check.py STRAIGHT.jsonl RESUMED.jsonl LABEL [--json PATH]

Prints one line: the steps both runs logged, BIT-EXACT or DIFFERS, whether every resumed loss and grad norm
is finite (a missing value is what the trainer logs for NaN), and the largest loss difference. --json also
writes those as an object, with the first resumed step and whether its loss and grad norm equal the straight
run's (on a GPU only that step's loss is expected to be identical: docs/benchmarks.md).
"""

import argparse
import json
import math
import sys


def steps(path):
    out = {}
    with open(path) as lines:
        for line in lines:
            if line.startswith("{"):
                rec = json.loads(line)
                if rec.get("event") == "step" and "loss" in rec:
                    out[rec["step"]] = (rec["loss"], rec["grad_norm"])
    return out


def finite(value):
    return value is not None and math.isfinite(value)


def compare(straight_path, resumed_path):
    """The comparison as a dict; ``common_steps`` is empty when the runs share no logged step."""
    straight, resumed = steps(straight_path), steps(resumed_path)
    common = sorted(set(straight) & set(resumed))
    diffs = [abs(straight[s][0] - resumed[s][0]) for s in common if finite(straight[s][0]) and finite(resumed[s][0])]
    return {
        "common_steps": common,
        "bit_exact": bool(common) and all(straight[s] == resumed[s] for s in common),
        "finite": bool(common) and all(finite(v) for s in common for v in resumed[s]),
        "max_abs_dloss": max(diffs) if diffs else None,
        "first_step": common[0] if common else None,
        # the first resumed step's loss depends only on the loaded weights and the batch; its grad norm also on
        # the backward kernels, which on a GPU may accumulate in another order (atomics)
        "first_step_loss_equal": bool(common) and straight[common[0]][0] == resumed[common[0]][0],
        "first_step_grad_norm_equal": bool(common) and straight[common[0]][1] == resumed[common[0]][1],
        "first_step_loss": [straight[common[0]][0], resumed[common[0]][0]] if common else None,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description="A straight run against one resumed from its checkpoint.")
    parser.add_argument("straight")
    parser.add_argument("resumed")
    parser.add_argument("label")
    parser.add_argument("--json", metavar="PATH", help="also write the comparison as JSON to PATH")
    args = parser.parse_args(argv)
    result = compare(args.straight, args.resumed)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"label": args.label, **result}, out, indent=2)
    common = result["common_steps"]
    if not common:
        print(f"{args.label}: no common steps")
        return 1
    worst = f"{result['max_abs_dloss']:.3g}" if result["max_abs_dloss"] is not None else "-"
    print(f"{args.label}: steps {common[0]}..{common[-1]} {'BIT-EXACT' if result['bit_exact'] else 'DIFFERS'} "
          f"finite={result['finite']} max|dloss|={worst}")
    return 0 if result["finite"] else 1


if __name__ == "__main__":
    sys.exit(main())
