/* The memory llama.cpp reserves for a context whose worst-case graph has a given number of output
   rows: llama-fit-params's own path (common/fit.cpp common_get_device_memory_data: the model loaded
   with no_alloc, nothing allocated, the context's reserves measured), with `n_outputs_max` and
   `n_outputs_max_per_seq` set as llama-server sets them (tools/server/server-context.cpp
   server_output_limits) instead of 0 (= n_batch, every other binary).
   usage: outputs fit-params ARGS...  (the arguments read as llama-fit-params reads them, n_outputs_max 0)
          outputs server ARGS...      (read as llama-server reads them: -np auto is 4 slots in a unified
                                       cache, tools/server/server.cpp; the output limits as
                                       server_output_limits sets them, from the engine's own
                                       common_speculative_get_output_limits and common_speculative_n_max)
   prints `outputs N PER_SEQ`, then one line per device (its buffer type's name, then model,
   context and compute bytes) and a last line `Host model context compute` (every host buffer). */
#include "arg.h"
#include "common.h"
#include "fit.h"
#include "llama.h"
#include "speculative.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 2 || (strcmp(argv[1], "server") != 0 && strcmp(argv[1], "fit-params") != 0)) {
        fprintf(stderr, "usage: %s server|fit-params ARGS...\n", argv[0]);
        return 2;
    }
    const bool server = strcmp(argv[1], "server") == 0;
    // the parser reads argv[0] as the program name: drop the mode
    argv[1] = argv[0];
    common_params params;
    if (!common_params_parse(argc - 1, argv + 1, params, server ? LLAMA_EXAMPLE_SERVER : LLAMA_EXAMPLE_FIT_PARAMS)) {
        return 2;
    }
    int n_outputs_max = 0;
    int n_outputs_max_per_seq = 0;
    if (server) {
        if (params.n_parallel < 0) {  // -np auto
            params.n_parallel = 4;
            params.kv_unified = true;
        }
        if (params.embedding || (params.pooling_type != LLAMA_POOLING_TYPE_UNSPECIFIED &&
                                 params.pooling_type != LLAMA_POOLING_TYPE_NONE)) {
            n_outputs_max = params.n_batch;
            n_outputs_max_per_seq = 1;
        } else {
            common_speculative_output_limits lim = common_speculative_get_output_limits(
                params.n_batch, params.n_parallel, common_speculative_n_max(&params.speculative));
            n_outputs_max = lim.total < 1 ? 1 : lim.total;
            n_outputs_max_per_seq = lim.per_seq < 1 ? 1 : lim.per_seq;
        }
    }
    printf("outputs %d %d\n", n_outputs_max, n_outputs_max_per_seq);
    llama_backend_init();
    llama_model_params mparams = common_model_params_to_llama(params);
    llama_context_params cparams = common_context_params_to_llama(params);
    cparams.n_outputs_max = n_outputs_max;
    cparams.n_outputs_max_per_seq = n_outputs_max_per_seq;
    std::vector<ggml_backend_dev_t> devs;
    uint32_t n_layer = 0, n_ctx_train = 0, n_expert = 0;
    common_device_memory_data_vec dmd = common_get_device_memory_data(
        params.model.path.c_str(), &mparams, &cparams, devs, n_layer, n_ctx_train, n_expert, GGML_LOG_LEVEL_ERROR);
    for (size_t i = 0; i < devs.size(); i++) {
        printf("%s %zu %zu %zu\n", ggml_backend_buft_name(ggml_backend_dev_buffer_type(devs[i])), dmd[i].model,
               dmd[i].context, dmd[i].compute);
    }
    printf("Host %zu %zu %zu\n", dmd.back().model, dmd.back().context, dmd.back().compute);
    return 0;
}
