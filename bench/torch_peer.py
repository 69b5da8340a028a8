#!/usr/bin/env python3
"""PyTorch's side of `sinter bench SUITE`: the same cases, shapes, dtypes, threads and model, timed
the same way (warm up, repeat, best and median), written as JSON rows that `sinter bench` merges
into its table. Case names must match the ones Sinter prints.

    python3 bench/torch_peer.py SUITE --threads N --json OUT [--quick]

Runs with whatever PyTorch `python3` imports (PyPI's torch, or Debian's python3-torch); the JSON
names the version. The models are written as a careful PyTorch user would write them: nn.Linear,
F.layer_norm, F.scaled_dot_product_attention, torch.optim.AdamW, a preallocated KV cache.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def time_it(f, warmup=3, reps=15, min_total_s=0.3):
    for _ in range(warmup):
        f()
    ms, total = [], 0.0
    while len(ms) < reps or (total < min_total_s and len(ms) < 2000):
        t0 = time.perf_counter()
        f()
        s = time.perf_counter() - t0
        ms.append(s * 1e3)
        total += s
    ms.sort()
    return ms[0], ms[len(ms) // 2]


def time_per_call(f, n):
    """For sub-microsecond ops: one timing covers n calls; reports per-call ms."""
    def many():
        for _ in range(n):
            f()
    best, med = time_it(many, warmup=2, reps=9, min_total_s=0.2)
    return best / n, med / n


# ---------------------------------------------------------------------------------------------
# The default model: GPT-2 style (learned positions, LayerNorm, tanh-GELU MLP, tied embeddings),
# sizes from Sinter's "tiny" preset.
TINY = dict(vocab=256, positions=128, C=128, L=4, H=4, inner=512, eps=1e-5)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        C = c["C"]
        self.H = c["H"]
        self.norm1 = nn.LayerNorm(C, eps=c["eps"])
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(C, C) for _ in range(4))
        self.norm2 = nn.LayerNorm(C, eps=c["eps"])
        self.fc = nn.Linear(C, c["inner"])
        self.proj = nn.Linear(c["inner"], C)

    def forward(self, x, cache=None, pos0=0):
        B, T, C = x.shape
        H, D = self.H, C // self.H
        h = self.norm1(x)
        q = self.q_proj(h).view(B, T, H, D).transpose(1, 2)
        k = self.k_proj(h).view(B, T, H, D).transpose(1, 2)
        v = self.v_proj(h).view(B, T, H, D).transpose(1, 2)
        if cache is not None:
            ck, cv = cache
            ck[:, :, pos0:pos0 + T] = k
            cv[:, :, pos0:pos0 + T] = v
            k, v = ck[:, :, :pos0 + T], cv[:, :, :pos0 + T]
        if T == 1:
            y = F.scaled_dot_product_attention(q, k, v)
        elif pos0 == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(T, pos0 + T, dtype=torch.bool).tril(pos0)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.proj(F.gelu(self.fc(self.norm2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_emb = nn.Embedding(c["vocab"], c["C"])
        self.pos_emb = nn.Embedding(c["positions"], c["C"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["L"]))
        self.norm_f = nn.LayerNorm(c["C"], eps=c["eps"])
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, caches=None, pos0=0):
        T = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb.weight[pos0:pos0 + T]
        for i, b in enumerate(self.blocks):
            x = b(x, caches[i] if caches is not None else None, pos0)
        return F.linear(self.norm_f(x), self.tok_emb.weight)


# ---------------------------------------------------------------------------------------------
def suite_ops(a, rows):
    with torch.no_grad():
        x, y = torch.randn(16), torch.randn(16)
        best, med = time_per_call(lambda: torch.add(x, y), 20000)
        rows.append(dict(case="overhead add 16 f32", best_ms=best, median_ms=med))
        n = 16 << 20
        x, y = torch.randn(n), torch.randn(n)
        cases = [("elementwise f32 add", lambda: torch.add(x, y)),
                 ("elementwise f32 gelu (erf)", lambda: F.gelu(x)),
                 ("elementwise f32 gelu (tanh)", lambda: F.gelu(x, approximate="tanh")),
                 ("elementwise f32 mul by scalar", lambda: torch.mul(x, 0.5))]
        rows_n, cols = 16384, 1024
        m = torch.randn(rows_n, cols)
        w, b = torch.randn(cols), torch.randn(cols)
        cases += [("softmax f32 16384x1024", lambda: torch.softmax(m, -1)),
                  ("layer_norm f32 16384x1024", lambda: F.layer_norm(m, (cols,), w, b)),
                  ("rms_norm f32 16384x1024", (lambda: F.rms_norm(m, (cols,), w)) if hasattr(F, "rms_norm")
                   else (lambda: m * torch.rsqrt(m.pow(2).mean(-1, keepdim=True) + 1e-6) * w))]
        for name, f in cases:
            best, med = time_it(f)
            rows.append(dict(case=name, best_ms=best, median_ms=med))


def suite_linear(a, rows):
    ms = [1, 128] if a.quick else [1, 32, 128, 512]
    with torch.no_grad():
        for K, N in [(4096, 4096)]:
            for dt, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
                w = (torch.randn(N, K) * 0.02).to(dt)
                for M in ms:
                    x = torch.randn(M, K).to(dt)
                    best, med = time_it(lambda: F.linear(x, w))
                    rows.append(dict(case=f"linear {name} M={M} K={K} N={N}", best_ms=best, median_ms=med))


def suite_train(a, rows):
    torch.manual_seed(0)
    B, T = 16, 128
    for dt, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        model = GPT(TINY)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
        x = torch.randint(0, 256, (B, T))
        y = torch.randint(0, 256, (B, T))

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dt == torch.bfloat16):
                logits = model(x)
                loss = F.cross_entropy(logits.float().view(-1, 256), y.view(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        best, med = time_it(step, warmup=3, reps=5 if a.quick else 10, min_total_s=0)
        rows.append(dict(case=f"train {name} tiny B={B} T={T} step", best_ms=best, median_ms=med))


def suite_generate(a, rows):
    torch.manual_seed(0)
    c = TINY
    prompt_len, new = 16, 96
    for dt, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        model = GPT(c).eval().to(dt)
        Dh = c["C"] // c["H"]
        prompt = torch.randint(32, 127, (1, prompt_len))

        @torch.inference_mode()
        def run():
            caches = [(torch.zeros(1, c["H"], c["positions"], Dh, dtype=dt),
                       torch.zeros(1, c["H"], c["positions"], Dh, dtype=dt)) for _ in range(c["L"])]
            logits = model(prompt, caches, 0)
            pos = prompt_len
            for _ in range(new):
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                logits = model(nxt, caches, pos)
                pos += 1

        best, med = time_it(run, warmup=1, reps=5, min_total_s=0)
        rows.append(dict(case=f"generate {name} tiny batch=1 {new} tokens (per token)", best_ms=best / new,
                         median_ms=med / new))


def suite_attention(a, rows):
    for D in (64, 128):
        for S in ([512] if a.quick else [512, 2048, 8192]):
            q, k, v, do = (torch.randn(1, 16, S, D) for _ in range(4))
            reps = 1 if S >= 8192 else 3

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(do)

            for name, f in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                best, med = time_it(f, 1, reps, 0)
                rows.append(dict(case=f"causal D={D} S={S} {name}", best_ms=best, median_ms=med))
    with torch.no_grad():
        for L in (2048, 8192):
            q, k, v = torch.randn(1, 16, 1, 128), torch.randn(1, 4, L, 128), torch.randn(1, 4, L, 128)
            kw = dict(enable_gqa=True) if "enable_gqa" in F.scaled_dot_product_attention.__doc__ else {}
            if not kw:
                k, v = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
            best, med = time_it(lambda: F.scaled_dot_product_attention(q, k, v, **kw))
            rows.append(dict(case=f"decode GQA 16:4 D=128 Lkv={L}", best_ms=best, median_ms=med))


def suite_sparse(a, rows):
    # PyTorch has no CPU 2:4 kernel (torch.sparse.to_sparse_semi_structured is CUDA-only): the
    # peer is the dense linear on the same pruned weights, what a PyTorch user runs on a CPU.
    shapes = [(4096, 4096)] if a.quick else [(4096, 4096), (4096, 11008), (11008, 4096)]
    plans = [("f32", torch.float32, [1, 128]), ("int8", torch.float32, [1])] if a.quick else \
        [("f32", torch.float32, [1, 4, 16, 32, 128, 512, 2048]), ("int8", torch.float32, [1, 16, 128]), ("bf16", torch.bfloat16, [1, 128])]
    with torch.no_grad():
        for K, N in shapes:
            w = torch.randn(N, K) * 0.02
            w = w * (w.abs().reshape(N, K // 4, 4).argsort(-1).argsort(-1) >= 2).reshape(N, K)  # 2:4 by magnitude
            for name, dt, ms in plans:
                wd = w.to(dt)
                for M in ms:
                    x = torch.randn(M, K).to(dt)
                    best, med = time_it(lambda: F.linear(x, wd), reps=5 if M >= 512 else 15)
                    rows.append(dict(case=f"{name} M={M} K={K} N={N}", best_ms=best, median_ms=med))


def suite_compile(a, rows):
    """torch.compile (Inductor, its C++ code generation on CPU) on the cases of `sinter bench compile`;
    first calls (the compiles) are left out of the timings, as Sinter's are."""
    torch.manual_seed(0)
    with torch.no_grad():
        n = (4 if a.quick else 16) << 20
        x, a_, b_ = torch.randn(n), torch.randn(n), torch.randn(n)
        chain = torch.compile(lambda x, a: F.gelu(x * 1.5 + a, approximate="tanh") * torch.sigmoid(x) + x * 0.5)
        best, med = time_it(lambda: chain(x, a_))
        rows.append(dict(case=f"chain6 f32 {n >> 20}M", best_ms=best, median_ms=med))

        r = 4096 if a.quick else 16384
        m, res, w, b = torch.randn(r, 1024), torch.randn(r, 1024), torch.randn(1024), torch.randn(1024)
        rlg = torch.compile(lambda m, res: F.gelu(F.layer_norm(m + res, (1024,), w, b), approximate="tanh"))
        best, med = time_it(lambda: rlg(m, res))
        rows.append(dict(case=f"residual_layernorm_gelu f32 {r}x1024", best_ms=best, median_ms=med))

        x = torch.randn(512, 1024)
        w1, b1 = torch.randn(4096, 1024) * 0.03, torch.randn(4096)
        w2, b2 = torch.randn(1024, 4096) * 0.015, torch.randn(1024)
        mlp = torch.compile(lambda x: x + F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2))
        best, med = time_it(lambda: mlp(x))
        rows.append(dict(case="mlp f32 512x1024x4096", best_ms=best, median_ms=med))

    c = TINY
    model = GPT(c).eval()
    Dh = c["C"] // c["H"]
    prompt, new = torch.randint(32, 127, (1, 16)), 96
    step = torch.compile(model, dynamic=True)  # the decode step, one graph for every position

    @torch.inference_mode()
    def run():
        caches = [(torch.zeros(1, c["H"], c["positions"], Dh), torch.zeros(1, c["H"], c["positions"], Dh)) for _ in range(c["L"])]
        logits = model(prompt, caches, 0)
        for pos in range(16, 16 + new):
            logits = step(logits[:, -1].argmax(-1, keepdim=True), caches, pos)

    best, med = time_it(run, warmup=2, reps=3 if a.quick else 10, min_total_s=0)
    rows.append(dict(case=f"generate tiny per token ({new} after a 16-token prompt)", best_ms=best / new, median_ms=med / new))

    model = GPT(c)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    fwd = torch.compile(model)
    B, T = 16, 128
    x, y = torch.randint(0, 256, (B, T)), torch.randint(0, 256, (B, T))

    def train_step():
        loss = F.cross_entropy(fwd(x).view(-1, 256), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    train_step()
    print(f"torch.compile: first train step (compile) {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    best, med = time_it(train_step, warmup=2, reps=5 if a.quick else 15, min_total_s=0)
    rows.append(dict(case=f"train tiny step B={B} T={T}", best_ms=best, median_ms=med))


def suite_sweep(a, rows):
    """The shapes of `sinter bench sweep`: PyTorch eager on the attention, linear and row-op rows,
    torch.compile on the compiled blocks (rows carrying their own peer)."""
    torch.manual_seed(0)
    dims = [16, 40, 80, 128] if a.quick else [16, 40, 64, 80, 96, 112, 128, 256]
    lengths = [1, 37, 512] if a.quick else [1, 37, 512, 2048]
    for dt, dname in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        for group in (1, 4):
            for D in dims:
                for L in lengths:
                    for backward in (False, True):
                        if (L == 1 and backward) or (a.quick and (dt == torch.bfloat16 or backward) and L > 37):
                            continue
                        Lkv, Hq = (4096 if L == 1 else L), 8
                        q, do = torch.randn(1, Hq, L, D).to(dt), torch.randn(1, Hq, L, D).to(dt)
                        k, v = torch.randn(1, Hq // group, Lkv, D).to(dt), torch.randn(1, Hq // group, Lkv, D).to(dt)
                        causal = L > 1  # bottom-right for a decode row is the whole cache: no mask
                        kw = dict(enable_gqa=group > 1)

                        def run():
                            if not backward:
                                with torch.no_grad():
                                    F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
                                return
                            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                            F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, **kw).backward(do)

                        work = Hq * L * Lkv * D
                        best, med = time_it(run, 1, 2 if work > 2e9 else 4 if work > 2e8 else 10, 0.2)
                        rows.append(dict(case=f"sdpa {dname} D={D} Lq={L} Lkv={Lkv} {'GQA 4:1' if group > 1 else 'MHA'} "
                                              f"{'fwd+bwd' if backward else 'fwd'}", best_ms=best, median_ms=med))
    kn = [(96, 288), (768, 3072), (1000, 1000)] + ([] if a.quick else [(5120, 13824)])
    with torch.no_grad():
        for dt, dname in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            for K, N in kn:
                w = (torch.randn(N, K) * 0.02).to(dt)
                for M in (1, 3, 17, 64, 333):
                    x = torch.randn(M, K).to(dt)
                    best, med = time_it(lambda: F.linear(x, w), reps=4 if 2 * M * K * N > 2e9 else 15, min_total_s=0.2)
                    rows.append(dict(case=f"linear {dname} M={M} K={K} N={N}", best_ms=best, median_ms=med))
        for r, wd in ((37, 96), (4096, 1000), (16, 50257)):
            x, w, b, t = torch.randn(r, wd), torch.randn(wd), torch.randn(wd), torch.randint(0, wd, (r,))
            for name, f in (("layer_norm", lambda: F.layer_norm(x, (wd,), w, b)), ("rms_norm", lambda: F.rms_norm(x, (wd,), w, 1e-6)),
                            ("softmax", lambda: F.softmax(x, -1)), ("gelu", lambda: F.gelu(x)), ("cross_entropy", lambda: F.cross_entropy(x, t))):
                best, med = time_it(f)
                rows.append(dict(case=f"{name} f32 {r}x{wd}", best_ms=best, median_ms=med))
    x, x3, logits, sq = torch.randn(2048, 768), torch.randn(8, 256, 768), torch.randn(1, 50257), torch.randn(4096, 4096)
    logits4, sq2, xb, wb = torch.randn(4, 50257), torch.randn(2048, 2048), x.bfloat16(), torch.randn(768).bfloat16()
    picks, cols, src = torch.randint(0, 2048, (4096,)), torch.randint(0, 768, (2048, 64)), torch.randn(2048, 64)
    xp = torch.rand(2048, 768) + 0.5
    with torch.no_grad():
        for name, f, reps in (("sum f32 2048x768 dim 1", lambda: x.sum(1), 15), ("sum f32 2048x768 dim 0", lambda: x.sum(0), 15),
                              ("sum f32 8x256x768 dim 1", lambda: x3.sum(1), 15), ("sum f32 2048x768 all", lambda: x.sum(), 15),
                              ("max f32 2048x768 all", lambda: x.max(), 15), ("argmax f32 1x50257", lambda: logits.argmax(-1), 15),
                              ("cumsum f32 2048x768 dim 1", lambda: x.cumsum(1), 15),
                              ("transpose copy f32 4096x4096", lambda: sq.t().contiguous(), 6),
                              ("softmax f32 2048x768 dim 0", lambda: x.softmax(0), 15), ("pow 2 f32 2048x768", lambda: x.pow(2.0), 15),
                              ("clamp f32 2048x768", lambda: x.clamp(-0.5, 0.5), 15), ("silu bf16 2048x768", lambda: F.silu(xb), 15),
                              ("mul bf16 2048x768 by a row", lambda: xb * wb, 15), ("softmax bf16 2048x768", lambda: xb.softmax(-1), 15),
                              ("sum bf16 2048x768 dim 1", lambda: xb.sum(1), 15),
                              ("index_select f32 2048x768 4096 rows", lambda: x.index_select(0, picks), 15),
                              ("gather f32 2048x768 dim 1 64 a row", lambda: x.gather(1, cols), 15),
                              ("scatter_add f32 2048x768 dim 1 64 a row", lambda: x.scatter_add(1, cols, src), 15),
                              ("topk 50 f32 4x50257", lambda: logits4.topk(50), 15), ("tril f32 2048x2048", lambda: sq2.tril(), 15),
                              ("log f32 2048x768", lambda: xp.log(), 15),
                              ("sin f32 2048x768", lambda: x.sin(), 15), ("cos f32 2048x768", lambda: x.cos(), 15),
                              ("logsumexp f32 2048x768 dim 1", lambda: torch.logsumexp(x, 1), 15),
                              ("randn f32 1M", lambda: torch.randn(1024, 1024), 15),
                              ("randint i64 1M", lambda: torch.randint(0, 1000, (1024, 1024)), 15),
                              ("arange i64 1M", lambda: torch.arange(1 << 20), 15)):
            best, med = time_it(f, 1 if reps < 15 else 3, reps, 0.2 if reps < 15 else 0.3)
            rows.append(dict(case=name, best_ms=best, median_ms=med))
    w, idx, dy = torch.randn(50257, 768, requires_grad=True), torch.randint(0, 50257, (8, 256)), torch.randn(8, 256, 768)
    best, med = time_it(lambda: F.embedding(idx, w).backward(dy), 1, 6, 0.2)
    rows.append(dict(case="embedding fwd+bwd f32 50257x768 8x256", best_ms=best, median_ms=med))
    xg, lw, lb = x.clone().requires_grad_(), torch.randn(768, requires_grad=True), torch.randn(768, requires_grad=True)
    best, med = time_it(lambda: F.layer_norm(xg, (768,), lw, lb).backward(x))
    rows.append(dict(case="layer_norm fwd+bwd f32 2048x768", best_ms=best, median_ms=med))
    compiled = f"torch.compile, PyTorch {torch.__version__}"
    for llama in (True, False):
        for d, heads, kv, T, B in [(96, 6, 2, 37, 3)] + ([] if a.quick else [(512, 8, 2, 128, 4), (1024, 16, 4, 512, 1)]):
            blk = SweepBlock(llama, d, heads, kv if llama else heads, T)
            x, dy = torch.randn(B, T, d), torch.randn(B, T, d)
            torch._dynamo.reset()  # each block its own compile: no recompile limit reached, no fallback to eager
            f = torch.compile(blk)
            base = f"compiled {'llama' if llama else 'gpt2'} block d={d} T={T} B={B}"
            with torch.no_grad():
                best, med = time_it(lambda: f(x), warmup=2, reps=8, min_total_s=0.2)
            rows.append(dict(case=base + " fwd", best_ms=best, median_ms=med, peer=compiled))
            best, med = time_it(lambda: (f(x) * dy).sum().backward(), warmup=2, reps=6, min_total_s=0.2)
            rows.append(dict(case=base + " fwd+bwd", best_ms=best, median_ms=med, peer=compiled))


class SweepBlock(nn.Module):
    """Sinter's TransformerBlock: LLaMA (RMSNorm, rotary, GQA, SwiGLU, no biases) or GPT-2
    (LayerNorm, biases, tanh-GELU MLP), pre-norm with residuals."""

    def __init__(self, llama, d, heads, kv_heads, T):
        super().__init__()
        self.llama, self.H, self.Hkv, self.Dh = llama, heads, kv_heads, d // heads
        inner = (d * 8 // 3 + 31) // 32 * 32 if llama else 4 * d
        norm = (lambda: nn.RMSNorm(d, eps=1e-5)) if llama else (lambda: nn.LayerNorm(d, eps=1e-5))
        self.norm1, self.norm2 = norm(), norm()
        bias = not llama
        self.q, self.k, self.v = nn.Linear(d, d, bias), nn.Linear(d, kv_heads * self.Dh, bias), nn.Linear(d, kv_heads * self.Dh, bias)
        self.o = nn.Linear(d, d, bias)
        if llama:
            self.gate, self.up, self.down = nn.Linear(d, inner, False), nn.Linear(d, inner, False), nn.Linear(inner, d, False)
        else:
            self.fc, self.proj = nn.Linear(d, inner), nn.Linear(inner, d)
        inv = 1.0 / (10000.0 ** (torch.arange(0, self.Dh, 2).float() / self.Dh))
        ang = torch.outer(torch.arange(T).float(), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def rope(self, t):
        a, b = t[..., : self.Dh // 2], t[..., self.Dh // 2:]
        return torch.cat([a * self.cos - b * self.sin, b * self.cos + a * self.sin], -1)

    def forward(self, x):
        B, T, C = x.shape
        h = self.norm1(x)
        q = self.q(h).view(B, T, self.H, self.Dh).transpose(1, 2)
        k = self.k(h).view(B, T, self.Hkv, self.Dh).transpose(1, 2)
        v = self.v(h).view(B, T, self.Hkv, self.Dh).transpose(1, 2)
        if self.llama:
            q, k = self.rope(q), self.rope(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.Hkv != self.H)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        h = self.norm2(x)
        if self.llama:
            return x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x + self.proj(F.gelu(self.fc(h), approximate="tanh"))


GPT2_124M = dict(vocab=50257, positions=1024, C=768, L=12, H=12, inner=3072, eps=1e-5)


def cuda_sizes(a):
    """What `sinter bench cuda` times (bench/suite_cuda.cpp's Sizes): the issues' sizes on a GPU;
    with --dry-run the emulator's tiny ones on the CPU, one call per row, so that the script can be
    run where there is no GPU (its times then mean nothing; CUDA-only backends give no row)."""
    if a.dry_run:
        return dict(gemm_m=[1, 16], gemm_kn=[(64, 64), (64, 96)], elementwise_n=4096, attn=(1, 2, 64), attn_s=[64],
                    decode=(128, 4, 2), sparse_m=[1, 16], sparse_kn=[(64, 64), (128, 64)], model=TINY, model_name="tiny",
                    train=(2, 32), new_tokens=4, once=True, vocab=300)
    return dict(gemm_m=[1, 1024] if a.quick else [1, 16, 128, 1024, 4096], gemm_kn=[(4096, 4096), (4096, 11008)],
                elementwise_n=1 << 29, attn=(4, 32, 128), attn_s=[1024] if a.quick else [1024, 4096, 16384],
                decode=(8192, 32, 8), sparse_m=[1, 4096] if a.quick else [1, 16, 128, 1024, 4096, 16384],
                sparse_kn=[(4096, 4096), (4096, 11008), (8192, 28672)], model=GPT2_124M, model_name="gpt2-124m",
                train=(16, 1024), new_tokens=256, once=False, vocab=50257)


def bytes_label(n):
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 10} KiB"


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def empty_cache(dev):
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def gpu_time(z, dev, f, n, reps=9):
    """f run n times, then the queue drained: per-call ms."""
    if z["once"]:
        n = 1

    def many():
        for _ in range(n):
            f()
        sync(dev)
    best, med = time_it(many, warmup=0 if z["once"] else 2, reps=1 if z["once"] else reps, min_total_s=0 if z["once"] else 0.2)
    return best / n, med / n


def attention_cuda(z, rows, dev):
    """Causal bf16 SDPA (B=4, H=32, D=128 on a GPU) through each of PyTorch's fused backends (each its
    own peer; a backend that refuses the shape gives no row), and a GQA decode step."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, H, D = z["attn"]
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    for S in z["attn_s"]:
        q, k, v, g = (torch.randn(B, H, S, D, device=dev).bfloat16() for _ in range(4))
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        n = 2 if S >= 16384 else 5 if S >= 4096 else 20
        name = f"cuda sdpa causal bf16 B={B} H={H} S={S} D={D}"
        for label, be in backends:
            peer = f"PyTorch {torch.__version__}, {label} attention"
            try:
                with sdpa_kernel(be):
                    with torch.no_grad():
                        best, med = gpu_time(z, dev, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), n, 5)
                    rows.append(dict(case=name + " forward", best_ms=best, median_ms=med, peer=peer))
                    best, med = gpu_time(z, dev, lambda: torch.autograd.grad(
                        F.scaled_dot_product_attention(qg, kg, vg, is_causal=True), (qg, kg, vg), g), n, 5)
                    rows.append(dict(case=name + " forward+backward", best_ms=best, median_ms=med, peer=peer))
            except RuntimeError:
                continue
        del q, k, v, g, qg, kg, vg
    L, Hq, Hkv = z["decode"]
    q = torch.randn(1, Hq, 1, D, device=dev).bfloat16()
    k, v = (torch.randn(1, Hkv, L, D, device=dev).bfloat16() for _ in range(2))
    with torch.no_grad():
        best, med = gpu_time(z, dev, lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), 50)
    rows.append(dict(case=f"cuda sdpa decode bf16 Lq=1 cache={L} GQA {Hq}:{Hkv} D={D}", best_ms=best, median_ms=med,
                     peer=f"PyTorch {torch.__version__}, its best attention"))
    empty_cache(dev)


def sparse_cuda(z, rows, dev):
    """bf16 2:4 linear layers through PyTorch's to_sparse_semi_structured (cuSPARSELt; its CUTLASS
    path refuses sm90), as the peer of Sinter's 2:4 rows."""
    from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured
    SparseSemiStructuredTensor._FORCE_CUTLASS = False
    peer = f"PyTorch {torch.__version__}, to_sparse_semi_structured"
    with torch.no_grad():
        for K, N in z["sparse_kn"]:
            w = torch.randn(N, K, device=dev).bfloat16() * 0.02
            keep = w.abs().view(N, K // 4, 4).topk(2, dim=-1).indices
            mask = torch.zeros(N, K // 4, 4, device=dev, dtype=torch.bool).scatter_(-1, keep, True).view(N, K)
            try:
                ws = to_sparse_semi_structured(w * mask)
            except (RuntimeError, ValueError, NotImplementedError):
                continue
            for M in z["sparse_m"]:
                x = torch.randn(M, K, device=dev).bfloat16()
                try:
                    best, med = gpu_time(z, dev, lambda: F.linear(x, ws), 3 if M >= 4096 else 20, 5)
                except (RuntimeError, ValueError, NotImplementedError):
                    continue
                rows.append(dict(case=f"cuda 2:4 linear bf16 M={M} K={K} N={N}", best_ms=best, median_ms=med, peer=peer))
            del w, ws
    empty_cache(dev)


def train_cuda(a, z, rows, dev):
    """The training step three ways: math attention (as Sinter's), PyTorch's best attention and
    torch.compile (not in --quick or --dry-run)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    c = z["model"]
    (B, T), V = z["train"], c["vocab"]
    model = GPT(c).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    xs, ys = torch.randint(0, V, (B, T), device=dev), torch.randint(0, V, (B, T), device=dev)

    def step(m):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(m(xs).float().view(-1, V), ys.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    case = f"cuda train bf16 {z['model_name']} B={B} T={T} step"
    warmup, reps = (0, 1) if z["once"] else (2, 3 if a.quick else 8)
    with sdpa_kernel(SDPBackend.MATH):
        best, med = time_it(lambda: step(model), warmup=warmup, reps=reps, min_total_s=0)
    rows.append(dict(case=case, best_ms=best, median_ms=med, peer=f"PyTorch {torch.__version__}, math attention"))
    best, med = time_it(lambda: step(model), warmup=warmup, reps=reps, min_total_s=0)
    rows.append(dict(case=case, best_ms=best, median_ms=med, peer=f"PyTorch {torch.__version__}, its best attention"))
    if not a.quick and not z["once"]:
        compiled = torch.compile(model)
        best, med = time_it(lambda: step(compiled), warmup=3, reps=reps, min_total_s=0)
        rows.append(dict(case=case, best_ms=best, median_ms=med, peer=f"torch.compile, PyTorch {torch.__version__}"))
    del opt, model
    empty_cache(dev)


def generate_cuda(z, rows, dev):
    """Greedy generation at batch 1 with a preallocated bf16 KV cache, each token read on the host."""
    c, new = z["model"], z["new_tokens"]
    model = GPT(c).eval().to(dev).bfloat16()
    Dh = c["C"] // c["H"]
    prompt = torch.randint(0, c["vocab"], (1, 16), device=dev)

    @torch.inference_mode()
    def run():
        caches = [(torch.zeros(1, c["H"], c["positions"], Dh, dtype=torch.bfloat16, device=dev),
                   torch.zeros(1, c["H"], c["positions"], Dh, dtype=torch.bfloat16, device=dev)) for _ in range(c["L"])]
        logits = model(prompt, caches, 0)
        pos = prompt.shape[1]
        for _ in range(new):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            int(nxt)  # the token reaches the host, as a generator streaming text needs
            logits = model(nxt, caches, pos)
            pos += 1

    best, med = time_it(run, warmup=0 if z["once"] else 1, reps=1 if z["once"] else 3, min_total_s=0)
    rows.append(dict(case=f"cuda generate bf16 {z['model_name']} batch=1 {new} tokens (per token)", best_ms=best / new,
                     median_ms=med / new))


def sampling_cuda(z, rows, dev):
    """A token drawn with top-k and top-p as Hugging Face's warpers do (topk, or a sort of the whole
    row; softmax, cumsum, the tail masked; multinomial), its id read on the host."""
    logits = torch.randn(z["vocab"], device=dev) * 3

    def draw(k, p):
        scaled = logits / 0.8
        vals, idx = torch.topk(scaled, k) if k else torch.sort(scaled, descending=True)
        probs = torch.softmax(vals, -1)
        vals = vals.masked_fill(torch.cumsum(probs, -1) - probs >= p, float("-inf"))
        return int(idx[torch.multinomial(torch.softmax(vals, -1), 1)])

    vocab = f" vocab={z['vocab']} (per token)"
    for name, k in [("cuda sample top-k 50 top-p 0.9" + vocab, 50), ("cuda sample top-p 0.9" + vocab, 0)]:
        best, med = gpu_time(z, dev, lambda: draw(k, 0.9), 20)
        rows.append(dict(case=name, best_ms=best, median_ms=med))


def suite_cuda(a, rows):
    """`sinter bench cuda` on the same GPU: bf16 GEMMs, 1 GiB elementwise, attention, 2:4 layers, the
    gpt2-124m training step (math attention as Sinter's; also PyTorch's best attention and
    torch.compile as their own peers), greedy generation of 256 tokens, top-k/top-p draws."""
    z = cuda_sizes(a)
    dev = torch.device("cpu" if a.dry_run else "cuda")
    torch.manual_seed(0)
    with torch.no_grad():
        for K, N in z["gemm_kn"]:
            w = (torch.randn(K, N, device=dev) * 0.02).bfloat16()
            for M in z["gemm_m"]:
                x = torch.randn(M, K, device=dev).bfloat16()
                best, med = gpu_time(z, dev, lambda: torch.matmul(x, w), 20 if M >= 1024 else 100)
                rows.append(dict(case=f"cuda matmul bf16 M={M} K={K} N={N}", best_ms=best, median_ms=med))
        n = z["elementwise_n"]
        x, y = torch.randn(n, device=dev).bfloat16(), torch.randn(n, device=dev).bfloat16()
        size = bytes_label(2 * n)
        for name, f in [(f"cuda add bf16 {size}", lambda: torch.add(x, y)), (f"cuda gelu bf16 {size}", lambda: F.gelu(x))]:
            best, med = gpu_time(z, dev, f, 3, 7)
            rows.append(dict(case=name, best_ms=best, median_ms=med))
        del x, y
    attention_cuda(z, rows, dev)
    sparse_cuda(z, rows, dev)
    train_cuda(a, z, rows, dev)
    generate_cuda(z, rows, dev)
    sampling_cuda(z, rows, dev)


SUITES = dict(cuda=suite_cuda, compile=suite_compile, ops=suite_ops, linear=suite_linear, train=suite_train, generate=suite_generate, attention=suite_attention,
              sparse=suite_sparse, sweep=suite_sweep)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("suite", choices=sorted(SUITES))
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="cuda: tiny sizes on the CPU, one call per row (the script runs)")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    rows = []
    SUITES[a.suite](a, rows)
    with open(a.json, "w") as f:
        json.dump(dict(peer=f"{'torch.compile, ' if a.suite == 'compile' else ''}PyTorch {torch.__version__}", threads=torch.get_num_threads(), rows=rows), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
