/* Where llama.cpp puts every tensor: the model loaded as llama-fit-params loads it (no_alloc,
   nothing allocated or read: common/fit.cpp), then each tensor of the model's contexts printed
   with the buffer type holding it. A tensor the loader places twice (a tied output's copy of
   token_embd, rope_freqs copied into later blocks' buffers) is printed once per buffer type.
   usage: placement ARGS...  (read as llama-fit-params reads them: -m, --rpc, -ngl, -ot, -ts, ...)
   prints `TENSOR BUFFER_TYPE` lines. */
#include "arg.h"
#include "common.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

// the model's tensors by name (src/llama-model.h; exported by libllama)
const std::vector<std::pair<std::string, ggml_tensor *>> & llama_internal_get_tensor_map(const llama_model * model);

int main(int argc, char ** argv) {
    common_params params;
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_FIT_PARAMS)) {
        return 2;
    }
    llama_backend_init();
    llama_model_params mparams = common_model_params_to_llama(params);
    mparams.no_alloc  = true;
    mparams.load_mode = LLAMA_LOAD_MODE_NONE;
    llama_model * model = llama_model_load_from_file(params.model.path.c_str(), mparams);
    if (model == nullptr) {
        fprintf(stderr, "failed to load model\n");
        return 1;
    }
    for (const auto & [name, t] : llama_internal_get_tensor_map(model)) {
        printf("%s %s\n", name.c_str(), t->buffer ? ggml_backend_buffer_name(t->buffer) : "(none)");
    }
    llama_model_free(model);
    return 0;
}
