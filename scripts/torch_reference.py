#!/usr/bin/env python3
"""Reference data for tests/nn_test.cpp (Parity tests), computed by PyTorch.

Builds the same tiny GPT-2-style and LLaMA-style models as Sinter (same parameter names and
math), from weights it draws and saves, runs one batch forward and backward, and three AdamW
steps. Writes tests/data/{gpt2,llama}_{weights,ref}.safetensors. Run by hand where PyTorch is
installed (Debian's python3-torch or PyPI's torch); Sinter's build and tests never need it:

    python3 scripts/torch_reference.py
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
DT = {np.dtype("float32"): "F32", np.dtype("int64"): "I64"}


def save_safetensors(path, tensors, metadata=None):
    """A minimal safetensors writer: 8-byte header length, JSON header, raw little-endian data."""
    header, blobs, at = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        a = np.array(tensors[name], order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        b = a.tobytes()
        header[name] = {"dtype": DT[a.dtype], "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


CONFIGS = {
    "gpt2": dict(model_type="gpt2", vocab_size=256, n_positions=32, n_embd=32, n_inner=64, n_layer=2, n_head=4,
                 layer_norm_epsilon=1e-5, tie_word_embeddings=True),
    "llama": dict(model_type="llama", vocab_size=256, max_position_embeddings=32, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                  rope_theta=10000.0, tie_word_embeddings=False),
}


def param_shapes(c):
    llama = c["model_type"] == "llama"
    C = c["hidden_size"] if llama else c["n_embd"]
    L = c["num_hidden_layers"] if llama else c["n_layer"]
    H = c["num_attention_heads"] if llama else c["n_head"]
    KV = c["num_key_value_heads"] if llama else H
    I = c["intermediate_size"] if llama else c["n_inner"]
    D = C // H
    s = {"tok_emb.weight": (c["vocab_size"], C)}
    if not llama:
        s["pos_emb.weight"] = (c["n_positions"], C)
    for i in range(L):
        p = f"blocks.{i}."
        s[p + "norm1.weight"] = (C,)
        s[p + "norm2.weight"] = (C,)
        if not llama:
            s[p + "norm1.bias"] = (C,)
            s[p + "norm2.bias"] = (C,)
        for n, out in (("q_proj", H * D), ("k_proj", KV * D), ("v_proj", KV * D)):
            s[p + f"attn.{n}.weight"] = (out, C)
            if not llama:
                s[p + f"attn.{n}.bias"] = (out,)
        s[p + "attn.o_proj.weight"] = (C, H * D)
        if llama:
            s[p + "mlp.gate.weight"] = (I, C)
            s[p + "mlp.up.weight"] = (I, C)
            s[p + "mlp.down.weight"] = (C, I)
        else:
            s[p + "attn.o_proj.bias"] = (C,)
            s[p + "mlp.fc.weight"] = (I, C)
            s[p + "mlp.fc.bias"] = (I,)
            s[p + "mlp.proj.weight"] = (C, I)
            s[p + "mlp.proj.bias"] = (C,)
    s["norm_f.weight"] = (C,)
    if not llama:
        s["norm_f.bias"] = (C,)
    if not c.get("tie_word_embeddings", True):
        s["lm_head.weight"] = (c["vocab_size"], C)
    return s, dict(llama=llama, C=C, L=L, H=H, KV=KV, D=D)


def forward(P, c, g, idx):
    B, T = idx.shape
    x = P["tok_emb.weight"][idx]
    if not g["llama"]:
        x = x + P["pos_emb.weight"][:T]
    H, KV, D = g["H"], g["KV"], g["D"]
    if g["llama"]:
        inv = c["rope_theta"] ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = ang.cos().float(), ang.sin().float()

    def norm(x, p):
        if g["llama"]:
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + c["rms_norm_eps"]) * P[p + ".weight"]
        return F.layer_norm(x, (g["C"],), P[p + ".weight"], P[p + ".bias"], c["layer_norm_epsilon"])

    def lin(x, p, bias):
        return F.linear(x, P[p + ".weight"], P[p + ".bias"] if bias else None)

    def rope(t):
        h = D // 2
        a, b = t[..., :h], t[..., h:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    bias = not g["llama"]
    for i in range(g["L"]):
        p = f"blocks.{i}."
        h = norm(x, p + "norm1")
        q = lin(h, p + "attn.q_proj", bias).view(B, T, H, D).transpose(1, 2)
        k = lin(h, p + "attn.k_proj", bias).view(B, T, KV, D).transpose(1, 2)
        v = lin(h, p + "attn.v_proj", bias).view(B, T, KV, D).transpose(1, 2)
        if g["llama"]:
            q, k = rope(q), rope(k)
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + lin(y, p + "attn.o_proj", bias)
        h = norm(x, p + "norm2")
        if g["llama"]:
            m = lin(F.silu(lin(h, p + "mlp.gate", False)) * lin(h, p + "mlp.up", False), p + "mlp.down", False)
        else:
            m = lin(F.gelu(lin(h, p + "mlp.fc", True), approximate="tanh"), p + "mlp.proj", True)
        x = x + m
    x = norm(x, "norm_f")
    head = P["lm_head.weight"] if "lm_head.weight" in P else P["tok_emb.weight"]
    return F.linear(x, head)


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, c in CONFIGS.items():
        shapes, g = param_shapes(c)
        rng = np.random.default_rng(7)
        W = {}
        for n, s in shapes.items():
            if n.endswith("norm1.weight") or n.endswith("norm2.weight") or n == "norm_f.weight":
                W[n] = (1.0 + 0.1 * rng.standard_normal(s)).astype(np.float32)
            else:
                W[n] = (0.1 * rng.standard_normal(s)).astype(np.float32)
        B, T = 2, 16
        idx = rng.integers(0, 256, size=(B, T), dtype=np.int64)
        tgt = rng.integers(0, 256, size=(B, T), dtype=np.int64)
        save_safetensors(os.path.join(OUT, f"{name}_weights.safetensors"), dict(W, **{"batch.x": idx, "batch.y": tgt}),
                         {"config": json.dumps(c)})

        P = {n: torch.tensor(w, requires_grad=True) for n, w in W.items()}
        x, y = torch.tensor(idx), torch.tensor(tgt)
        logits = forward(P, c, g, x)
        loss = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        loss.backward()
        ref = {"logits": logits.detach().numpy(), "loss": loss.detach().numpy().reshape(())}
        for n, p in P.items():
            ref["grad." + n] = p.grad.numpy()

        # AdamW, 3 steps on the same batch; weight decay on parameters with >= 2 dims, as Sinter does.
        P2 = {n: torch.tensor(w, requires_grad=True) for n, w in W.items()}
        decay = [p for n, p in P2.items() if p.dim() >= 2]
        no_decay = [p for n, p in P2.items() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
        names = list(P2)
        for k in range(1, 4):
            opt.zero_grad()
            l = F.cross_entropy(forward(P2, c, g, x).reshape(-1, 256), y.reshape(-1))
            l.backward()
            for n in names:  # the gradients each step saw, so the optimizer can be checked alone
                ref[f"adamw_grad{k}." + n] = P2[n].grad.numpy().copy()
            opt.step()
        for n, p in P2.items():
            ref["adamw3." + n] = p.detach().numpy()
        save_safetensors(os.path.join(OUT, f"{name}_ref.safetensors"), ref,
                         {"torch": torch.__version__, "config": json.dumps(c)})
        print(f"{name}: loss {loss.item():.6f}, {len(W)} parameters tensors -> tests/data/{name}_*.safetensors")


if __name__ == "__main__":
    sys.exit(main())
