"""`<training python> /opt/cluster/bundle/node_bootstrap/fp8_probe.py --backends torchao`: prove FP8 on this node.

Run by the DLAMI's PyTorch interpreter (the one jobs use, with the training lock's packages on its path), as a
script file so it needs nothing of the bundle on sys.path: the standard library, torch and the backends only.
It imports each FP8 backend the node provides the way the trainer does (torchao.float8,
transformer_engine.pytorch), then runs one FP8 matrix multiply on every GPU: torch._scaled_mm on float8_e4m3fn
operands (the kernel torchao's float8 linear calls; it needs FP8 tensor cores, compute capability >= 8.9),
checked against the same product in float32. It prints one JSON object:
{"ok", "error", "torch", "backends": {name: version}, "devices": [{"index", "name", "ok", "error"}]}
and exits 0 when every device passed. `--device cpu` runs the same multiply on the CPU (tests), `--device none`
only imports (GPUs without FP8 tensor cores).
"""

import argparse
import importlib
import json
import sys

BACKEND_MODULES = {"torchao": "torchao.float8", "te": "transformer_engine.pytorch"}
SIZE = 64  # _scaled_mm wants dimensions divisible by 16; small enough to take milliseconds
RELATIVE_TOLERANCE = 0.02  # bf16 output rounding (2^-8) with margin, relative to the largest product


def probe(backends, device_kind="cuda"):
    report = {"ok": False, "error": None, "torch": None, "backends": {}, "devices": []}
    try:
        import torch
    except Exception as e:  # a broken AMI environment: say so, do not crash without a report
        report["error"] = f"torch does not import: {type(e).__name__}: {e}"
        return report
    report["torch"] = torch.__version__
    for backend in backends:
        module = BACKEND_MODULES[backend]
        try:
            importlib.import_module(module)
            top = importlib.import_module(module.split(".")[0])
        except Exception as e:
            report["error"] = f"{module} (fp8.backend={backend}) does not import: {type(e).__name__}: {e}"
            return report
        report["backends"][backend] = str(getattr(top, "__version__", "unknown"))
    if device_kind == "none":  # a GPU without FP8 tensor cores: the imports are the check
        report["ok"] = True
        return report
    if device_kind == "cpu":
        devices = [("cpu", "cpu", torch.device("cpu"))]
    else:
        if not torch.cuda.is_available():
            report["error"] = f"torch.cuda.is_available() is False: torch {torch.__version__} cannot use the GPUs"
            return report
        devices = [(i, torch.cuda.get_device_name(i), torch.device("cuda", i))
                   for i in range(torch.cuda.device_count())]
    for index, name, device in devices:
        report["devices"].append(dict({"index": index, "name": name}, **fp8_matmul(torch, device)))
    report["ok"] = bool(report["devices"]) and all(d["ok"] for d in report["devices"])
    return report


def fp8_matmul(torch, device):
    """{"ok", "error"} for one e4m3 x e4m3 -> bf16 matrix multiply on `device`."""
    try:
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(SIZE, SIZE, generator=generator).to(device=device, dtype=torch.float8_e4m3fn)
        b = torch.randn(SIZE, SIZE, generator=generator).to(device=device, dtype=torch.float8_e4m3fn)
        one = torch.ones((), device=device)  # per-tensor scales, float32
        # The second operand must be column-major: the transpose of a row-major matrix is.
        out = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        expected = a.float() @ b.float().t()
        error = (out.float() - expected).abs().max().item()
        bound = RELATIVE_TOLERANCE * expected.abs().max().item()
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
    if not error <= bound:  # also catches NaN
        return {"ok": False, "error": f"wrong result: max error {error:.4g} > {bound:.4g}"}
    return {"ok": True, "error": None}


def main(argv=None):
    parser = argparse.ArgumentParser(description="One FP8 matrix multiply on every GPU, backends imported.")
    parser.add_argument("--backends", default="", help="comma-separated fp8.backend values to import")
    parser.add_argument("--device", choices=("cuda", "cpu", "none"), default="cuda",
                        help="where to run the multiply: every GPU, the CPU (tests), or nowhere (imports only)")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b and b != "none"]
    unknown = [b for b in backends if b not in BACKEND_MODULES]
    if unknown:
        parser.error(f"--backends {','.join(unknown)}: allowed: {', '.join(BACKEND_MODULES)}")
    report = probe(backends, args.device)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
