/* The worst-case graph llama.cpp reserves for a context, node by node, as JSON (the format:
   docs/memory.md "Checked node by node"; tests/enginegraph.py reads it).

   The model is loaded as llama-fit-params loads it (common/fit.cpp: no_alloc, nothing allocated) and
   the context created; its constructor reserves the pp graph, the tg graph and the pp graph again,
   so the context's reserve result and its scheduler hold the last pp graph as the scheduler split it.
   Dumped: every leaf and node (op, type, ne, nb, view source and offset, sources, flags, the backend the
   scheduler assigned), every split (backend, node range, input copies) and the input leafs the
   scheduler copies per pipeline stage.

   usage: graphdump [-o FILE] ARGS...   (ARGS read as llama-fit-params reads them)

   Built by tests/engine/graphdump.py inside the pinned tree: it includes src/llama-context.h for the
   context's scheduler and reserve graph, and a header that build step writes from the pinned
   ggml-backend.cpp with the scheduler's split records (they have no accessor). */
#include "arg.h"
#include "build-info.h"
#include "common.h"
#include "llama.h"

#include "llama-context.h"
#include "llama-graph.h"
#include "llama-model.h"

#include "ggml-backend.h"
#include "ggml-impl.h"
#include "graphdump_sched.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#ifndef GRAPHDUMP_BUILD  // the release tag of the pinned commit (the source package carries no build number)
#define GRAPHDUMP_BUILD 0
#endif

static std::string jstr(const char * s) {
    std::string out = "\"";
    for (const unsigned char * p = (const unsigned char *) s; *p; p++) {
        const unsigned char c = *p;
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char) c;
        } else if (c < 0x20) {
            char buf[8];
            snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        } else {
            out += (char) c;
        }
    }
    return out + "\"";
}

static std::string jints(const int64_t * v, int n) {
    std::string out = "[";
    for (int i = 0; i < n; i++) {
        out += (i ? ", " : "") + std::to_string(v[i]);
    }
    return out + "]";
}

static std::string jints(const size_t * v, int n) {
    std::string out = "[";
    for (int i = 0; i < n; i++) {
        out += (i ? ", " : "") + std::to_string(v[i]);
    }
    return out + "]";
}

static std::string jflags(int32_t flags) {
    static const struct { int32_t bit; const char * name; } names[] = {
        {GGML_TENSOR_FLAG_INPUT, "input"}, {GGML_TENSOR_FLAG_OUTPUT, "output"}, {GGML_TENSOR_FLAG_PARAM, "param"},
        {GGML_TENSOR_FLAG_LOSS, "loss"},   {GGML_TENSOR_FLAG_COMPUTE, "compute"},
    };
    std::string out = "[";
    bool first = true;
    for (const auto & n : names) {
        if (flags & n.bit) {
            out += (first ? "" : ", ") + jstr(n.name);
            first = false;
        }
    }
    return out + "]";
}

struct dumper {
    ggml_backend_sched_t sched;
    ggml_cgraph * gf;
    std::unordered_map<const ggml_tensor *, int> node_idx, leaf_idx;
    std::vector<int> node_split;  // split index of each node

    int backend_id(ggml_tensor * t) const {
        ggml_backend_t b = ggml_backend_sched_get_tensor_backend(sched, t);
        for (int i = 0; b && i < ggml_backend_sched_get_n_backends(sched); i++) {
            if (ggml_backend_sched_get_backend(sched, i) == b) {
                return i;
            }
        }
        return -1;
    }

    std::string plain_ref(const ggml_tensor * t, int copy_backend) const {
        std::string copy = copy_backend >= 0 ? ", \"copy\": " + std::to_string(copy_backend) : "";
        auto n = node_idx.find(t);
        if (n != node_idx.end()) {
            return "{\"node\": " + std::to_string(n->second) + copy + "}";
        }
        auto l = leaf_idx.find(t);
        if (l != leaf_idx.end()) {
            return "{\"leaf\": " + std::to_string(l->second) + ", \"name\": " + jstr(t->name) + copy + "}";
        }
        return "";
    }

    // a source of node `i`: a node, a leaf, or the scheduler's copy of one on the node's split backend
    // (pass 5 of ggml_backend_sched_split_graph replaces such sources by the copy, named
    // "<backend>#<name>#<copy>"; the copied tensor is an input of that split or of an earlier split on
    // the same backend)
    std::string ref(const ggml_tensor * t, int i) const {
        std::string r = plain_ref(t, -1);
        if (!r.empty()) {
            return r;
        }
        if (i >= 0 && node_split[i] >= 0) {
            const int s = node_split[i];
            const int b = sched->splits[s].backend_id;
            for (int k = s; k >= 0; k--) {
                const ggml_backend_sched_split & sp = sched->splits[k];
                if (sp.backend_id != b) {
                    continue;
                }
                for (int j = 0; j < sp.n_inputs; j++) {
                    char name[GGML_MAX_NAME];
                    snprintf(name, sizeof(name), "%s#%s#%d", ggml_backend_name(sched->backends[b]), sp.inputs[j]->name,
                             sched->cur_copy);
                    if (strcmp(name, t->name) == 0 && ggml_are_same_layout(t, sp.inputs[j])) {
                        std::string c = plain_ref(sp.inputs[j], b);
                        if (!c.empty()) {
                            return c;
                        }
                    }
                }
            }
        }
        return "{\"other\": " + jstr(t->name) + "}";
    }

    std::string backend_field(ggml_tensor * t) const {
        const int b = backend_id(t);
        return b < 0 ? "null" : std::to_string(b);
    }
};

int main(int argc, char ** argv) {
    const char * out_path = nullptr;
    std::vector<char *> args = {argv[0]};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) {
            out_path = argv[++i];
        } else {
            args.push_back(argv[i]);
        }
    }
    common_params params;
    if (!common_params_parse((int) args.size(), args.data(), params, LLAMA_EXAMPLE_FIT_PARAMS)) {
        return 2;
    }
    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_WARN) {
            fputs(text, stderr);
        }
    }, nullptr);
    llama_backend_init();

    llama_model_params mparams = common_model_params_to_llama(params);
    llama_context_params cparams = common_context_params_to_llama(params);
    mparams.no_alloc = true;  // as common/fit.cpp measures: nothing allocated
    mparams.load_mode = LLAMA_LOAD_MODE_NONE;

    llama_model * model = llama_model_load_from_file(params.model.path.c_str(), mparams);
    if (model == nullptr) {
        fprintf(stderr, "graphdump: failed to load model %s\n", params.model.path.c_str());
        return 1;
    }
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        fprintf(stderr, "graphdump: failed to create the context\n");
        return 1;
    }

    dumper d;
    d.sched = ctx->get_sched();
    d.gf = ctx->get_gf_res_reserve()->get_gf();
    ggml_cgraph * gf = d.gf;
    ggml_backend_sched_t sched = d.sched;
    if (sched->n_splits != ggml_backend_sched_get_n_splits(sched)) {
        fprintf(stderr, "graphdump: the scheduler's layout does not match this build\n");
        return 1;
    }
    for (int i = 0; i < gf->n_nodes; i++) {
        d.node_idx[gf->nodes[i]] = i;
    }
    for (int i = 0; i < gf->n_leafs; i++) {
        d.leaf_idx[gf->leafs[i]] = i;
    }
    d.node_split.assign(gf->n_nodes, -1);
    for (int s = 0; s < sched->n_splits; s++) {
        for (int i = sched->splits[s].i_start; i < sched->splits[s].i_end && i < gf->n_nodes; i++) {
            d.node_split[i] = s;
        }
    }

    // the ubatch of the last pp reserve (llama_context::sched_reserve): n_tokens as the graph's token
    // input has it, one sequence per slot except where the engine reserves that graph with one
    // sequence, outputs capped by n_outputs_max
    const llama_cparams & cp = ctx->get_cparams();
    llm_graph_result * res = ctx->get_gf_res_reserve();
    const int64_t n_tokens = res->t_inp_tokens ? res->t_inp_tokens->ne[0]
                             : res->t_inp_embd ? res->t_inp_embd->ne[1]
                                               : -1;
    const llm_arch model_arch = model->arch;
    const uint32_t n_seqs = model_arch == LLM_ARCH_KIMI_LINEAR || model_arch == LLM_ARCH_MINIMAX_01 ? 1 : cp.n_seq_max;
    const uint32_t n_outputs = std::min(std::min(cp.n_ctx, cp.n_ubatch), cp.n_outputs_max);

    std::string o;
    o.reserve(1 << 20);
    char arch[128] = "";
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));
    o += "{\n\"format\": \"moeconf-graphdump/1\",\n";
    o += "\"engine\": {\"name\": \"llama.cpp\", \"commit\": " + jstr(llama_commit()) +
         ", \"build\": " + std::to_string(GRAPHDUMP_BUILD) + "},\n";
    o += "\"model\": {\"arch\": " + jstr(arch) + ", \"path\": " + jstr(params.model.path.c_str()) + "},\n";
    o += "\"args\": [";
    for (size_t i = 1; i < args.size(); i++) {
        o += (i > 1 ? ", " : "") + jstr(args[i]);
    }
    o += "],\n";
    o += "\"ubatch\": {\"n_tokens\": " + std::to_string(n_tokens) + ", \"n_seqs\": " + std::to_string(n_seqs) +
         ", \"n_outputs\": " + std::to_string(n_outputs) + "},\n";
    o += "\"cparams\": {\"n_ctx\": " + std::to_string(cp.n_ctx) + ", \"n_batch\": " + std::to_string(cp.n_batch) +
         ", \"n_ubatch\": " + std::to_string(cp.n_ubatch) + ", \"n_seq_max\": " + std::to_string(cp.n_seq_max) +
         ", \"flash_attn\": " + (cp.flash_attn ? "true" : "false") + ", \"type_k\": " +
         jstr(ggml_type_name(cparams.type_k)) + ", \"type_v\": " + jstr(ggml_type_name(cparams.type_v)) +
         ", \"op_offload\": " + (cp.op_offload ? "true" : "false") +
         ", \"pipeline_parallel\": " + (cp.pipeline_parallel ? "true" : "false") +
         ", \"n_copies\": " + std::to_string(sched->n_copies) + "},\n";

    o += "\"backends\": [\n";
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); i++) {
        ggml_backend_t b = ggml_backend_sched_get_backend(sched, i);
        ggml_backend_dev_t dev = ggml_backend_get_device(b);
        o += std::string(i ? ",\n" : "") + " {\"name\": " + jstr(ggml_backend_name(b)) + ", \"device\": " +
             jstr(dev ? ggml_backend_dev_name(dev) : "") + ", \"buft\": " +
             jstr(ggml_backend_buft_name(ggml_backend_sched_get_buffer_type(sched, b))) + "}";
    }
    o += "\n],\n";

    o += "\"leafs\": [\n";
    for (int i = 0; i < gf->n_leafs; i++) {
        ggml_tensor * t = gf->leafs[i];
        ggml_backend_buffer_t buf = t->view_src ? t->view_src->buffer : t->buffer;
        std::string usage = "null", buft = "null";
        if (buf) {
            switch (ggml_backend_buffer_get_usage(buf)) {
                case GGML_BACKEND_BUFFER_USAGE_WEIGHTS: usage = "\"weights\""; break;
                case GGML_BACKEND_BUFFER_USAGE_COMPUTE: usage = "\"compute\""; break;
                default: usage = "\"any\""; break;
            }
            buft = jstr(ggml_backend_buft_name(ggml_backend_buffer_get_type(buf)));
        }
        o += std::string(i ? ",\n" : "") + " {\"i\": " + std::to_string(i) + ", \"name\": " + jstr(t->name) +
             ", \"type\": " + jstr(ggml_type_name(t->type)) + ", \"ne\": " + jints(t->ne, 4) +
             ", \"nb\": " + jints(t->nb, 4) +
             ", \"flags\": " + jflags(t->flags) + ", \"backend\": " + d.backend_field(t) +
             ", \"buffer\": " + usage + ", \"buft\": " + buft + ", \"view_src\": " +
             (t->view_src ? d.ref(t->view_src, -1) : "null") + ", \"view_offs\": " + std::to_string(t->view_offs) + "}";
    }
    o += "\n],\n";

    o += "\"nodes\": [\n";
    for (int i = 0; i < gf->n_nodes; i++) {
        ggml_tensor * t = gf->nodes[i];
        int n_src = GGML_MAX_SRC;
        while (n_src > 0 && t->src[n_src - 1] == nullptr) {
            n_src--;
        }
        std::string srcs = "[";
        for (int j = 0; j < n_src; j++) {
            srcs += (j ? ", " : "") + (t->src[j] ? d.ref(t->src[j], i) : std::string("null"));
        }
        srcs += "]";
        o += std::string(i ? ",\n" : "") + " {\"i\": " + std::to_string(i) + ", \"name\": " + jstr(t->name) +
             ", \"op\": " + jstr(ggml_op_desc(t)) + ", \"type\": " + jstr(ggml_type_name(t->type)) +
             ", \"ne\": " + jints(t->ne, 4) + ", \"nb\": " + jints(t->nb, 4) + ", \"view_src\": " +
             (t->view_src ? d.ref(t->view_src, i) : "null") + ", \"view_offs\": " + std::to_string(t->view_offs) +
             ", \"src\": " + srcs + ", \"flags\": " + jflags(t->flags) + ", \"backend\": " + d.backend_field(t) + "}";
    }
    o += "\n],\n";

    o += "\"splits\": [\n";
    for (int s = 0; s < sched->n_splits; s++) {
        const ggml_backend_sched_split & sp = sched->splits[s];
        std::string inputs = "[";
        for (int j = 0; j < sp.n_inputs; j++) {
            std::string r = d.plain_ref(sp.inputs[j], -1);
            inputs += (j ? ", " : "") + (r.empty() ? "{\"other\": " + jstr(sp.inputs[j]->name) + "}" : r);
        }
        inputs += "]";
        o += std::string(s ? ",\n" : "") + " {\"i\": " + std::to_string(s) + ", \"backend\": " +
             std::to_string(sp.backend_id) + ", \"start\": " + std::to_string(sp.i_start) + ", \"end\": " +
             std::to_string(sp.i_end) + ", \"inputs\": " + inputs + "}";
    }
    o += "\n],\n";

    // with pipeline parallelism (n_copies > 1) the scheduler keeps n_copies copies of these input leafs
    o += "\"graph_inputs\": [";
    for (int j = 0; j < sched->n_graph_inputs; j++) {
        std::string r = d.plain_ref(sched->graph_inputs[j], -1);
        o += (j ? ", " : "") + (r.empty() ? "{\"other\": " + jstr(sched->graph_inputs[j]->name) + "}" : r);
    }
    o += "]\n}\n";

    FILE * f = out_path ? fopen(out_path, "w") : stdout;
    if (f == nullptr) {
        fprintf(stderr, "graphdump: cannot write %s\n", out_path);
        return 1;
    }
    fwrite(o.data(), 1, o.size(), f);
    if (out_path) {
        fclose(f);
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
