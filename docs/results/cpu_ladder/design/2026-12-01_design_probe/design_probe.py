"""The probe behind docs/results/cpu_ladder/design.md: one training run as the harness does it (attnres model,
experiments.training.optim AdamW groups and warmup-cosine, clip, TrainBatches), without Lightning, with the two things
the harness ties to one seed split apart (--init-seed, --data-seed), and the final model scored on three held-out sets:
the harness's 256 validation windows, every validation window, and 1,024 windows of the training split.

    python scripts/design_probe.py --B 4 --L 4 --dff 80 --tokens 480000 --lr 3e-3 \
        --init-seed 3 --data-seed 3 --out /tmp/probe.json

docs/results/cpu_ladder/design/probe_runs.csv holds every run the design note cites (made when this script was
docs/results/cpu_ladder/design/probe.py). Not part of the harness: the study itself runs through experiments.train.
Its loop is its own, not experiments.training.train_step.TrainStep: it records every step's pre-clipping gradient norm
and can keep an EMA of the weights, and it never stops on a diverged loss (a probe records it).
"""

import argparse
import json
import time

import numpy as np
import torch

from attnres import ModelConfig, Transformer, flops_per_token
from experiments.data import TrainBatches, load_dataset, val_windows
from experiments.training.optim import adamw, warmup_cosine

ap = argparse.ArgumentParser()
ap.add_argument("--L", type=int, default=5)
ap.add_argument("--d", type=int, default=32)
ap.add_argument("--hd", type=int, default=16)
ap.add_argument("--dff", type=int, default=88)
ap.add_argument("--T", type=int, default=128)
ap.add_argument("--B", type=int, default=32)
ap.add_argument("--tokens", type=float, default=624000)
ap.add_argument("--lr", type=float, default=1e-2)
ap.add_argument("--min-lr", type=float, default=0.1)
ap.add_argument("--warmup", type=float, default=0.05)
ap.add_argument("--wd", type=float, default=0.1)
ap.add_argument("--beta2", type=float, default=0.95)
ap.add_argument("--clip", type=float, default=1.0)
ap.add_argument("--residual", default="baseline")
ap.add_argument("--nblocks", type=int, default=4)
ap.add_argument("--init-seed", type=int, default=0)
ap.add_argument("--data-seed", type=int, default=0)
ap.add_argument("--ema", type=float, default=0.0)
ap.add_argument("--data", default="stdlib")
ap.add_argument("--sampler", default="iid")
ap.add_argument("--init-std", type=float, default=0.02)
ap.add_argument("--out", required=True)
a = ap.parse_args()
torch.set_num_threads(1)
shards = load_dataset(a.data, progress=False)
H = a.d // a.hd
cfg = ModelConfig(
    vocab_size=256,
    n_layers=a.L,
    d_model=a.d,
    n_heads=H,
    head_dim=a.hd,
    d_ff=a.dff,
    max_seq_len=a.T,
    residual=a.residual,
    n_blocks=a.nblocks,
    init_std=a.init_std,
)
torch.manual_seed(a.init_seed)
model = Transformer(cfg)
steps = max(1, round(a.tokens / (a.B * a.T)))
opt = adamw(model, lr=a.lr, betas=(0.9, a.beta2), weight_decay=a.wd)
sched = warmup_cosine(opt, steps, warmup_fraction=a.warmup, min_lr_ratio=a.min_lr)
tb = TrainBatches(shards, a.T, a.B, a.data_seed)
if a.sampler == "kronecker":
    n_starts = len(shards.train) - a.T
    u0 = np.random.default_rng([a.data_seed, 12345]).random()
    phi = (5**0.5 - 1) / 2

    def kb(step):
        k = step * a.B + np.arange(a.B)
        offs = (((u0 + k * phi) % 1.0) * n_starts).astype(np.int64)
        w = np.asarray(shards.train[offs[:, None] + np.arange(a.T + 1)])
        t = torch.from_numpy(w.astype(np.int64))
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    tb.batch = kb
ema = None
if a.ema > 0:
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
losses = []
t0 = time.time()
for s in range(steps):
    x, y = tb.batch(s)
    _, loss = model(x, y)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip) if a.clip > 0 else torch.tensor(0.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()
    losses.append((float(loss.detach()), float(gn)))
    if ema is not None:
        with torch.no_grad():
            for k, v in model.state_dict().items():
                ema[k].mul_(a.ema).add_(v, alpha=1 - a.ema)
train_s = time.time() - t0


def evaluate(windows, bs=64):
    tot, n = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(windows), bs):
            w = windows[i : i + bs]
            _, l = model(w[:, :-1], w[:, 1:])
            tot += float(l) * w[:, 1:].numel()
            n += w[:, 1:].numel()
    model.train()
    return tot / n


val_small = val_windows(shards, a.T, 256)
val_all = val_windows(shards, a.T, None)
# train-distribution holdout is not available; use fresh train windows from an unseen rng stream as "train-dist"
rng = np.random.default_rng([987654, 0])
offs = rng.integers(0, len(shards.train) - a.T - 1, size=1024)
tr_win = torch.from_numpy(np.asarray(shards.train[offs[:, None] + np.arange(a.T + 1)]).astype(np.int64))
t1 = time.time()
res = {"val256": evaluate(val_small), "val_all": evaluate(val_all), "train1024": evaluate(tr_win)}
eval_s = time.time() - t1
if ema is not None:
    model.load_state_dict(ema)
    res.update({"ema_val256": evaluate(val_small), "ema_val_all": evaluate(val_all)})
res.update(vars(a))
res.update(
    steps=steps,
    train_s=train_s,
    eval_s=eval_s,
    n_val_all=len(val_all),
    params=model.num_params(non_embedding=True),
    fpt=flops_per_token(cfg, a.T).total,
    losses=losses,
)
with open(a.out, "w") as f:
    json.dump(res, f)
print(
    a.out,
    {k: round(v, 4) for k, v in res.items() if k.startswith(("val", "train1", "ema"))},
    f"{train_s:.0f}s",
    flush=True,
)
