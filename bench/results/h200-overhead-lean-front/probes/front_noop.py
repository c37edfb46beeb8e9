"""gemm()'s own per-call code on a CPU: every binding's launch replaced by a no-op.

    python3 bench/results/h200-overhead-lean-front/probes/front_noop.py

from the root of a checkout (run once at fa5efc3 and once at e6c3755 on one machine). Binds
``gemm(a, b, c, activation="relu", backend="cublas")`` on 32x32 fp32 CPU tensors, swaps each
kept Plan's launch for a no-op, then prints the best of 9 ``timeit`` loops of 20000 calls
minus an empty lambda's, three times, in µs per call.
"""
import timeit

import torch

import backends
from backends import api

a, b, c = (torch.randn(32, 32) for _ in range(3))


def call():
    return backends.gemm(a, b, c, activation="relu", backend="cublas")


call()
for bindings in api._PLANS.values():
    for i, (check, plan) in enumerate(bindings):
        bindings[i] = (check, api.Plan(lambda a, b, c, out: None, plan.name, plan.spans))
for _ in range(3):
    t = min(timeit.repeat(call, number=20000, repeat=9)) / 20000 * 1e6
    t0 = min(timeit.repeat(lambda: None, number=20000, repeat=9)) / 20000 * 1e6
    print(f"front {t - t0:.3f} µs per call")
