#!/usr/bin/python3
# The benchmark models rebuilt in PyTorch and exported to ONNX, for
# `dpgrad-bench --model onnx:PATH` against the built-in ones (EXPERIMENTS.md,
# "Imported models"). Run by hand with Debian's python3-torch 1.13:
#   /usr/bin/python3 bench/onnx_models.py OUT_DIR
# writes OUT_DIR/cnn26k.onnx and OUT_DIR/bilstm598k.onnx, the shapes of
# layers/models.cpp (cnn26k: 26,010 parameters; bilstm598k: PyTorch's LSTM keeps
# two biases, 598,786 parameters against the built-in 598,274).
import os
import sys

import torch
import torch.nn as nn


class Cnn26k(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 8, stride=2, padding=3)  # 'same' for 28 with stride 2: (B, 16, 14, 14)
        self.conv2 = nn.Conv2d(16, 32, 4, stride=2)  # (B, 32, 5, 5)
        self.dense1 = nn.Linear(512, 32)
        self.dense2 = nn.Linear(32, 10)

    def forward(self, x):  # (B, 1, 28, 28)
        h = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2, stride=1)  # (B, 16, 13, 13)
        h = nn.functional.max_pool2d(torch.relu(self.conv2(h)), 2, stride=1)  # (B, 32, 4, 4)
        return self.dense2(torch.relu(self.dense1(torch.flatten(h, 1))))


class BiLstm598k(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(8185, 64)
        self.lstm = nn.LSTM(64, 64, batch_first=True, bidirectional=True)
        self.dense1 = nn.Linear(128, 64)
        self.dense2 = nn.Linear(64, 2)

    def forward(self, tokens):  # (B, 150)
        _, (h, _) = self.lstm(self.embedding(tokens))  # h (2, B, 64)
        final = h.transpose(0, 1).reshape(tokens.shape[0], 128)
        return self.dense2(torch.relu(self.dense1(final)))


def export(model, example, path, name):
    torch.onnx.export(model.eval(), (example,), path, input_names=[name], output_names=["logits"],
                      dynamic_axes={name: {0: "batch"}, "logits": {0: "batch"}}, opset_version=13)
    print("%s: %d parameters" % (path, sum(p.numel() for p in model.parameters())))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    export(Cnn26k(), torch.randn(2, 1, 28, 28), os.path.join(out, "cnn26k.onnx"), "images")
    export(BiLstm598k(), torch.randint(1, 8185, (2, 150)), os.path.join(out, "bilstm598k.onnx"), "tokens")


if __name__ == "__main__":
    main()
