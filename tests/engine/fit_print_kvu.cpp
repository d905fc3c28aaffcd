// llama-fit-params -fitp on with a unified KV cache (llama-server's default 4 slots set kv_unified;
// llama-fit-params has no -kvu): the same projection, common_fit_print, with cparams.kv_unified = true.
// usage: fit_print_kvu <llama-fit-params arguments, -kvu left out>
// build (pinned llama.cpp, S=its source, B=its build/bin):
//   g++ -std=c++17 -I$S/include -I$S/common -I$S/ggml/include -I$S/vendor fit_print_kvu.cpp \
//       -o fit_print_kvu -L$B -lllama-common -lllama -lggml -lggml-base -Wl,-rpath,$B
// Used to record the -kvu lines of tests/data/glm5next_memory_oracle.json.
#include "llama.h"
#include "arg.h"
#include "common.h"
#include "fit.h"
#include "log.h"

int main(int argc, char ** argv) {
    common_params params;
    common_init();
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_FIT_PARAMS)) {
        return 1;
    }
    llama_backend_init();
    llama_numa_init(params.numa);
    auto mparams = common_model_params_to_llama(params);
    auto cparams = common_context_params_to_llama(params);
    cparams.kv_unified = true;
    common_log_flush(common_log_main());
    common_fit_print(params.model.path.c_str(), &mparams, &cparams);
    return 0;
}
