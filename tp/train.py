"""Training a small GPT with DP x TP, the loop behind ``gemmlab train``.

Data: the text of CPython's ``pydoc_data/topics.py`` (shipped with every Python, so it is
available offline), as bytes. Every step draws one global batch of random windows from a
generator seeded with ``seed``, identical on every rank; each DP rank trains on its
``tp.grid.split_data`` shard of it, and after backward the gradients are averaged over the DP
group (one all-reduce of all gradients, flattened). With equal shards this is the gradient of
the global batch, so any DP x TP layout follows the single-process loss curve; so does
sequence parallelism (``GPT(sequence_parallel=True)``), whose TP ranks each hold a part of
the loss that sums to the mean.

With ``cuda_graph`` the whole step (forward, backward, DP gradient average, optimizer step
and the loss's all-reduces) is captured into one CUDA graph and replayed, after PyTorch's
"whole-network capture" (torch.cuda.graphs documentation): eager warm-up steps on a side
stream, gradients set to None before the capture so that its backward allocates them in the
graph's memory, Adam with ``capturable=True``, static inputs that every step copies its batch
into, and a static loss read after the replay.

With ``checkpoint`` the run is saved every ``checkpoint_every`` steps and after its last step,
and ``resume`` continues a saved run from where it stopped, computing exactly the losses the
uninterrupted run would have (``tp.checkpoint``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from profiling.nvtx import annotate

from . import checkpoint as checkpoints
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


GRAPH_WARMUP_STEPS = 3
"""Eager steps before the capture with ``cuda_graph`` (PyTorch's whole-network example runs
three): lazy set-up (Adam's state, library workspaces, communicator buffers) happens outside
the graph."""


@dataclass
class TrainResult:
    """Per-step global loss (mean over the global batch) from step 0, and wall time (ms) of
    the steps this run made, from ``first_step`` (a resumed run: the checkpoint's step; the
    losses before it are the checkpoint's record of them)."""

    loss: list[float]
    step_ms: list[float]
    first_step: int = 0


def train(config: GPTConfig, tp_comm, dp_comm, *, steps: int, batch: int, lr: float,
          seed: int, device: torch.device, dtype=None, backend: str = "cublas",
          overlap: bool = True, sequence_parallel: bool = False, cuda_graph: bool = False,
          log=None, checkpoint: str | Path | None = None, checkpoint_every: int = 0,
          resume: str | Path | None = None) -> TrainResult:
    """Train up to step ``steps`` with Adam; collective over both communicators. ``batch``
    sequences of ``config.seq_len`` bytes per step, ``batch / DP`` of them on each DP rank.
    ``log(step, loss, ms)`` is called after each step.

    ``checkpoint``: a directory to save the run in (``tp.checkpoint``) after every
    ``checkpoint_every``-th step (0: none) and after the last. ``resume``: a checkpoint (or a
    directory of them: the latest) of a run with the same settings (``run_settings``) to
    continue from its step to ``steps``; steps keep their numbers.

    ``sequence_parallel``: the model runs sequence-parallel (``GPT``), each TP rank on its
    block of its DP rank's B * T tokens (B = ``batch`` / DP, T = ``config.seq_len``).

    ``cuda_graph``: the first ``GRAPH_WARMUP_STEPS`` steps run eagerly (on a side stream) and
    are part of the loss curve; then the step is captured (module doc) and every later step
    is a replay. Those steps' times are drawing the batch, copying it into the graph's inputs,
    the replay and reading the loss. Adam then has ``capturable=True`` (its step count and
    bias corrections on the device, where a replay updates them).

    Raises:
        ValueError: ``batch`` not a multiple of the DP size (unequal shards would change the
            gradient relative to the single-process run); with ``sequence_parallel``, B * T
            not a multiple of the TP size; with ``cuda_graph``, a device other than CUDA, a
            communicator whose collectives are not stream-ordered (a graph cannot capture
            host steps), or ``steps`` <= ``GRAPH_WARMUP_STEPS``; ``cuda_graph`` with
            ``checkpoint`` or ``resume`` (capturable Adam's state lives in the graph: not
            supported); a negative ``checkpoint_every``, or one without ``checkpoint``;
            ``resume`` from another run's settings (``tp.checkpoint.mismatches``) or from
            a step >= ``steps``.
        FileNotFoundError: ``resume`` holds no checkpoint.
        RuntimeError: with ``cuda_graph``, the capture failed (CUDA's error says why).
    """
    if batch % dp_comm.size:
        raise ValueError(f"global batch {batch} is not a multiple of the DP size {dp_comm.size}")
    tokens = batch // dp_comm.size * config.seq_len
    if sequence_parallel and tokens % tp_comm.size:
        raise ValueError(f"sequence parallelism needs the {tokens} tokens of each DP rank's "
                         f"batch to be a multiple of the TP size {tp_comm.size}")
    if cuda_graph:
        _check_graph(tp_comm, dp_comm, device, steps)
        if checkpoint is not None or resume is not None:
            raise ValueError("CUDA-graph training cannot save or resume checkpoints")
    if checkpoint_every < 0 or (checkpoint_every and checkpoint is None):
        raise ValueError(f"checkpoint_every must be >= 0 and needs a checkpoint directory; "
                         f"got {checkpoint_every} with {checkpoint}")
    model = GPT(config, tp_comm, seed=seed, backend=backend, overlap=overlap, device=device,
                dtype=dtype, sequence_parallel=sequence_parallel)
    # Capturable only for the graph: eager runs keep Adam's default arithmetic (bias
    # corrections in Python floats, not float32 tensors), so graph and eager loss curves
    # differ by that rounding alone, and runs without a graph are unchanged.
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, capturable=cuda_graph)
    data = corpus()
    generator = torch.Generator().manual_seed(seed)
    settings = checkpoints.run_settings(
        config, tp=tp_comm.size, dp=dp_comm.size, sequence_parallel=sequence_parallel,
        seed=seed, batch=batch, lr=lr, dtype=dtype or torch.get_default_dtype(),
        device_type=torch.device(device).type, backend=backend)
    result = TrainResult([], [])
    if resume is not None:
        result.first_step, result.loss = checkpoints.restore(
            resume, model=model, optimizer=optimizer, generator=generator, settings=settings,
            tp_comm=tp_comm, dp_comm=dp_comm)
        if result.first_step >= steps:
            raise ValueError(f"the checkpoint is at step {result.first_step}: nothing to do "
                             f"up to step {steps}")

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One step on this rank's batch; the global mean loss, (1,) float32 on ``device``."""
        with annotate("forward"):
            loss = model.loss(x, y)
        with annotate("backward"):
            loss.backward()
        if dp_comm.size > 1:
            with annotate("DP gradient average"):
                average_gradients(model, dp_comm)
        with annotate("optimizer step"):
            optimizer.step()
        loss = loss.detach().reshape(1).clone()
        if sequence_parallel:  # each TP rank holds its tokens' part of the mean
            tp_comm.all_reduce(loss)
        return dp_comm.all_reduce(loss) / dp_comm.size

    def eager_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=False)
        return step(x, y)

    def run(first: int, last: int, step_fn) -> None:
        for i in range(first, last):
            start = time.perf_counter()
            with annotate("train step", payload=i):
                x, y = global_batch(data, batch, config.seq_len, generator)
                x = split_data(x, dp_comm.rank, dp_comm.size).to(device)
                y = split_data(y, dp_comm.rank, dp_comm.size).to(device)
                result.loss.append(step_fn(x, y).item())  # .item() waits for the step
            result.step_ms.append((time.perf_counter() - start) * 1e3)
            if log is not None:
                log(i, result.loss[-1], result.step_ms[-1])
            done = i + 1
            if checkpoint is not None and (done == steps or checkpoint_every
                                           and done % checkpoint_every == 0):
                checkpoints.save(checkpoint, done, model=model, optimizer=optimizer,
                                 generator=generator, loss=result.loss, settings=settings,
                                 tp_comm=tp_comm, dp_comm=dp_comm)

    if not cuda_graph:
        run(result.first_step, steps, eager_step)
        return result
    warmup = torch.cuda.Stream(device)
    warmup.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(warmup):
        run(0, GRAPH_WARMUP_STEPS, eager_step)
    torch.cuda.current_stream(device).wait_stream(warmup)
    run(GRAPH_WARMUP_STEPS, steps,
        _captured(step, optimizer, (batch // dp_comm.size, config.seq_len), device))
    return result


def _check_graph(tp_comm, dp_comm, device: torch.device, steps: int) -> None:
    """``train``'s ``cuda_graph`` checks (its Raises), before anything is built."""
    if torch.device(device).type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device; got {device}")
    for comm in (tp_comm, dp_comm):
        if not comm.stream_ordered:
            raise ValueError(f"a CUDA graph captures the collectives, so the communicators "
                             f"must be stream-ordered; {comm.name} steps through the host")
    if steps <= GRAPH_WARMUP_STEPS:
        raise ValueError(f"with a CUDA graph, steps must be > {GRAPH_WARMUP_STEPS} (the eager "
                         f"warm-up steps before the capture); got {steps}")


def _captured(step, optimizer: torch.optim.Optimizer, shape: tuple[int, int],
              device: torch.device):
    """``step`` captured into one CUDA graph on static (``shape``) int64 inputs, returned as
    ``replay(x, y)``: copy the batch into those inputs, replay, and return the static loss
    (rewritten by every replay).

    Raises:
        RuntimeError: the capture failed (CUDA's error says why).
    """
    static_x = torch.zeros(shape, dtype=torch.int64, device=device)
    static_y = torch.zeros_like(static_x)
    # The captured backward then allocates the gradients in the graph's memory, so every
    # replay writes them afresh instead of adding to the previous step's.
    optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            static_loss = step(static_x, static_y)
    except RuntimeError as exc:
        raise RuntimeError(f"capturing the training step into a CUDA graph failed: {exc}") \
            from exc

    def replay(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        return static_loss

    return replay


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
