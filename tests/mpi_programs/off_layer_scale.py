"""``gemmlab scale`` whose TP transformer layer is 1% off: at P > 1 the TP group's layer has
its fc1 weight scaled by 1.01 (the references, built on one rank, are left alone), so its
check fails and the row is FAIL; the MLP block and every P = 1 point are untouched. Run as
``mpiexec -n P python off_layer_scale.py scale <mode> <flags>`` (``tests/test_study.py``
launches it through a wrapper in place of ``python -m bench.cli``)."""

import sys

import torch

from bench import cli, scale

build = scale.build


def off(prob, comm, **kwargs):
    module = build(prob, comm, **kwargs)
    if prob.workload == "layer" and comm.size > 1:
        with torch.no_grad():
            module.fc1.weight.mul_(1.01)
    return module


scale.build = off
sys.exit(cli.main(sys.argv[1:]))
