"""Word count over a generated corpus, with exactly-once checkpoints every 0.5 s.

    python examples/wordcount.py                       # 4,000,000 words, parallelism 2
    python examples/wordcount.py --kill-task count[1] --after 1s
    python examples/wordcount.py --kill-task count[0] --after chk3
    python examples/wordcount.py --chaos 3             # 3 random kills, compared with a clean run
    python examples/wordcount.py --output counts.json  # also write the records, sorted

The corpus is created by the example itself (deterministic, Zipf-like word
frequencies) under --data (default ./data/wordcount). The counts are checked
against collections.Counter over the same files.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import scaffold
from runtime import Dataflow
from runtime.sources import TextFileSource

SYLLABLES = ["ka", "lo", "mi", "ra", "te", "su", "no", "vi", "de", "po", "ul", "an", "es", "or"]


def make_corpus(directory: str, words: int, files: int = 4, seed: int = 42) -> list[str]:
    """Write ``words`` words (deterministic) into ``files`` text files; reuse them if present.
    The paths are absolute: on a cluster the tasks do not run in this directory."""
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"corpus-{words}-{i}.txt") for i in range(files)]
    if all(os.path.exists(p) for p in paths):
        return paths
    rng = random.Random(seed)
    vocab = sorted(
        {"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(20000)}
    )
    rng.shuffle(vocab)
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]  # Zipf: a few words dominate
    per_file = words // files
    for i, path in enumerate(paths):
        n = per_file if i < files - 1 else words - per_file * (files - 1)
        chosen = rng.choices(vocab, weights, k=n)
        lines = [" ".join(chosen[j : j + 12]) for j in range(0, n, 12)]
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        os.replace(tmp, path)
    return paths


def build(paths: list[str], parallelism: int, **config: object) -> Dataflow:
    flow = Dataflow("wordcount", parallelism=parallelism, **config)
    (
        flow.source(TextFileSource(paths), name="lines")
        .flat_map(str.split, name="split")
        .key_by(lambda word: word)
        .aggregate(0, lambda count, _word: count + 1, name="count")
        .collect("counts")
    )
    return flow


def final_counts(records: list[tuple[str, int]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for word, count in records:
        if count > counts.get(word, 0):
            counts[word] = count
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = scaffold.parser(__doc__)
    ap.add_argument("--words", type=int, default=4_000_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--data", default=os.path.join("data", "wordcount"))
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--output", default=None, help="write the (word, count) records here, sorted")
    scaffold.add_checkpoint_arguments(ap)
    return scaffold.run_example(ap, run, argv)


def run(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    paths = make_corpus(args.data, args.words)
    job = scaffold.run_job(
        ap,
        args,
        lambda **config: build(paths, args.parallelism, **config),
        restore_from=args.restore_from,
    )
    result = job.result
    if scaffold.report_stop(result):
        return 0
    counts = final_counts(result.output("counts"))
    if args.output:
        with open(args.output, "w") as fh:
            json.dump(sorted(result.output("counts")), fh)

    print(f"\ntop {args.top} words:")
    for word, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: args.top]:
        print(f"  {word:<12} {count:>9,}")
    words = len(result.output("counts"))  # one running count per word, exactly once
    print(
        f"\n{words:,} words counted ({len(counts):,} distinct) in {result.duration:.2f} s: "
        f"{words / result.duration:,.0f} words/s ({job.elapsed:.2f} s with Spark start-up)"
    )
    print(result.summary())

    expected: collections.Counter[str] = collections.Counter()
    for path in paths:
        with open(path) as fh:
            for line in fh:
                expected.update(line.split())
    if args.restore_from:  # the output holds the counts after the savepoint only
        ok = all(expected[word] == count for word, count in counts.items())
    else:
        ok = counts == dict(expected)
    print(f"check against collections.Counter: {'OK' if ok else 'MISMATCH'}")
    return scaffold.verdict(job, args, ok, lambda r: collections.Counter(r.output("counts")))


if __name__ == "__main__":
    sys.exit(main())
