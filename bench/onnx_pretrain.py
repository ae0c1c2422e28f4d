#!/usr/bin/python3
# Public pretraining for the fine-tuning experiment of EXPERIMENTS.md
# ("Fine-tuning an imported model"): a cnn26k-shaped CNN with a 5-way head,
# trained non-privately in PyTorch on Fashion-MNIST's classes 0-4 (the public
# data), exported to ONNX; and the same architecture at its random
# initialisation (the from-scratch baseline). Run by hand with Debian's
# python3-torch 1.13:
#   /usr/bin/python3 bench/onnx_pretrain.py OUT_DIR [EPOCHS]
# writes OUT_DIR/pretrained.onnx and OUT_DIR/scratch.onnx. Pixels are scaled to
# [0, 1], as dpgrad's Fashion-MNIST loader does.
import gzip
import os
import sys

import numpy as np
import torch
import torch.nn as nn

DATA = "/usr/share/datasets/fashion-mnist"


def idx(name):
    with gzip.open(os.path.join(DATA, name)) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


class Cnn(nn.Module):  # cnn26k's layers (layers/models.cpp) with 5 outputs
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 8, stride=2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, 4, stride=2)
        self.dense1 = nn.Linear(512, 32)
        self.dense2 = nn.Linear(32, 5)

    def forward(self, x):
        h = nn.functional.max_pool2d(torch.tanh(self.conv1(x)), 2, stride=1)
        h = nn.functional.max_pool2d(torch.tanh(self.conv2(h)), 2, stride=1)
        return self.dense2(torch.tanh(self.dense1(torch.flatten(h, 1))))


def export(model, path):
    torch.onnx.export(model.eval(), (torch.zeros(2, 1, 28, 28),), path, input_names=["images"],
                      output_names=["logits"], dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}},
                      opset_version=13)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    export(Cnn(), os.path.join(out, "scratch.onnx"))
    x = torch.tensor(idx("train-images-idx3-ubyte.gz"), dtype=torch.float32).unsqueeze(1) / 255
    y = torch.tensor(idx("train-labels-idx1-ubyte.gz"), dtype=torch.int64)
    tx = torch.tensor(idx("t10k-images-idx3-ubyte.gz"), dtype=torch.float32).unsqueeze(1) / 255
    ty = torch.tensor(idx("t10k-labels-idx1-ubyte.gz"), dtype=torch.int64)
    public = y < 5
    x, y = x[public], y[public]
    model = Cnn()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(len(y))
        for i in range(0, len(y), 128):
            b = perm[i:i + 128]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            keep = ty < 5
            acc = (model(tx[keep]).argmax(1) == ty[keep]).float().mean().item()
        print("epoch %d: public test accuracy (classes 0-4) %.2f%%" % (epoch + 1, 100 * acc))
    export(model, os.path.join(out, "pretrained.onnx"))


if __name__ == "__main__":
    main()
