/* Prints llama_state_seq_get_size_ext of sequence 0 (partial: what llama-server's context
   checkpoints copy; full: what its prompt cache saves) after decoding N tokens.
   usage: state_size MODEL N_TOKENS N_CTX N_SEQ [GGML_TYPE for K and V, with flash attention on] */
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL N_TOKENS N_CTX N_SEQ [TYPE]\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "load failed\n");
        return 1;
    }
    const int n = atoi(argv[2]);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = atoi(argv[3]);
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_seq_max = atoi(argv[4]);
    cp.kv_unified = true;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    if (argc > 5) {
        cp.type_k = atoi(argv[5]);
        cp.type_v = atoi(argv[5]);
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    }
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "context failed\n");
        return 1;
    }
    llama_token * toks = malloc(sizeof(llama_token) * n);
    for (int i = 0; i < n; i++) {
        toks[i] = 1 + (i % 100);
    }
    for (int off = 0; off < n; off += 512) {
        const int k = n - off < 512 ? n - off : 512;
        if (llama_decode(ctx, llama_batch_get_one(toks + off, k))) {
            fprintf(stderr, "decode failed\n");
            return 1;
        }
    }
    printf("partial %zu full %zu\n", llama_state_seq_get_size_ext(ctx, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY),
           llama_state_seq_get_size_ext(ctx, 0, 0));
    free(toks);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
