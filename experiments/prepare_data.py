"""Prepare token shards (the format: experiments/data/format.py; the sources: experiments/data/sources.py).

    python -m experiments.prepare_data stdlib [--tokenizer bytes|bpe] [--cache-dir D]   # the built-in default
    python -m experiments.prepare_data files <paths...> --out D [--tokenizer bytes|bpe]
    python -m experiments.prepare_data hf <name> --out D [--config C] [--split train] [--text-field text]
    python -m experiments.prepare_data info D [--verify]                                 # inspect / check

Only the standard library is imported until the arguments are parsed, so --help is instant; torch (via
experiments.data) is imported to run a command, Lightning never.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path


def _add_tokenizer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer",
        choices=("bytes", "bpe"),
        default="bytes",
        help="bytes: vocab 256, uint8 shards, no dependency (default); bpe: byte-level BPE trained "
        "locally with `tokenizers` (pip install 'attnres[bpe]')",
    )
    p.add_argument("--bpe-vocab-size", type=int, default=8192, help="BPE vocabulary size (default 8192)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.prepare_data",
        description="Turn a corpus into token shards (header.json + train.bin + val.bin) for training.",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("stdlib", help="the running interpreter's standard-library sources (no download; cached)")
    _add_tokenizer_args(p)
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where prepared datasets are cached (default: $ATTNRES_DATA_DIR or data/cache/ in the repo)",
    )
    p.add_argument("--max-bytes", type=int, default=None, help="keep only the first files up to this many bytes")
    p.add_argument("--force", action="store_true", help="rebuild even if a matching cached copy exists")
    p.add_argument("--verify", action="store_true", help="recompute checksums after preparing")

    p = sub.add_parser("files", help="text files or directories of them")
    p.add_argument("paths", nargs="+", type=Path, help="files, or directories searched recursively")
    p.add_argument("--out", type=Path, required=True, help="output shard directory")
    _add_tokenizer_args(p)
    p.add_argument("--val-fraction", type=float, default=0.01, help="share held out for validation (default 0.01)")
    p.add_argument(
        "--split",
        choices=("auto", "file", "tail"),
        default="auto",
        help="hold out whole files by path hash, or the tail of every file (auto: file when there are enough files)",
    )
    p.add_argument("--pattern", default="*", help="glob for files inside directories (default '*')")

    p = sub.add_parser("hf", help="a Hugging Face dataset (needs `datasets` and network access)")
    p.add_argument("name", help="dataset name on the Hub, e.g. roneneldan/TinyStories")
    p.add_argument("--out", type=Path, required=True, help="output shard directory")
    p.add_argument("--config", default=None, help="dataset configuration name")
    p.add_argument("--split", default="train", help="which split to read (default train); val is carved out of it")
    p.add_argument("--text-field", default="text", help="column holding the text (default 'text')")
    p.add_argument("--max-docs", type=int, default=None, help="read at most this many documents")
    p.add_argument("--val-fraction", type=float, default=0.01, help="share of documents held out (default 0.01)")
    _add_tokenizer_args(p)

    p = sub.add_parser("info", help="print a prepared directory's summary and check it")
    p.add_argument("path", type=Path)
    p.add_argument("--verify", action="store_true", help="recompute checksums and the largest token id")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from experiments import data  # heavy (torch): only after parsing

    # Data warnings (skipped files) as one plain line, not Python's source-line format.
    warnings.showwarning = lambda message, *_args, **_kw: print(f"warning: {message}", file=sys.stderr)

    progress = not args.no_progress
    start = time.perf_counter()
    try:
        if args.command == "stdlib":
            print(f"standard library: {data.stdlib_root()}", file=sys.stderr)
            path = data.prepare_stdlib(
                args.cache_dir, args.tokenizer, args.bpe_vocab_size, args.max_bytes, force=args.force, progress=progress
            )
        elif args.command == "files":
            path = data.prepare_text_files(
                args.paths,
                args.out,
                args.tokenizer,
                args.bpe_vocab_size,
                args.val_fraction,
                split=args.split,
                pattern=args.pattern,
                progress=progress,
            )
        elif args.command == "hf":
            path = data.prepare_hf_dataset(
                args.name,
                args.out,
                args.split,
                args.text_field,
                args.tokenizer,
                args.bpe_vocab_size,
                args.val_fraction,
                config=args.config,
                max_docs=args.max_docs,
                progress=progress,
            )
        else:
            path = args.path
        shards = data.TokenShards(path, verify=getattr(args, "verify", False))
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(data.describe(shards))
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
