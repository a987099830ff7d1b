"""The LSTM language model of plain.py made data-parallel by hetsync: the lines marked
`# hetsync` are the only changes (tests/examples/test_own_script.py counts them).

The training stream's batches are dealt to the workers as they ask, epoch by epoch
(`hetsync.data.deal`: a faster worker takes more; under a lock-step protocol, or with
`HETSYNC_SAMPLER=static`, each its own contiguous piece); validation, the learning-rate
decay, `torch.save(model, path)` of the whole module and its reload are the plain script's,
on each worker's own model, in its own folder OUT/rank{r}. It never reads
`should_stop` and calls nothing of hetsync after its loop.

    hetsync launch --workers 2 --protocol hop \
        examples/strangers/lstm_language_model/with_hetsync.py --small --out runs/lstm

It writes OUT/rank{r}/result.json, each worker's test cross-entropy (nats per character).
"""

import argparse
import ast
import json
import math
import sysconfig
from pathlib import Path

import torch
from torch import nn

import hetsync.data  # hetsync (added)

MODULES = ("argparse", "collections/__init__", "contextlib", "dataclasses", "datetime",
           "difflib", "enum", "functools", "inspect", "pathlib", "statistics", "textwrap")


def read_corpus(modules: tuple[str, ...]) -> str:
    """The docstrings of `modules`, ASCII only, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for name in modules:
        tree = ast.parse((stdlib / f"{name}.py").read_text(encoding="utf-8"))
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        docs += [ast.get_docstring(n) or "" for n in ast.walk(tree) if isinstance(n, kinds)]
    return "\n\n".join(d for d in docs if d).encode("ascii", "replace").decode("ascii")


class RNNModel(nn.Module):
    """Embedding, LSTM, linear decoder, with dropout in between."""

    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout if nlayers > 1 else 0.0)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, tokens, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(tokens)), hidden)
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, bsz: int):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data: torch.Tensor, bsz: int, device: torch.device) -> torch.Tensor:
    """The stream cut into `bsz` columns (the tail that does not fill a row dropped)."""
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous().to(device)


def get_batch(source: torch.Tensor, i: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    """The hidden state detached from the graph of the batch that made it."""
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def main() -> None:
    parser = argparse.ArgumentParser(description="character-level LSTM language model")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--small", action="store_true", help="a few seconds: less text, 1 epoch")
    parser.add_argument("--lr", type=float, default=2.0)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--bptt", type=int, default=35)
    parser.add_argument("--nhid", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1111)
    parser.add_argument("--out", default=".", help="where model.pt and result.json go")
    args = parser.parse_args()
    if args.small:
        args.epochs, args.nhid = 1, 64

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out) / f"rank{hetsync.init().rank}"  # hetsync (changed): join; a folder each
    out.mkdir(parents=True, exist_ok=True)
    text = read_corpus(MODULES[:2] if args.small else MODULES)
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    cut1, cut2 = int(0.8 * len(ids)), int(0.9 * len(ids))
    train_ids, val_ids, test_ids = ids[:cut1], ids[cut1:cut2], ids[cut2:]
    eval_batch_size = 10
    train_data = batchify(train_ids, args.batch_size, device)
    val_data = batchify(val_ids, eval_batch_size, device)
    test_data = batchify(test_ids, eval_batch_size, device)
    batches = range(0, train_data.size(0) - 1, args.bptt)  # hetsync (added): their offsets

    ntokens = len(vocab)
    model = RNNModel(ntokens, 32, args.nhid, 2, 0.2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = hetsync.prepare(model, optimizer)  # hetsync (added)
    criterion = nn.CrossEntropyLoss()

    def evaluate(source: torch.Tensor) -> float:
        model.eval()
        total_loss = 0.0
        hidden = model.init_hidden(eval_batch_size)
        with torch.no_grad():
            for i in range(0, source.size(0) - 1, args.bptt):
                data, targets = get_batch(source, i, args.bptt)
                output, hidden = model(data, hidden)
                total_loss += len(data) * criterion(output.view(-1, ntokens), targets).item()
        return total_loss / (len(source) - 1)

    best_val_loss = None
    for epoch in range(1, args.epochs + 1):
        model.train()
        hidden = model.init_hidden(args.batch_size)
        for i in hetsync.data.deal(batches, epoch=epoch):  # hetsync (changed): dealt as asked
            data, targets = get_batch(train_data, i, args.bptt)
            hidden = repackage_hidden(hidden)
            optimizer.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(output.view(-1, ntokens), targets)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
        val_loss = evaluate(val_data)
        print(f"| end of epoch {epoch} | valid loss {val_loss:.3f} | ppl {math.exp(val_loss):.2f}")
        if best_val_loss is None or val_loss < best_val_loss:
            with open(out / "model.pt", "wb") as f:
                torch.save(model, f)
            best_val_loss = val_loss
        else:
            for group in optimizer.param_groups:
                group["lr"] /= 4.0

    with open(out / "model.pt", "rb") as f:
        model = torch.load(f, weights_only=False)
    test_loss = evaluate(test_data)
    result = {"metric": "test_loss", "value": test_loss, "higher_is_better": False,
              "test_ppl": math.exp(test_loss), "best_val_loss": best_val_loss}
    print(json.dumps(result))
    (out / "result.json").write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
