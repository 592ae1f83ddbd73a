"""The rules behind conf/size/*.yaml, executable: how d_ff and the token budgets were chosen.

    python -m experiments.sizes          # prints every size: N, d_ff rule, tokens, FLOPs/token, C

Non-embedding parameters (Kaplan's N = ``Transformer.num_params(non_embedding=True)``: everything except the
token embedding and the LM head) of the *baseline* with SwiGLU MLPs, a = n_heads * head_dim:

    N = L_b * (4 a d + 3 d d_ff + 2 d) + d        q,k,v,o + gate/up/down + two RMSNorm gains per block + final norm

so for a target N (the paper's activated-parameter column for the paper sizes, a geometric ladder for the CPU
sizes) d_ff = (N - d - L_b (4 a d + 2 d)) / (3 d L_b), rounded to a multiple of ``multiple``. AttnRes adds
(4 L_b + 2) d parameters (a query and a key-norm gain per read), which is below 0.05% at every size here.
"""

from __future__ import annotations

import math


def baseline_non_embedding(n_layers: int, d_model: int, attn_dim: int, d_ff: int) -> int:
    d = d_model
    return n_layers * (4 * attn_dim * d + 3 * d * d_ff + 2 * d) + d


def solve_d_ff(n_layers: int, d_model: int, attn_dim: int, target: float, multiple: int = 16) -> int:
    """The d_ff (a multiple of `multiple`) whose baseline N is closest to `target`."""
    d = d_model
    exact = (target - d - n_layers * (4 * attn_dim * d + 2 * d)) / (3 * d * n_layers)
    lo = max(multiple, multiple * math.floor(exact / multiple))
    return min((lo, lo + multiple), key=lambda f: abs(baseline_non_embedding(n_layers, d, attn_dim, f) - target))


def steps_for(tokens: float, batch_size: int, seq_len: int) -> int:
    """Optimizer steps of a run: the token budget rounded to whole batches (at least one)."""
    return max(1, round(tokens / (batch_size * seq_len)))


def main() -> None:  # pragma: no cover - a printout
    from pathlib import Path

    from omegaconf import OmegaConf

    from attnres import ModelConfig, flops_per_token
    from attnres.flops import non_embedding_params

    conf = Path(__file__).resolve().parents[1] / "conf" / "size"
    print(f"{'size':12s} {'L_b':>3s} {'d':>5s} {'H':>3s} {'hd':>4s} {'d_ff':>5s} {'N_target':>12s} {'N_base':>12s} "
          f"{'err%':>6s} {'T':>5s} {'batch':>5s} {'steps':>6s} {'tokens':>14s} {'tok/N':>6s} {'MFLOP/tok':>10s} {'C (FLOPs)':>10s}")
    for path in sorted(conf.glob("*.yaml")):
        s = OmegaConf.load(path)
        cfg = ModelConfig(vocab_size=256, n_layers=s.n_layers, d_model=s.d_model, n_heads=s.n_heads,
                          head_dim=s.head_dim, d_ff=s.d_ff, max_seq_len=s.seq_len)
        n = non_embedding_params(cfg)  # built on the meta device: free even at paper size
        steps = steps_for(s.tokens, s.batch_size, s.seq_len)
        tokens = steps * s.batch_size * s.seq_len
        fpt = flops_per_token(cfg, s.seq_len).total
        print(f"{s.name:12s} {s.n_layers:3d} {s.d_model:5d} {s.n_heads:3d} {s.head_dim:4d} {s.d_ff:5d} "
              f"{s.target_params:12,d} {n:12,d} {100 * (n / s.target_params - 1):6.2f} {s.seq_len:5d} "
              f"{s.batch_size:5d} {steps:6d} {tokens:14,d} {tokens / n:6.1f} {fpt / 1e6:10.2f} {fpt * tokens:10.2e}")


if __name__ == "__main__":  # pragma: no cover
    main()
