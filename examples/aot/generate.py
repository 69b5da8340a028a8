#!/usr/bin/env python3
"""Greedy generation with an exported model through libsinter_rt's C ABI, standard library only:

    generate.py DIR --ids 84,104,101 [--max-new-tokens N] [--lib path/to/libsinter_rt.so.1]

Prefill on the prompt, then the decode step with the session's KV cache; prints the ids, prompt
first, as `sinter generate --ids ... --temperature 0` does (the same loop as generate.c, window
slide included)."""
import argparse
import ctypes as C
import sys

MAX_RANK = 8
I64, F32, BF16 = 7, 0, 3


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("rank", C.c_int32),
                ("shape", C.c_int64 * MAX_RANK), ("capacity", C.c_size_t)]


class Info(C.Structure):
    _fields_ = [("name", C.c_char_p), ("dtype", C.c_int), ("rank", C.c_int32),
                ("min", C.c_int64 * MAX_RANK), ("max", C.c_int64 * MAX_RANK),
                ("dim_name", C.c_char_p * MAX_RANK)]


def open_runtime(path):
    rt = C.CDLL(path)
    rt.sinter_rt_last_error.restype = C.c_char_p
    rt.sinter_rt_load.restype = C.c_void_p
    rt.sinter_rt_load.argtypes = [C.c_char_p]
    rt.sinter_rt_session_new.restype = C.c_void_p
    rt.sinter_rt_session_new.argtypes = [C.c_void_p]
    rt.sinter_rt_session_reset.argtypes = [C.c_void_p]
    rt.sinter_rt_session_free.argtypes = [C.c_void_p]
    rt.sinter_rt_model_free.argtypes = [C.c_void_p]
    rt.sinter_rt_input_info.argtypes = [C.c_void_p, C.c_char_p, C.c_int, C.POINTER(Info)]
    rt.sinter_rt_run.argtypes = [C.c_void_p, C.c_char_p, C.POINTER(Tensor), C.c_int, C.POINTER(Tensor), C.c_int]
    return rt


def fail(rt, what):
    sys.exit(f"error: {what}: {rt.sinter_rt_last_error().decode()}")


def step(rt, session, graph, tokens):
    """Runs `graph` on tokens and returns the argmax of the last position's logits."""
    ids = (C.c_int64 * len(tokens))(*tokens)
    inp = Tensor(C.cast(ids, C.c_void_p), I64, 2, (C.c_int64 * MAX_RANK)(1, len(tokens)), 0)
    out = Tensor()
    if rt.sinter_rt_run(session, graph.encode(), C.byref(inp), 1, C.byref(out), 1) != 0:
        fail(rt, graph)
    vocab, rows = out.shape[out.rank - 1], out.shape[out.rank - 2]
    if out.dtype == BF16:
        bits = C.cast(out.data, C.POINTER(C.c_uint16))
        row = [C.cast(C.pointer(C.c_uint32(bits[(rows - 1) * vocab + j] << 16)), C.POINTER(C.c_float))[0] for j in range(vocab)]
    else:
        p = C.cast(out.data, C.POINTER(C.c_float))
        row = p[(rows - 1) * vocab:rows * vocab]
    return max(range(vocab), key=lambda j: (row[j], -j))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--ids", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=20)
    ap.add_argument("--lib", default="libsinter_rt.so.1")
    a = ap.parse_args()
    rt = open_runtime(a.lib)
    model = rt.sinter_rt_load(a.dir.encode())
    if not model:
        fail(rt, "load")
    info = Info()
    if rt.sinter_rt_input_info(model, b"prefill", 0, C.byref(info)) != 0:
        fail(rt, "prefill")
    limit = info.max[1]
    session = rt.sinter_rt_session_new(model)
    ids = [int(x) for x in a.ids.split(",")]
    start = max(0, len(ids) - limit)
    nxt = step(rt, session, "prefill", ids[start:])
    for i in range(a.max_new_tokens):
        ids.append(nxt)
        if i + 1 == a.max_new_tokens:
            break
        if len(ids) - start > limit:
            start = len(ids) - limit // 2
            rt.sinter_rt_session_reset(session)
            nxt = step(rt, session, "prefill", ids[start:])
        else:
            nxt = step(rt, session, "decode", ids[-1:])
    print(",".join(map(str, ids)))
    rt.sinter_rt_session_free(session)
    rt.sinter_rt_model_free(model)


if __name__ == "__main__":
    main()
