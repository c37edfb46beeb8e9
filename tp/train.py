"""Training a small GPT with DP x TP, the loop behind ``gemmlab train``.

Data: the text of CPython's ``pydoc_data/topics.py`` (shipped with every Python, so it is
available offline), as bytes. Every step draws one global batch of random windows from a
generator seeded with ``seed``, identical on every rank; each DP rank trains on its
``tp.grid.split_data`` shard of it, and after backward the gradients are averaged over the DP
group (one all-reduce of all gradients, flattened). With equal shards this is the gradient of
the global batch, so any DP x TP layout follows the single-process loss curve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from profiling.nvtx import annotate

from .grid import split_data
from .transformer import GPT, GPTConfig


def corpus() -> torch.Tensor:
    """The training text as a uint8 tensor of UTF-8 bytes (about 0.5 MB)."""
    from pydoc_data import topics

    text = "\n\n".join(topics.topics[key] for key in sorted(topics.topics))
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)


def global_batch(data: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator):
    """``batch`` random windows: inputs (batch, seq_len) and next-byte targets, int64."""
    starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=generator)
    idx = starts[:, None] + torch.arange(seq_len + 1)
    windows = data[idx].long()
    return windows[:, :-1], windows[:, 1:]


@dataclass
class TrainResult:
    """Per-step global loss (mean over the global batch) and wall time (ms)."""

    loss: list[float]
    step_ms: list[float]


def train(config: GPTConfig, tp_comm, dp_comm, *, steps: int, batch: int, lr: float,
          seed: int, device: torch.device, dtype=None, backend: str = "cublas",
          overlap: bool = True, log=None) -> TrainResult:
    """Train ``steps`` Adam steps; collective over both communicators.

    Raises:
        ValueError: ``batch`` not a multiple of the DP size (unequal shards would change the
            gradient relative to the single-process run).
    """
    if batch % dp_comm.size:
        raise ValueError(f"global batch {batch} is not a multiple of the DP size {dp_comm.size}")
    model = GPT(config, tp_comm, seed=seed, backend=backend, overlap=overlap, device=device,
                dtype=dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    data = corpus()
    generator = torch.Generator().manual_seed(seed)
    result = TrainResult([], [])
    for step in range(steps):
        start = time.perf_counter()
        with annotate("train step", payload=step):
            x, y = global_batch(data, batch, config.seq_len, generator)
            x = split_data(x, dp_comm.rank, dp_comm.size).to(device)
            y = split_data(y, dp_comm.rank, dp_comm.size).to(device)
            with annotate("forward"):
                loss = model.loss(x, y)
            optimizer.zero_grad(set_to_none=False)
            with annotate("backward"):
                loss.backward()
            if dp_comm.size > 1:
                with annotate("DP gradient average"):
                    average_gradients(model, dp_comm)
            with annotate("optimizer step"):
                optimizer.step()
            total = dp_comm.all_reduce(loss.detach().reshape(1).clone()) / dp_comm.size
            result.loss.append(total.item())  # .item() waits for the step to finish
        result.step_ms.append((time.perf_counter() - start) * 1e3)
        if log is not None:
            log(step, result.loss[-1], result.step_ms[-1])
    return result


def average_gradients(model: torch.nn.Module, dp_comm) -> None:
    """Replace every gradient by its mean over the DP group: one all-reduce of one flat
    buffer (as DistributedDataParallel buckets do), then copy back."""
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dp_comm.all_reduce(flat)
    flat /= dp_comm.size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
