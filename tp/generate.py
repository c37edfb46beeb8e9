"""Text from a trained GPT: autoregressive sampling, one token at a time (``gemmlab generate``)."""

from __future__ import annotations

import torch

from .transformer import GPT


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, tokens: int, *, temperature: float = 1.0,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """``prompt`` followed by ``tokens`` tokens drawn from ``model`` one at a time.

    Each step runs the model on the context, cropped to its last ``config.seq_len`` tokens
    (the positions the model has embeddings for; no KV cache), and takes the logits of the
    last position: with ``temperature`` 0 the most likely token (greedy: the generator is not
    used), else a draw from softmax(logits / ``temperature``) in float64 on the CPU with
    ``generator``, so a seeded generator gives the same tokens again.

    Args:
        model: a one-process model (TP = 1, not sequence-parallel), in eval mode.
        prompt: (T0,) int64 token ids in [0, vocab), T0 >= 1, on any device.
        tokens: how many to add, >= 0.
        temperature: >= 0.
        generator: a CPU generator for the draws (default: torch's global one).

    Returns:
        (T0 + ``tokens``,) int64 on the CPU.

    Raises:
        ValueError: a model with TP > 1 or sequence parallelism; an empty or out-of-range
            prompt; ``tokens`` or ``temperature`` < 0.
    """
    if model.comm.size != 1 or model.sequence_parallel:
        raise ValueError("generate runs a one-process model (TP = 1, no sequence parallelism)")
    vocab = model.config.vocab
    if prompt.dim() != 1 or len(prompt) == 0 or prompt.min() < 0 or prompt.max() >= vocab:
        raise ValueError(f"the prompt must be a non-empty 1-D tensor of ids in [0, {vocab}); "
                         f"got shape {tuple(prompt.shape)}")
    if tokens < 0 or temperature < 0:
        raise ValueError(f"tokens and temperature must be >= 0; got {tokens} and {temperature}")
    device = next(model.parameters()).device
    out = prompt.to("cpu", torch.int64)
    for _ in range(tokens):
        context = out[-model.config.seq_len:].to(device)
        logits = model(context[None])[0, -1].double().cpu()
        if temperature == 0:
            token = logits.argmax().reshape(1)
        else:
            token = torch.multinomial(torch.softmax(logits / temperature, -1), 1,
                                      generator=generator)
        out = torch.cat([out, token])
    return out
