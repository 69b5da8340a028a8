/* The Sinter runtime's C ABI (libsinter_rt): runs a model that `sinter export` (or
 * sinter::aot::export_graph) wrote to a folder: model.so, weights.safetensors, manifest.json.
 *
 * A model is immutable once loaded and may be shared by any number of threads. A session holds
 * what one stream of calls owns (the model's state, such as a KV cache, and its working memory):
 * one session per thread at a time. Every function reports failure by its return value (NULL or
 * nonzero) and leaves a message for sinter_rt_last_error() on the calling thread.
 *
 * Inputs are checked on every call: rank, dtype, and each dim against the range exported
 * (`--dynamic seq=1..128`); a mismatch names the input, the dim and the range. Plain C, no
 * compiler needed at load or run; only sinter_rt_* symbols are exported. */
#ifndef SINTER_RT_H
#define SINTER_RT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes. sinter_rt_load refuses a model exported for another. */
#define SINTER_RT_ABI_VERSION 1
#define SINTER_RT_MAX_RANK 8

typedef enum {
  SINTER_RT_F32 = 0,
  SINTER_RT_F64 = 1,
  SINTER_RT_F16 = 2,
  SINTER_RT_BF16 = 3,
  SINTER_RT_I8 = 4,
  SINTER_RT_U8 = 5,
  SINTER_RT_I32 = 6,
  SINTER_RT_I64 = 7,
  SINTER_RT_BOOL = 8
} sinter_rt_dtype;

typedef struct sinter_rt_model sinter_rt_model;
typedef struct sinter_rt_session sinter_rt_session;

/* A dense, row-major tensor the caller passes in or gets back. For an output, data == NULL asks
 * the runtime for the buffer (it sets data, valid until the session's next run or its end);
 * otherwise data is the caller's, of at least `capacity` bytes. The runtime sets an output's
 * rank and shape. */
typedef struct {
  void* data;
  sinter_rt_dtype dtype;
  int32_t rank;
  int64_t shape[SINTER_RT_MAX_RANK];
  size_t capacity; /* outputs the caller allocates: the buffer's bytes */
} sinter_rt_tensor;

/* What an input or output of a graph takes: per dim, the smallest and largest size (equal for a
 * fixed dim); dim_name[i] names a dynamic dim ("seq"), or is "" for a fixed one. */
typedef struct {
  const char* name;
  sinter_rt_dtype dtype;
  int32_t rank;
  int64_t min[SINTER_RT_MAX_RANK];
  int64_t max[SINTER_RT_MAX_RANK];
  const char* dim_name[SINTER_RT_MAX_RANK];
} sinter_rt_tensor_info;

int sinter_rt_abi_version(void);
/* The last error on this thread ("" after a success). */
const char* sinter_rt_last_error(void);

/* Loads an exported folder: checks the manifest's ABI version, the CPU's ISA level and every
 * file's SHA-256, maps the weights. NULL on failure. Spawns no process. */
sinter_rt_model* sinter_rt_load(const char* dir);
void sinter_rt_model_free(sinter_rt_model* model);

/* The graphs a model has ("forward", "prefill", "decode", ...) and their signatures. */
int sinter_rt_graph_count(const sinter_rt_model* model);
const char* sinter_rt_graph_name(const sinter_rt_model* model, int graph);
int sinter_rt_num_inputs(const sinter_rt_model* model, const char* graph);   /* -1: no such graph */
int sinter_rt_num_outputs(const sinter_rt_model* model, const char* graph);  /* -1: no such graph */
int sinter_rt_input_info(const sinter_rt_model* model, const char* graph, int i, sinter_rt_tensor_info* out);
int sinter_rt_output_info(const sinter_rt_model* model, const char* graph, int i, sinter_rt_tensor_info* out);

/* A session: the model's state (as exported) and working memory. */
sinter_rt_session* sinter_rt_session_new(const sinter_rt_model* model);
void sinter_rt_session_free(sinter_rt_session* session);
/* Puts the state back to its exported values (a new conversation). */
int sinter_rt_session_reset(sinter_rt_session* session);

/* Runs one graph: inputs in the graph's order, outputs filled (see sinter_rt_tensor). 0 on success. */
int sinter_rt_run(sinter_rt_session* session, const char* graph, const sinter_rt_tensor* inputs, int num_inputs,
                  sinter_rt_tensor* outputs, int num_outputs);

#ifdef __cplusplus
}
#endif

#endif /* SINTER_RT_H */
