"""A user script with a recurrent model: a character-level GRU language model, made
data-parallel by hetsync.

The lines marked `# hetsync` are hetsync's. The text is the docstrings of a fixed list of
Python standard-library modules (about 200 KB of English prose, read from the interpreter's
own sources, so nothing is downloaded); its last tenth is held out. The script does what a
language-model script usually does: Adam, gradient clipping, and a learning-rate schedule.

    hetsync launch --workers 4 --protocol hop examples/gru_language_model.py --epochs 4

Without a launcher it runs as a single ordinary process.
"""

from __future__ import annotations

import argparse
import ast
import json
import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hetsync  # hetsync

MODULES = (
    "argparse", "collections/__init__", "contextlib", "dataclasses", "datetime", "difflib",
    "enum", "functools", "inspect", "pathlib", "random", "statistics", "string", "subprocess",
    "tempfile", "textwrap", "threading", "typing", "zipfile",
)


def corpus() -> str:
    """The docstrings of MODULES (module, classes, functions), ASCII only, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for name in MODULES:
        tree = ast.parse((stdlib / f"{name}.py").read_text(encoding="utf-8"))
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        docs += [ast.get_docstring(n) or "" for n in ast.walk(tree) if isinstance(n, kinds)]
    text = "\n\n".join(doc for doc in docs if doc)
    return text.encode("ascii", "replace").decode("ascii")


def datasets(seq_len: int) -> tuple[TensorDataset, TensorDataset, int]:
    """(train, held-out, vocabulary size): non-overlapping sequences of seq_len characters,
    each with its next-character targets; the last 10% of the text is held out."""
    text = corpus()
    vocab = sorted(set(text))
    lookup = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([lookup[c] for c in text], dtype=torch.long)
    cut = int(0.9 * len(ids))
    return _sequences(ids[:cut], seq_len), _sequences(ids[cut:], seq_len), len(vocab)


def _sequences(ids: torch.Tensor, seq_len: int) -> TensorDataset:
    n = (len(ids) - 1) // seq_len
    inputs = ids[: n * seq_len].view(n, seq_len)
    targets = ids[1 : n * seq_len + 1].view(n, seq_len)
    return TensorDataset(inputs, targets)


class CharGRU(nn.Module):
    def __init__(self, vocab: int, embedding: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.gru = nn.GRU(embedding, hidden, num_layers=layers, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Next-character logits, (batch, time, vocab)."""
        hidden, _ = self.gru(self.embed(x))
        return self.out(hidden)


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


@torch.no_grad()
def evaluate(model: nn.Module, data: TensorDataset) -> dict[str, float]:
    """Held-out cross-entropy (nats per character) and next-character accuracy."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    inputs, targets = (t.to(device) for t in data.tensors)
    logits = model(inputs)
    model.train(was_training)
    return {
        "loss": loss_of(logits, targets).item(),
        "accuracy": (logits.argmax(-1) == targets).float().mean().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                        help="sgd: with momentum 0.9")
    parser.add_argument("--clip", type=float, default=1.0, help="gradient norm clipping")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=48)
    parser.add_argument("--embedding", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=96)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    runtime = hetsync.init()  # hetsync: join the run
    train, held_out, vocab = datasets(args.seq_len)
    sampler = DistributedSampler(train, seed=args.seed)  # hetsync: this worker's shard
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(args.seed)  # the same model on every rank
    net = CharGRU(vocab, args.embedding, args.hidden, args.layers).to(runtime.device)
    optimizer = (torch.optim.Adam(net.parameters(), lr=args.lr) if args.optimizer == "adam"
                 else torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9))
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs * len(loader))
    model, optimizer = hetsync.prepare(  # hetsync: rank 0 evaluates the consensus model
        net, optimizer, evaluate=lambda m: evaluate(m, held_out)  # during the run: summary.json
    )

    for inputs, targets in optimizer.iterate(loader, epochs=args.epochs):  # hetsync
        inputs, targets = inputs.to(runtime.device), targets.to(runtime.device)
        optimizer.zero_grad()
        loss = loss_of(model(inputs), targets)
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), args.clip)
        optimizer.step(loss=loss)  # hetsync
        schedule.step()

    final = optimizer.consensus_model()  # hetsync: every rank; the average of all workers' models
    report(runtime, optimizer.iteration, evaluate(final, held_out))


def report(runtime: hetsync.Runtime, iterations: int, result: dict[str, float]) -> None:
    """Rank 0 prints the held-out figures and writes them to RUN_DIR/user_result.json."""
    if runtime.rank != 0:
        return
    row = {"val_loss": result["loss"], "val_accuracy": result["accuracy"],
           "iterations": iterations}
    print(json.dumps(row))
    if runtime.run_dir is not None:
        (runtime.run_dir / "user_result.json").write_text(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
