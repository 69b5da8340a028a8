// The C ABI (include/sinter/sinter_rt.h) over the runtime's Model and Session: every entry catches
// what the C++ side throws and leaves its message for sinter_rt_last_error.
#include "sinter/sinter_rt.h"

#include <cstring>
#include <string>

#include "runtime/runtime.h"

struct sinter_rt_model {
  std::unique_ptr<sinter::runtime::Model> m;
};
struct sinter_rt_session {
  std::unique_ptr<sinter::runtime::Session> s;
};

namespace {

using namespace sinter;
using namespace sinter::runtime;

thread_local std::string g_error;

template <class F> auto guarded(F&& f, decltype(f()) failed) noexcept -> decltype(f()) {
  try {
    g_error.clear();
    return f();
  } catch (const std::exception& e) {
    g_error = e.what();
  } catch (...) {
    g_error = "unknown error";
  }
  return failed;
}

static_assert(int(DType::f32) == SINTER_RT_F32 && int(DType::f64) == SINTER_RT_F64 && int(DType::f16) == SINTER_RT_F16 &&
              int(DType::bf16) == SINTER_RT_BF16 && int(DType::i8) == SINTER_RT_I8 && int(DType::u8) == SINTER_RT_U8 &&
              int(DType::i32) == SINTER_RT_I32 && int(DType::i64) == SINTER_RT_I64 && int(DType::boolean) == SINTER_RT_BOOL);

const GraphProgram& graph_of(const sinter_rt_model* model, const char* name) {
  SINTER_CHECK(model != nullptr && name != nullptr, "[sinter_rt] no model or graph name given");
  const int g = model->m->graph_index(name);
  SINTER_CHECK(g >= 0, "[sinter_rt] the model has no graph '", name, "'");
  return model->m->program.graphs[size_t(g)];
}

int info(const std::vector<TensorSpec>& specs, int i, sinter_rt_tensor_info* out) {
  SINTER_CHECK(out != nullptr && i >= 0 && size_t(i) < specs.size(), "[sinter_rt] no tensor ", i, " (the graph has ", specs.size(), ")");
  const TensorSpec& s = specs[size_t(i)];
  std::memset(out, 0, sizeof *out);
  out->name = s.name.c_str();
  out->dtype = sinter_rt_dtype(s.dtype);
  out->rank = int32_t(s.dims.size());
  for (size_t d = 0; d < s.dims.size(); ++d)
    out->min[d] = s.dims[d].min, out->max[d] = s.dims[d].max, out->dim_name[d] = s.dims[d].name.c_str();
  return 0;
}

HostTensor host(const sinter_rt_tensor& t) {
  SINTER_CHECK(t.rank >= 0 && t.rank <= SINTER_RT_MAX_RANK, "[sinter_rt] a tensor's rank must be 0..", SINTER_RT_MAX_RANK, ", got ", t.rank);
  SINTER_CHECK(int(t.dtype) >= 0 && int(t.dtype) < kNumDTypes, "[sinter_rt] unknown dtype ", int(t.dtype));
  return {t.data, DType(t.dtype), Shape(t.shape, t.shape + t.rank), t.capacity};
}

}  // namespace

extern "C" {

int sinter_rt_abi_version(void) { return SINTER_RT_ABI_VERSION; }
const char* sinter_rt_last_error(void) { return g_error.c_str(); }

sinter_rt_model* sinter_rt_load(const char* dir) {
  return guarded([&] {
    SINTER_CHECK(dir != nullptr, "[sinter_rt] no folder given");
    return new sinter_rt_model{load_model(dir)};
  }, (sinter_rt_model*)nullptr);
}
void sinter_rt_model_free(sinter_rt_model* model) { delete model; }

int sinter_rt_graph_count(const sinter_rt_model* model) { return model ? int(model->m->program.graphs.size()) : 0; }
const char* sinter_rt_graph_name(const sinter_rt_model* model, int graph) {
  if (!model || graph < 0 || size_t(graph) >= model->m->program.graphs.size()) return nullptr;
  return model->m->program.graphs[size_t(graph)].name.c_str();
}
int sinter_rt_num_inputs(const sinter_rt_model* model, const char* graph) {
  return guarded([&] { return int(graph_of(model, graph).inputs.size()); }, -1);
}
int sinter_rt_num_outputs(const sinter_rt_model* model, const char* graph) {
  return guarded([&] { return int(graph_of(model, graph).outputs.size()); }, -1);
}
int sinter_rt_input_info(const sinter_rt_model* model, const char* graph, int i, sinter_rt_tensor_info* out) {
  return guarded([&] { return info(graph_of(model, graph).inputs, i, out); }, -1);
}
int sinter_rt_output_info(const sinter_rt_model* model, const char* graph, int i, sinter_rt_tensor_info* out) {
  return guarded([&] { return info(graph_of(model, graph).outputs, i, out); }, -1);
}

sinter_rt_session* sinter_rt_session_new(const sinter_rt_model* model) {
  return guarded([&] {
    SINTER_CHECK(model != nullptr, "[sinter_rt] no model given");
    return new sinter_rt_session{std::make_unique<Session>(*model->m)};
  }, (sinter_rt_session*)nullptr);
}
void sinter_rt_session_free(sinter_rt_session* session) { delete session; }
int sinter_rt_session_reset(sinter_rt_session* session) {
  return guarded([&] {
    SINTER_CHECK(session != nullptr, "[sinter_rt] no session given");
    session->s->reset();
    return 0;
  }, -1);
}

int sinter_rt_run(sinter_rt_session* session, const char* graph, const sinter_rt_tensor* inputs, int num_inputs, sinter_rt_tensor* outputs,
                  int num_outputs) {
  return guarded([&] {
    SINTER_CHECK(session != nullptr && graph != nullptr, "[sinter_rt] no session or graph given");
    SINTER_CHECK(num_inputs >= 0 && num_outputs >= 0 && (inputs || !num_inputs) && (outputs || !num_outputs),
                 "[sinter_rt] inputs or outputs missing");
    std::vector<HostTensor> in, out;
    for (int i = 0; i < num_inputs; ++i) in.push_back(host(inputs[i]));
    for (int i = 0; i < num_outputs; ++i) {
      out.push_back({outputs[i].data, DType::f32, {}, outputs[i].data ? outputs[i].capacity : 0});
    }
    session->s->run(graph, in, out);
    for (int i = 0; i < num_outputs; ++i) {
      const HostTensor& h = out[size_t(i)];
      SINTER_CHECK(h.shape.size() <= SINTER_RT_MAX_RANK, "[sinter_rt] output ", i, " has more than ", SINTER_RT_MAX_RANK, " dims");
      outputs[i].data = h.data;
      outputs[i].dtype = sinter_rt_dtype(h.dtype);
      outputs[i].rank = int32_t(h.shape.size());
      for (size_t d = 0; d < h.shape.size(); ++d) outputs[i].shape[d] = h.shape[d];
      outputs[i].capacity = h.capacity;
    }
    return 0;
  }, -1);
}

}  // extern "C"
