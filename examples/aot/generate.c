/* Greedy text generation with an exported model, in C against libsinter_rt alone:
 *   generate DIR (--ids 84,104,101 | --prompt TEXT) [--max-new-tokens N]
 * runs `prefill` on the prompt, then `decode` one token at a time (the KV cache is the session's
 * state), and prints the ids, prompt first, as `sinter generate --ids ... --temperature 0` does
 * (with --prompt, a byte-level model's text). When the window of max positions fills, it slides
 * forward by half and prefills again, as `sinter generate` does. The stop test is the caller's:
 * here, the token count. */
#include <sinter/sinter_rt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char* what) {
  fprintf(stderr, "error: %s: %s\n", what, sinter_rt_last_error());
  exit(2);
}

/* The largest logit of the last position (the first of equal ones). */
static int64_t argmax_last(const sinter_rt_tensor* logits) {
  const int64_t V = logits->shape[logits->rank - 1], rows = logits->shape[logits->rank - 2];
  int64_t best = 0;
  float top = 0;
  for (int64_t j = 0; j < V; ++j) {
    const int64_t at = (rows - 1) * V + j;
    float x;
    if (logits->dtype == SINTER_RT_BF16) {
      const uint32_t bits = (uint32_t)((const uint16_t*)logits->data)[at] << 16;
      memcpy(&x, &bits, 4);
    } else {
      x = ((const float*)logits->data)[at];
    }
    if (j == 0 || x > top) top = x, best = j;
  }
  return best;
}

/* Runs `graph` on tokens[0..n) and returns the next token. */
static int64_t step(sinter_rt_session* s, const char* graph, const int64_t* tokens, int64_t n) {
  sinter_rt_tensor in = {(void*)tokens, SINTER_RT_I64, 2, {1, n}, 0};
  sinter_rt_tensor out = {0};
  if (sinter_rt_run(s, graph, &in, 1, &out, 1) != 0) die(graph);
  return argmax_last(&out);
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s DIR (--ids I,J,.. | --prompt TEXT) [--max-new-tokens N]\n", argv[0]);
    return 2;
  }
  int64_t max_new = 20, count = 0, cap = 1024;
  int64_t* ids = malloc(sizeof(int64_t) * (size_t)cap);
  int text = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--max-new-tokens")) max_new = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--prompt")) {
      text = 1;
      for (const char* c = argv[i + 1]; *c && count < cap; ++c) ids[count++] = (unsigned char)*c;
    } else if (!strcmp(argv[i], "--ids")) {
      for (char* tok = strtok(argv[i + 1], ","); tok && count < cap; tok = strtok(NULL, ",")) ids[count++] = atoll(tok);
    }
  }
  if (count == 0) {
    fprintf(stderr, "error: an empty prompt\n");
    return 2;
  }
  sinter_rt_model* model = sinter_rt_load(argv[1]);
  if (!model) die("load");
  sinter_rt_tensor_info info;
  if (sinter_rt_input_info(model, "prefill", 0, &info) != 0) die("prefill");
  const int64_t limit = info.max[1];  /* the longest window prefill takes */
  sinter_rt_session* s = sinter_rt_session_new(model);
  if (!s) die("session");
  ids = realloc(ids, sizeof(int64_t) * (size_t)(count + max_new));
  int64_t start = count > limit ? count - limit : 0;
  int64_t next = step(s, "prefill", ids + start, count - start);
  for (int64_t i = 0; i < max_new; ++i) {
    ids[count++] = next;
    if (i + 1 == max_new) break;
    if (count - start > limit) {
      start = count - limit / 2;
      if (sinter_rt_session_reset(s) != 0) die("reset");
      next = step(s, "prefill", ids + start, count - start);
    } else {
      next = step(s, "decode", &ids[count - 1], 1);
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    if (text) putchar((int)ids[i]);
    else printf(i ? ",%lld" : "%lld", (long long)ids[i]);
  }
  putchar('\n');
  sinter_rt_session_free(s);
  sinter_rt_model_free(model);
  free(ids);
  return 0;
}
