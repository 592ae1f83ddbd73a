"""Gradient sinks: in-place fp32 gradient accumulation for sources that many depth-mixing reads use.

Autograd sums the gradient a source receives from every op that read it: each op's backward returns a fresh
[B, T, D] gradient and the engine adds it to the running sum, which holds one buffer per source from the first
read's backward on (Full AttnRes' final read sees every source). A *tracked* source has a sink instead: the
depth ops' backward adds their terms for it into the sink, and the sink hands the sum over once, when autograd
reaches the tracked tensor (after every op that used it: they consume the tracked tensor).

The plumbing, all in this module:
  * ``track_source(value)`` marks a source (the residual schemes call it when a source is written): the tensor
    it returns is made by a _TrackSource node, which holds the source's sink;
  * ``sinks_of(tensors)`` gives each tensor's sink (None: untracked); the depth ops' dispatch calls it and hands
    the list to their autograd Functions as an explicit argument;
  * a Function's backward adds a tracked source's terms with ``GradSink.add`` (deferred in groups) or has a
    kernel write into ``GradSink.target`` (mode 1: write, mode 2: add), and returns None for that source.

Sinks accumulate in fp32 (also for bf16 sources, whose sum is rounded once). A sink holds no reference back into
the graph, so nothing outlives the backward pass. Without autograd, and under torch.compile (which cannot trace
the in-place side effect), ``track_source`` is the identity. Pure torch.
"""

from __future__ import annotations

import torch


class GradSink:
    """Gradient accumulator of one tracked source: grad = sum over reads of weight * g, in fp32.

    Terms are applied in groups of up to DEFER: the sink [B, T, D] is then read and written once per group (the
    group's multiply-adds run back to back while it is in cache) instead of once per term. Deferred terms are the
    reads' own gradients (shared by every sink of a read). Deferring also delays the sink's allocation until its
    sum is due, so that a read that sees every source does not allocate every source's sink at once."""

    DEFER = 4

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None  # [B, T, D] fp32, the sum of the terms applied so far
        self.pending: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def add(self, g: torch.Tensor, weight: torch.Tensor | None = None, deferrable: bool = True) -> None:
        """Add weight * g (weight [B, T, 1] or None: 1). A deferred ``g`` must not be modified afterwards."""
        self.pending.append((g, weight))
        if not deferrable or len(self.pending) >= self.DEFER:
            self.flush()

    def can_defer(self, n_terms: int) -> bool:
        """Whether n more terms can be deferred without allocating the sink now."""
        return self.grad is None and len(self.pending) + n_terms < self.DEFER

    def flush(self) -> torch.Tensor | None:
        """Apply the deferred terms; returns the sum (None while no term has come)."""
        for g, weight in self.pending:
            if self.grad is None:  # a fresh contiguous fp32 tensor (a kernel may add into it; g may be shared)
                first = g if weight is None else torch.mul(g, weight)
                self.grad = first.to(torch.float32, memory_format=torch.contiguous_format, copy=first is g)
            elif weight is None:
                self.grad.add_(g)
            else:
                self.grad.addcmul_(g, weight)
        self.pending.clear()
        return self.grad

    def target(self, like: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Where a kernel puts its terms for this source, pending terms applied first: (tensor, mode), the sum to
        add into (mode 2), or when there is none yet a fresh fp32 tensor shaped like ``like`` to write (mode 1),
        which becomes the sum."""
        acc = self.flush()  # self.grad
        if acc is not None:
            return acc, 2
        self.grad = torch.empty(like.shape, dtype=torch.float32, device=like.device)
        return self.grad, 1

    def take(self) -> torch.Tensor | None:
        """The sum, handed over and forgotten (a retained graph starts from zero again)."""
        acc, self.grad = self.flush(), None
        return acc


class _TrackSource(torch.autograd.Function):
    """Identity whose backward adds the gradient the depth ops accumulated in the sink."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, sink: GradSink) -> torch.Tensor:
        ctx.sink = sink
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        acc = ctx.sink.take()
        if acc is None:
            return grad, None
        return acc.add_(grad.to(acc.dtype)).to(grad.dtype), None


def track_source(value: torch.Tensor) -> torch.Tensor:
    """Mark a tensor that several depth-mixing reads will use as a source: returns the tensor to read from (its
    autograd node, _TrackSource, holds the sink)."""
    if not (torch.is_grad_enabled() and value.requires_grad) or torch.compiler.is_compiling():
        return value
    return _TrackSource.apply(value, GradSink())


def sinks_of(tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> list[GradSink | None]:
    """The sink of each tensor: that of the _TrackSource node that made it, None for any other tensor."""
    # a _TrackSource node is its own ctx: forward set its .sink
    return [
        t.grad_fn.sink if type(t.grad_fn) is _TrackSource._backward_cls else None  # type: ignore[union-attr]
        for t in tensors
    ]
