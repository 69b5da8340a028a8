#!/usr/bin/env python3
"""Makes the Hugging Face reference checkpoints under tests/data/hf/ (run by hand where PyPI's
`transformers` and `torch` are installed; the build and tests never need them):

  python3 scripts/hf_reference.py [OUT_DIR]        default tests/data/hf

Small random GPT2LMHeadModel and LlamaForCausalLM (grouped-query attention) models, written with
save_pretrained in f32 and bf16 (the LLaMA f32 one sharded), and a MistralForCausalLM whose
4-token sliding window is shorter than the prompt, each with ref.safetensors: input ids,
the logits computed in f32 from the saved weights, and 8 greedy tokens.

  python3 scripts/hf_reference.py --check DIR REF_DIR   loads DIR (e.g. a `sinter export-hf`
  output) with transformers and compares its logits with REF_DIR's reference.
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

IDS = torch.tensor([[84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114, 111, 119, 110, 32]])


def reference(model):
    model = model.float().eval()
    with torch.no_grad():
        logits = model(IDS).logits
        ids = IDS
        for _ in range(8):
            nxt = model(ids).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
    return {"input_ids": IDS.clone(), "logits": logits.contiguous(), "greedy": ids[:, IDS.shape[1]:].contiguous()}


def make(out):
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=88, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         rope_theta=10000.0, tie_word_embeddings=False))
    mistral = MistralForCausalLM(MistralConfig(vocab_size=256, hidden_size=32, intermediate_size=88, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                               sliding_window=4, tie_word_embeddings=False))
    for model in (gpt2, llama, mistral):  # weights of a trained size, not the init's near-zero ones
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.3 if p.dim() > 1 else 0.1).add_(1.0 if p.dim() == 1 and p.shape[0] == 32 else 0.0)
    for name, model, dtype, shard in (("gpt2-f32", gpt2, torch.float32, None), ("gpt2-bf16", gpt2, torch.bfloat16, None),
                                      ("llama-f32", llama, torch.float32, "40KB"), ("llama-bf16", llama, torch.bfloat16, None),
                                      ("mistral-f32", mistral, torch.float32, None)):
        d = os.path.join(out, name)
        m = type(model)(model.config)
        m.load_state_dict(model.state_dict())
        m = m.to(dtype)
        m.save_pretrained(d, max_shard_size=shard or "1GB", safe_serialization=True)
        loaded = type(model).from_pretrained(d, torch_dtype=dtype)  # what the files hold, as they hold it
        save_file(reference(loaded), os.path.join(d, "ref.safetensors"))
        print(name, "->", d, sorted(os.listdir(d)))


def check(d, ref_dir):
    ref = load_file(os.path.join(ref_dir, "ref.safetensors"))
    cfg = open(os.path.join(d, "config.json")).read()
    cls = MistralForCausalLM if "Mistral" in cfg else LlamaForCausalLM if "Llama" in cfg else GPT2LMHeadModel
    got = reference(cls.from_pretrained(d))
    err = ((got["logits"] - ref["logits"]).norm() / ref["logits"].norm()).item()
    same = torch.equal(got["greedy"], ref["greedy"])
    print(f"{d}: logits relative error {err:.2e} against {ref_dir}, greedy tokens {'identical' if same else 'DIFFERENT'}")
    return err < 1e-5 and same


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        sys.exit(0 if check(sys.argv[2], sys.argv[3]) else 1)
    make(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "hf"))
