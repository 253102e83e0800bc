"""`python3 -m node_bootstrap.cuda_probe`: create a CUDA context on every GPU, the way every job will.

nvidia-smi talks to the driver through NVML and can report 8 healthy GPUs on a node where every CUDA program
fails: on NVSwitch systems without NVIDIA Fabric Manager, CUDA initialisation fails with error 802,
CUDA_ERROR_SYSTEM_NOT_READY (CUDA Driver API reference, CUresult; NVIDIA Fabric Manager User Guide). So the
gate makes a context on each device through the driver API itself: libcuda.so.1 loaded with ctypes (stdlib),
cuInit, cuDeviceGetCount, and per device cuDevicePrimaryCtxRetain then cuDevicePrimaryCtxRelease_v2. It runs
as a child process so that a driver call that never returns is the runner's to time out and kill, not the
bootstrap's. It prints one JSON object: {"ok": bool, "error": str|null, "count": int, "devices": [{"index",
"ok", "error"}]}, and exits 0 when every device made a context.
"""

from __future__ import annotations

import ctypes
import json
import sys

CUDA_SUCCESS = 0


def probe(lib) -> dict:
    """Initialise CUDA and make (then release) the primary context on every device of `lib` (libcuda)."""

    def error(call: str, code: int) -> str:
        name = ctypes.c_char_p()
        known = lib.cuGetErrorName(code, ctypes.byref(name)) == CUDA_SUCCESS and name.value
        return f"{call}: {name.value.decode() if known else 'CUDA error'} ({code})"

    code = lib.cuInit(0)
    if code != CUDA_SUCCESS:
        return {"ok": False, "error": error("cuInit", code), "count": 0, "devices": []}
    count = ctypes.c_int(0)
    code = lib.cuDeviceGetCount(ctypes.byref(count))
    if code != CUDA_SUCCESS:
        return {"ok": False, "error": error("cuDeviceGetCount", code), "count": 0, "devices": []}
    release = getattr(lib, "cuDevicePrimaryCtxRelease_v2", None) or lib.cuDevicePrimaryCtxRelease
    devices = []
    for index in range(count.value):
        device = ctypes.c_int(0)
        code = lib.cuDeviceGet(ctypes.byref(device), index)
        if code != CUDA_SUCCESS:
            devices.append({"index": index, "ok": False, "error": error("cuDeviceGet", code)})
            continue
        context = ctypes.c_void_p()
        code = lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
        if code != CUDA_SUCCESS:
            devices.append({"index": index, "ok": False, "error": error("cuDevicePrimaryCtxRetain", code)})
            continue
        release(device)
        devices.append({"index": index, "ok": True, "error": None})
    ok = all(d["ok"] for d in devices)
    return {"ok": ok, "error": None, "count": count.value, "devices": devices}


def main() -> int:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        result = {"ok": False, "error": f"cannot load libcuda.so.1 (is the NVIDIA driver installed?): {e}",
                  "count": 0, "devices": []}
    else:
        result = probe(lib)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
