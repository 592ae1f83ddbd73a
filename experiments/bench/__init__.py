"""Speed and memory of the residual schemes, each as a ratio to the baseline measured in the same run.

    python -m experiments.bench                       # CPU, ~4 min: the 16 x 256 target size and cpu_xl
    python -m experiments.bench --quick               # <= 30 s smoke of every section (tests/test_bench.py)
    python -m experiments.bench --options             # also eager vs torch.compile / bf16 / checkpointing
    python -m experiments.bench --device cuda --sizes paper_194m --bf16 --sdpa flash   # scripts/gpu_suite.sh
    python -m experiments.bench ... --compile regional --decode-tokens 32             # scripts/gpu_suite.sh
    python -m experiments.bench --moe-pairs cpu_moe:cpu_xs --threads 1   # MoE vs dense at equal activated N

Per size, for each residual scheme (baseline, full, block by default):
  * training step time (forward + backward + AdamW step + zero_grad), tokens/s, achieved FLOP/s
    (attnres.flops_per_token x tokens / time) and MFU where the peak is known (--peak-flops, or a known GPU);
  * inference (prefill) time: one forward of the whole context under torch.inference_mode, logits only;
  * with --decode-tokens n: decode latency, the median time per token of n single-token forwards with a KV cache
    (batch 1) after a prefill of the rest of the context;
  * with --compile: the first training step of each model (compilation included) before the timed rounds;
  * memory: (a) bytes saved for backward, counted with torch.autograd.graph.saved_tensors_hooks as the unique
    storages that are not parameters - deterministic, and directly comparable with the (N+1)*B*T*d*bytes of
    Block AttnRes' block sums; (b) peak memory of a training step: on CPU the peak of the bytes of live tensors
    allocated in the step (the profiler's allocation events; deterministic) and the peak RSS of a fresh
    subprocess per scheme minus its RSS before the step (what the OS sees; moves with the C allocator), on CUDA
    torch.cuda.max_memory_allocated minus the memory allocated before the step.
Timing is interleaved: every round runs one step of every scheme (the order rotates by one each round), so
all schemes see the same machine; each scheme's ratio is computed per round against that round's baseline
step and summarised by the median and the interquartile range over rounds. On CPU every round also records
``other_cores_busy``: cores used by *other* processes during the round (from /proc/stat minus this process),
because on a shared 2-core machine a busy neighbour slows a 2-thread step several times over.

The harness section (experiments.bench.harness) times optimizer steps of ``experiments.train`` (Lightning)
against a plain PyTorch loop doing the same work on the same model and data, so Lightning's overhead is a
number. Results go to one JSON file (--out); the printout shows every ratio.

Modules: ``settings`` (the command line, read once into a frozen BenchSettings), ``cli`` (main: the sections in
order, the JSON), ``shapes`` (the sizes), ``runner`` (one timed variant, the interleaved rounds; its training step
is experiments.training.train_step.TrainStep, the trainer's), ``memory``, ``size_section``, ``option_section``,
``printout``, ``moe_section`` (an MoE size's step against a dense size's, and on CUDA the grouped GEMM against
the loop over experts), ``harness`` (Lightning vs a plain loop), ``sample_stats``, ``machine_load``,
``triton_aot`` (the Triton kernels compiled ahead of time: scripts/triton_aot_report.py). No torch at import:
``--help`` stays fast. The ladder bench (``--ladder``: eager vs compiled real ladder runs) answered one question and
is frozen with its result in docs/results/bench/2026-12-02_ladder/.
"""
