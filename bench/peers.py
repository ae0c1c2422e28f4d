#!/usr/bin/env python3
"""PyTorch and Opacus beside dpgrad-bench's rows (bench/RESULTS.md): the same models, the same step.

Run by hand; dpgrad itself never needs Python. PyTorch from Debian's python3-torch,
Opacus from its source tree (a release tag, e.g. v1.4.0):

    python3 bench/peers.py --opacus-src /path/to/opacus [--model transformer,cnn26k,bilstm598k]

Each model is rebuilt in PyTorch as layers/models.cpp builds it, and one SGD step
on a fixed synthetic batch is timed, as dpgrad-bench does:

- transformer: token embedding 8185 x 64 with padding id 0, learned positions
  150 x 64, 2 pre-LN blocks of d 64, 4 heads and an MLP of 256 with GELU, a final
  LayerNorm, the mean over each sequence's positions, Dense(2): 633,666
  parameters; full-length sequences; batches 64 and 256 unless --batches says;
- cnn26k and bilstm598k: bench/onnx_models.py's modules (26,010 parameters;
  598,786, PyTorch's LSTM keeping two biases where dpgrad keeps one); batch 256
  unless --batches says.

Modes: torch, non-private (nn.MultiheadAttention with the padding mask, nn.LSTM);
opacus, Opacus's DP-SGD step (GradSampleModule hooks, DPMultiheadAttention or
DPLSTM, DPOptimizer with noise multiplier 1 and clip norm 1). Each (model, mode,
batch) runs in a process of its own, so that its peak RSS (the whole Python
process, torch included) is its own. Prints a markdown table and the lines for
bench/dpgrad_bench.cpp's kTransformerPeers and kPeers.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

VOCAB, LENGTH, DIM, HEADS, HIDDEN, BLOCKS, CLASSES = 8185, 150, 64, 4, 256, 2, 2


def build_model(torch, nn, dp_attention):
    seq_first = dp_attention is not None

    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(0.02 * torch.randn(LENGTH, DIM))

        def forward(self, x):
            return x + (self.table.unsqueeze(1) if seq_first else self.table)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
            if dp_attention is not None:
                self.attention = dp_attention(DIM, HEADS)  # sequence-first: (L, B, d)
            else:
                self.attention = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
            self.up, self.down = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)
            self.gelu = nn.GELU()

        def forward(self, x, padding):
            h = self.norm1(x)
            x = x + self.attention(h, h, h, key_padding_mask=padding, need_weights=False)[0]
            return x + self.down(self.gelu(self.up(self.norm2(x))))

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(VOCAB, DIM, padding_idx=0)
            self.positions = Positions()
            self.blocks = nn.ModuleList([Block() for _ in range(BLOCKS)])
            self.norm = nn.LayerNorm(DIM)
            self.dense = nn.Linear(DIM, CLASSES)

        def forward(self, tokens, lengths):
            # batch-first (B, L) for PyTorch; sequence-first (L, B) for Opacus, whose
            # DPMultiheadAttention reads (L, B, d) and whose hooks then take axis 1 as the batch
            padding = tokens == 0
            h = self.positions(self.embedding(tokens))
            for block in self.blocks:
                h = block(h, padding if not seq_first else padding.t())
            h = self.norm(h)
            weights = (~padding).to(h.dtype) / lengths.to(h.dtype).unsqueeze(int(not seq_first))
            if seq_first:  # (1, B, d), so that the hooks see the batch on axis 1 here too
                return self.dense((h * weights.unsqueeze(2)).sum(0, keepdim=True))[0]
            return self.dense((h * weights.unsqueeze(2)).sum(1))

    return Classifier, Positions


DEFAULT_BATCHES = {"transformer": "64,256", "cnn26k": "256", "bilstm598k": "256"}
PARAMETERS = {"transformer": 633666, "cnn26k": 26010, "bilstm598k": 598786}


def build(torch, nn, name, mode, batch):
    """The model, its inputs (a tuple), the labels, and the classes with their own
    grad sampler (Opacus has none for them)."""
    opacus = mode == "opacus"
    labels_of = lambda classes: torch.randint(0, classes, (batch,))
    if name == "transformer":
        dp_attention = None
        if opacus:
            from opacus.layers import DPMultiheadAttention

            dp_attention = DPMultiheadAttention
        Classifier, Positions = build_model(torch, nn, dp_attention)
        tokens = torch.randint(2, VOCAB, (batch, LENGTH))
        if opacus:
            tokens = tokens.t().contiguous()  # (L, B)
        return Classifier(), (tokens, torch.full((batch,), LENGTH)), labels_of(CLASSES), [Positions]
    from onnx_models import BiLstm598k, Cnn26k  # this folder's exports of the same shapes

    if name == "cnn26k":
        return Cnn26k(), (torch.randn(batch, 1, 28, 28),), labels_of(10), []
    model = BiLstm598k()
    if opacus:  # nn.LSTM has no grad sampler; DPLSTM is Opacus's drop-in
        from opacus.layers import DPLSTM

        model.lstm = DPLSTM(64, 64, batch_first=True, bidirectional=True)
    return model, (torch.randint(1, VOCAB, (batch, LENGTH)),), labels_of(2), []


def child(args):
    import torch
    import torch.nn as nn

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    model, inputs, labels, own_samplers = build(torch, nn, args.model, args.mode, args.batch)
    params = sum(p.numel() for p in model.parameters())
    assert params == PARAMETERS[args.model], params
    loss_fn = nn.CrossEntropyLoss()
    if args.mode == "opacus":
        from opacus import GradSampleModule
        from opacus.grad_sample import register_grad_sampler
        from opacus.optimizers import DPOptimizer

        for positions in own_samplers:  # the transformer's learned positions
            @register_grad_sampler(positions)
            def positions_grad_sample(layer, activations, backprops):
                return {layer.table: backprops}  # (B, L, d), the batch moved first: each sample's gradient

        # the transformer runs sequence-first under Opacus (DPMultiheadAttention reads (L, B, d))
        model = GradSampleModule(model, batch_first=args.model != "transformer")
        optimizer = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                                max_grad_norm=1.0, expected_batch_size=args.batch)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(*inputs), labels).backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        times.append(1000 * (time.perf_counter() - t))
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"model": args.model, "mode": args.mode, "batch": args.batch, "ms": statistics.median(times),
                      "ms_min": min(times), "ms_max": max(times), "peak_rss_mb": rss_mb}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--opacus-src", help="Opacus's source tree (needed for the opacus rows)")
    p.add_argument("--model", default="transformer", help="comma-separated: " + ", ".join(DEFAULT_BATCHES))
    p.add_argument("--batches", help="comma-separated (default: 64,256 for the transformer, 256 for the others)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", dest="mode", choices=["torch", "opacus"], help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        return child(args)
    models = args.model.split(",")
    for m in models:
        if m not in DEFAULT_BATCHES:
            p.error(f"unknown model '{m}' (known: {', '.join(DEFAULT_BATCHES)})")
    env = dict(os.environ)
    # PyTorch's own threads do the parallel work, Debian's OpenBLAS one thread inside
    # each: its fastest setting here (at batch 64, 2 threads: 451 ms, against 623 ms
    # with OpenBLAS's threads on top), as dpgrad keeps OpenBLAS single-threaded too
    env.update({"OMP_NUM_THREADS": str(args.threads), "OPENBLAS_NUM_THREADS": "1"})
    shim = tempfile.TemporaryDirectory()
    if args.opacus_src:
        path = [os.path.abspath(args.opacus_src)]
        try:
            import opt_einsum  # noqa: F401
        except ImportError:  # Debian has no opt_einsum: torch.einsum does the same contractions
            os.mkdir(os.path.join(shim.name, "opt_einsum"))
            for name in ("__init__.py", "contract.py"):
                with open(os.path.join(shim.name, "opt_einsum", name), "w") as f:
                    f.write("import torch\n\ndef contract(equation, *operands, **options):\n"
                            "    return torch.einsum(equation, *operands)\n")
            path.append(shim.name)
        env["PYTHONPATH"] = os.pathsep.join(path + [env.get("PYTHONPATH", "")])
    modes = ["torch"] + (["opacus"] if args.opacus_src else [])
    results = {}
    batches = {m: [int(b) for b in (args.batches or DEFAULT_BATCHES[m]).split(",")] for m in models}
    for model in models:
        for batch in batches[model]:
            for mode in modes:
                cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--model", model, "--batch",
                       str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads",
                       str(args.threads)]
                run = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if run.returncode != 0:
                    sys.exit(f"{model}, {mode} at batch {batch} failed:\n{run.stderr}")
                results[(model, mode, batch)] = json.loads(run.stdout.strip().splitlines()[-1])
                print(f"{model} {mode} batch {batch}: {results[(model, mode, batch)]}", file=sys.stderr)
    import torch

    print(f"PyTorch {torch.__version__}, {args.threads} threads, {platform.processor() or platform.machine()}, "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}\n")
    print("| model | batch | PyTorch ms | Opacus ms | PyTorch peak RSS MB | Opacus peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|")
    nan = {"ms": float("nan"), "peak_rss_mb": float("nan")}
    for model in models:
        for batch in batches[model]:
            t, o = results[(model, "torch", batch)], results.get((model, "opacus", batch), nan)
            print(f"| {model} | {batch} | {t['ms']:.1f} | {o['ms']:.1f} | {t['peak_rss_mb']:.0f} | "
                  f"{o['peak_rss_mb']:.0f} |")
    if "opacus" not in modes:
        return
    print("\nkTransformerPeers / kPeers:")
    for model in models:
        for batch in batches[model]:
            t, o = results[(model, "torch", batch)], results[(model, "opacus", batch)]
            if model == "transformer":
                print(f"    {{{batch}, {t['ms']:.1f}, {o['ms']:.1f}, {t['peak_rss_mb']:.0f}, {o['peak_rss_mb']:.0f}}},")
            else:
                print(f"    {{\"{model}\" (batch {batch}), {t['ms']:.1f}, {o['ms']:.1f}, {t['peak_rss_mb']:.0f}, "
                      f"{o['peak_rss_mb']:.0f}}},")


if __name__ == "__main__":
    main()
