"""Compare a straight run with a run resumed from one of its checkpoints, from the trainer's JSON lines.

    python benchmarks/scripts/resume_check.py STRAIGHT.jsonl RESUMED.jsonl LABEL

Prints one line: the steps both runs logged, BIT-EXACT or DIFFERS, whether every resumed loss and grad norm
is finite (a missing value is what the trainer logs for NaN), and the largest loss difference.
"""

import json
import math
import sys


def steps(path):
    out = {}
    with open(path) as lines:
        for line in lines:
            if line.startswith("{"):
                rec = json.loads(line)
                if rec.get("event") == "step":
                    out[rec["step"]] = (rec["loss"], rec["grad_norm"])
    return out


def finite(value):
    return value is not None and math.isfinite(value)


def main(straight_path, resumed_path, label):
    straight, resumed = steps(straight_path), steps(resumed_path)
    common = sorted(set(straight) & set(resumed))
    if not common:
        print(f"{label}: no common steps")
        return 1
    all_finite = all(finite(v) for s in common for v in resumed[s])
    exact = all(straight[s] == resumed[s] for s in common)
    diffs = [abs(straight[s][0] - resumed[s][0]) for s in common if finite(straight[s][0]) and finite(resumed[s][0])]
    worst = f"{max(diffs):.3g}" if diffs else "-"
    print(f"{label}: steps {common[0]}..{common[-1]} {'BIT-EXACT' if exact else 'DIFFERS'} "
          f"finite={all_finite} max|dloss|={worst}")
    return 0 if all_finite else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
