"""Inductor's CPU vector-ISA check, run once per test process instead of once in every process that compiles.

Before its first C++ kernel, every process that compiles with Inductor on the CPU checks each vector ISA the CPU's
flags advertise (here: AVX2, AVX-512, AVX-512 VNNI, AMX): it compiles a probe into the Inductor directory (g++,
~1.5-2 CPU-s each in a cold directory) and loads it in a child Python (~0.3 CPU-s each, in every process). The
suite starts a dozen such processes (the drills' nodes, the H100 dry run's benches, the compile-cache test's) over
four cold Inductor directories.

TORCHINDUCTOR_VEC_ISA_OK=1 makes Inductor take that base check as passed; the checks specific to VNNI and AMX still
run. Where the base check passes for every advertised ISA, and only there, the variable changes nothing: the same
ISA is picked and the same kernels are built (tests/test_inductor_isa.py compares with a process that checks). So
a test process checks once, and sets the variable for itself and every process it starts only when it holds. A
variable the caller set is left alone.
"""

from __future__ import annotations

import os
import platform

VEC_ISA_OK_ENV = "TORCHINDUCTOR_VEC_ISA_OK"


def base_check_passes_for_every_advertised_isa() -> bool:
    """Inductor's own base check (the probe VecISA.__bool__ builds and loads), for each ISA of torch's list whose
    CPU flags this machine has: the ISAs Inductor asks about, and the only check TORCHINDUCTOR_VEC_ISA_OK skips.
    x86-64 only: elsewhere Inductor picks its ISA from the CPU's capabilities without this check."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    from torch._inductor import cpu_vec_isa

    flags = cpu_vec_isa.x86_isa_checker()
    asked = [isa for isa in cpu_vec_isa.supported_vec_isa_list if all(flag in flags for flag in str(isa).split())]
    return bool(asked) and all(isa.check_build(cpu_vec_isa.VecISA._avx_code) for isa in asked)


def settle_vec_isa_check() -> bool:
    """Check once; where the check passes for every advertised ISA, set TORCHINDUCTOR_VEC_ISA_OK=1 for this process
    (Inductor's config, read at import) and the processes it starts (the environment). Returns whether it is set."""
    if VEC_ISA_OK_ENV in os.environ:
        return os.environ[VEC_ISA_OK_ENV] == "1"
    if not base_check_passes_for_every_advertised_isa():
        return False
    from torch._inductor import config, cpu_vec_isa

    os.environ[VEC_ISA_OK_ENV] = "1"
    config.cpp.vec_isa_ok = True
    cpu_vec_isa.valid_vec_isa_list.cache_clear()  # a list checked before now is recomputed the way children do it
    return True


def isa_choice() -> dict[str, object]:
    """What Inductor chose in this process: the ISAs it takes as valid, and the one its kernels are built for."""
    from torch._inductor import cpu_vec_isa

    picked = cpu_vec_isa.pick_vec_isa()
    return {"valid": [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()], "picked": str(picked),
            "arch_flags": picked.build_arch_flags(), "amx_fp16": getattr(picked, "_is_amx_fp16_supported", None)}
