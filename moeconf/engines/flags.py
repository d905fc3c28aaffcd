"""The options each engine's server accepts, and the ones a plan sets through its own keys.

Names read from the engines' argument parsers (mainline `common/arg.cpp` at b10573, ik_llama.cpp
`common/common.cpp` at 8337e4cd3). Both engines refuse an argument they do not know, and both read
a long option with `_` as `-` (`--n_gpu_layers` is `--n-gpu-layers`).
"""

from __future__ import annotations

from typing import Final


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())

# every spelling llama.cpp's server accepts
MAINLINE_OPTIONS: Final = _words("""
--adaptive-decay --adaptive-target --agent --alias --api-key --api-key-file --api-prefix --attention --audio
--backend-sampling --batch-size --binary-file --cache-idle-slots --cache-list --cache-prompt --cache-ram
--cache-reuse --cache-type-k --cache-type-k-draft --cache-type-v --cache-type-v-draft --chat-template
--chat-template-file --chat-template-kwargs --check --check-tensors --checkpoint-min-step --chunk
--chunk-separator --chunk-size --chunks --cls-separator --color --completion-bash --cont-batching
--context-file --context-shift --control-vector --control-vector-layer-range --control-vector-scaled
--conversation --cors-credentials --cors-headers --cors-methods --cors-origins --cpu-mask --cpu-mask-batch
--cpu-mask-batch-draft --cpu-mask-draft --cpu-moe --cpu-moe-draft --cpu-range --cpu-range-batch
--cpu-range-batch-draft --cpu-range-draft --cpu-strict --cpu-strict-batch --cpu-strict-batch-draft
--cpu-strict-draft --ctx-checkpoints --ctx-size --defrag-thold --device --device-draft --dflash
--diffusion-add-gumbel-noise --diffusion-alg-temp --diffusion-algorithm --diffusion-block-length
--diffusion-cfg-scale --diffusion-eps --diffusion-steps --diffusion-visual --direct-io --display-prompt
--docker-repo --draft --draft-max --draft-min --draft-n --draft-n-min --draft-p-min --draft-p-split
--dry-allowed-length --dry-base --dry-multiplier --dry-penalty-last-n --dry-sequence-breaker --dynatemp-exp
--dynatemp-range --eagle3 --embd-gemma-default --embd-normalize --embd-output-format --embd-separator
--embedding --embeddings --epochs --escape --file --fim-qwen-1.5b-default --fim-qwen-14b-spec
--fim-qwen-30b-default --fim-qwen-3b-default --fim-qwen-7b-default --fim-qwen-7b-spec --fit --fit-ctx
--fit-print --fit-target --flash-attn --frequency-penalty --from-chunk --gpt-oss-120b-default
--gpt-oss-20b-default --gpu-layers --gpu-layers-draft --grammar --grammar-file --grp-attn-n --grp-attn-w
--hellaswag --hellaswag-tasks --help --hf-file --hf-repo --hf-repo-draft --hf-token --host --ids --ignore-eos
--image --image-max-tokens --image-min-tokens --in-file --in-prefix --in-prefix-bos --in-suffix --interactive
--interactive-first --jinja --json-schema --json-schema-file --junk --keep --kl-divergence
--kl-divergence-base --kv-offload --kv-unified --learning-rate --learning-rate-decay-epochs
--learning-rate-min --list-devices --load-mode --log-colors --log-disable --log-file --log-prefix
--log-prompts-dir --log-timestamps --log-verbose --log-verbosity --logit-bias --logits-output-dir
--lookup-cache-dynamic --lookup-cache-static --lora --lora-init-without-apply --lora-scaled --main-gpu
--mcp-servers-config --mcp-servers-json --media-path --method --metrics --min-p --mirostat --mirostat-ent
--mirostat-lr --mlock --mmap --mmproj --mmproj-auto --mmproj-offload --mmproj-url --model --model-draft
--model-url --models-autoload --models-dir --models-max --models-preset --mtmd-batch-max-tokens --mtp
--multiline-input --multiple-choice --multiple-choice-tasks --n-cpu-moe --n-cpu-moe-draft --n-gpu-layers
--n-gpu-layers-draft --n-predict --negative-file --no-agent --no-bos --no-cache-idle-slots --no-cache-prompt
--no-cont-batching --no-context-shift --no-conversation --no-cors-credentials --no-direct-io
--no-display-prompt --no-escape --no-host --no-jinja --no-kv-offload --no-kv-unified --no-log-prefix
--no-log-timestamps --no-mmap --no-mmproj --no-mmproj-auto --no-mmproj-offload --no-models-autoload
--no-op-offload --no-parse-special --no-perf --no-ppl --no-prefill-assistant --no-reasoning-preserve
--no-repack --no-show-timings --no-skip-chat-parsing --no-slots --no-spec-draft-backend-sampling --no-ui
--no-ui-mcp-proxy --no-warmup --no-webui --no-webui-mcp-proxy --numa --offline --op-offload --optimizer
--output --output-file --output-format --output-frequency --override-kv --override-tensor
--override-tensor-draft --parallel --parse-special --path --pca-batch --pca-iter --perf --poll --poll-batch
--poll-batch-draft --poll-draft --pooling --port --pos --positive-file --ppl --ppl-output-type --ppl-stride
--predict --prefill-assistant --presence-penalty --print-token-count --prio --prio-batch --prio-batch-draft
--prio-draft --process-output --prompt --prompt-cache --prompt-cache-all --prompt-cache-ro --props --reasoning
--reasoning-budget --reasoning-budget-message --reasoning-effort --reasoning-format --reasoning-preserve
--repack --repeat-last-n --repeat-penalty --rerank --reranking --reuse-port --reverse-prompt --rope-freq-base
--rope-freq-scale --rope-scale --rope-scaling --rpc --sampler-seq --samplers --sampling-seq --save-all-logits
--save-frequency --save-logits --seed --sequences --server-base --show-count --show-statistics --show-timings
--simple-io --single-turn --skip-chat-parsing --sleep-idle-seconds --slot-prompt-similarity --slot-save-path
--slots --spec-default --spec-draft-backend-sampling --spec-draft-cpu-mask --spec-draft-cpu-mask-batch
--spec-draft-cpu-moe --spec-draft-cpu-range --spec-draft-cpu-range-batch --spec-draft-cpu-strict
--spec-draft-cpu-strict-batch --spec-draft-device --spec-draft-hf --spec-draft-model --spec-draft-n-cpu-moe
--spec-draft-n-max --spec-draft-n-min --spec-draft-ncmoe --spec-draft-ngl --spec-draft-override-tensor
--spec-draft-p-min --spec-draft-p-split --spec-draft-poll --spec-draft-poll-batch --spec-draft-prio
--spec-draft-prio-batch --spec-draft-threads --spec-draft-threads-batch --spec-draft-type-k
--spec-draft-type-v --spec-ngram-map-k-min-hits --spec-ngram-map-k-size-m --spec-ngram-map-k-size-n
--spec-ngram-map-k4v-min-hits --spec-ngram-map-k4v-size-m --spec-ngram-map-k4v-size-n --spec-ngram-min-hits
--spec-ngram-mod-n-match --spec-ngram-mod-n-max --spec-ngram-mod-n-min --spec-ngram-simple-min-hits
--spec-ngram-simple-size-m --spec-ngram-simple-size-n --spec-ngram-size-m --spec-ngram-size-n --spec-type
--special --split-mode --spm-infill --sse-ping-interval --ssl-cert-file --ssl-key-file --stdin
--swa-checkpoints --swa-full --system-prompt --system-prompt-file --tags --temp --temperature --tensor-filter
--tensor-split --threads --threads-batch --threads-batch-draft --threads-draft --threads-http --timeout
--tools --tools-runtime --top-k --top-n-sigma --top-nsigma --top-p --tts-lang --tts-speaker-file --typical
--typical-p --ubatch-size --ui --ui-config --ui-config-file --ui-mcp-proxy --usage --val-split --verbose
--verbose-prompt --verbosity --version --video --vision-gemma-12b-default --vision-gemma-4b-default --warmup
--webui --webui-config --webui-config-file --webui-mcp-proxy --weight-decay --winogrande --winogrande-tasks
--xtc-probability --xtc-threshold --yarn-attn-factor --yarn-beta-fast --yarn-beta-slow --yarn-ext-factor
--yarn-orig-ctx -C -Cb -Cbd -Cd -Cr -Crb -Crbd -Crd -a -ag -b -bf -bs -c -cb -cl -cmoe -cmoed -cms -cnv -co
-cram -ctk -ctkd -ctv -ctvd -ctxcp -decay-epochs -dev -devd -dio -dr -dt -e -epochs -f -fa -fit -fitc -fitp
-fitt -gan -gaw -h -hf -hfd -hff -hfr -hfrd -hft -i -if -j -jf -kvo -kvu -l -lcd -lcs -lm -lr -lr-min -lv -m
-md -mg -mli -mm -mmu -mu -n -ncmoe -ncmoed -ndio -ngl -ngld -nkvo -no-ag -no-cnv -no-kvu -nocb -np -npl -npp
-nr -ns -ntg -o -ofreq -opt -ot -otd -p -pps -ptc -r -rea -s -sm -sp -sps -st -sys -sysf -t -tb -tbd -td -tgs
-to -ts -ub -v -val-split -wd
""")

# ... of which these take a value
MAINLINE_VALUED: Final = _words("""
--adaptive-decay --adaptive-target --alias --api-key --api-key-file --api-prefix --attention --audio
--batch-size --binary-file --cache-ram --cache-reuse --cache-type-k --cache-type-k-draft --cache-type-v
--cache-type-v-draft --chat-template --chat-template-file --chat-template-kwargs --checkpoint-min-step --chunk
--chunk-separator --chunk-size --chunks --cls-separator --color --context-file --control-vector
--control-vector-layer-range --control-vector-scaled --cors-headers --cors-methods --cors-origins --cpu-mask
--cpu-mask-batch --cpu-mask-batch-draft --cpu-mask-draft --cpu-range --cpu-range-batch --cpu-range-batch-draft
--cpu-range-draft --cpu-strict --cpu-strict-batch --cpu-strict-batch-draft --cpu-strict-draft
--ctx-checkpoints --ctx-size --defrag-thold --device --device-draft --diffusion-add-gumbel-noise
--diffusion-alg-temp --diffusion-algorithm --diffusion-block-length --diffusion-cfg-scale --diffusion-eps
--diffusion-steps --docker-repo --draft --draft-max --draft-min --draft-n --draft-n-min --draft-p-min
--draft-p-split --dry-allowed-length --dry-base --dry-multiplier --dry-penalty-last-n --dry-sequence-breaker
--dynatemp-exp --dynatemp-range --embd-normalize --embd-output-format --embd-separator --epochs --file --fit
--fit-ctx --fit-print --fit-target --flash-attn --frequency-penalty --from-chunk --gpu-layers
--gpu-layers-draft --grammar --grammar-file --grp-attn-n --grp-attn-w --hellaswag-tasks --hf-file --hf-repo
--hf-repo-draft --hf-token --host --image --image-max-tokens --image-min-tokens --in-file --in-prefix
--in-suffix --json-schema --json-schema-file --junk --keep --kl-divergence-base --learning-rate
--learning-rate-decay-epochs --learning-rate-min --load-mode --log-colors --log-file --log-prompts-dir
--log-verbosity --logit-bias --logits-output-dir --lookup-cache-dynamic --lookup-cache-static --lora
--lora-scaled --main-gpu --mcp-servers-config --mcp-servers-json --media-path --method --min-p --mirostat
--mirostat-ent --mirostat-lr --mmproj --mmproj-url --model-draft --model-url --models-dir --models-max
--models-preset --mtmd-batch-max-tokens --multiple-choice-tasks --n-cpu-moe --n-cpu-moe-draft --n-gpu-layers
--n-gpu-layers-draft --n-predict --negative-file --numa --optimizer --output --output-file --output-format
--output-frequency --override-kv --override-tensor --override-tensor-draft --parallel --path --pca-batch
--pca-iter --poll --poll-batch --poll-batch-draft --poll-draft --pooling --port --pos --positive-file
--ppl-output-type --ppl-stride --predict --presence-penalty --print-token-count --prio --prio-batch
--prio-batch-draft --prio-draft --prompt --prompt-cache --reasoning --reasoning-budget
--reasoning-budget-message --reasoning-effort --reasoning-format --repeat-last-n --repeat-penalty
--reverse-prompt --rope-freq-base --rope-freq-scale --rope-scale --rope-scaling --rpc --sampler-seq --samplers
--sampling-seq --save-all-logits --save-frequency --seed --sequences --server-base --sleep-idle-seconds
--slot-prompt-similarity --slot-save-path --spec-draft-cpu-mask --spec-draft-cpu-mask-batch
--spec-draft-cpu-range --spec-draft-cpu-range-batch --spec-draft-cpu-strict --spec-draft-cpu-strict-batch
--spec-draft-device --spec-draft-hf --spec-draft-model --spec-draft-n-cpu-moe --spec-draft-n-max
--spec-draft-n-min --spec-draft-ncmoe --spec-draft-ngl --spec-draft-override-tensor --spec-draft-p-min
--spec-draft-p-split --spec-draft-poll --spec-draft-poll-batch --spec-draft-prio --spec-draft-prio-batch
--spec-draft-threads --spec-draft-threads-batch --spec-draft-type-k --spec-draft-type-v
--spec-ngram-map-k-min-hits --spec-ngram-map-k-size-m --spec-ngram-map-k-size-n --spec-ngram-map-k4v-min-hits
--spec-ngram-map-k4v-size-m --spec-ngram-map-k4v-size-n --spec-ngram-min-hits --spec-ngram-mod-n-match
--spec-ngram-mod-n-max --spec-ngram-mod-n-min --spec-ngram-simple-min-hits --spec-ngram-simple-size-m
--spec-ngram-simple-size-n --spec-ngram-size-m --spec-ngram-size-n --split-mode --sse-ping-interval
--ssl-cert-file --ssl-key-file --swa-checkpoints --system-prompt --system-prompt-file --tags --temp
--temperature --tensor-filter --tensor-split --threads --threads-batch --threads-batch-draft --threads-draft
--threads-http --timeout --tools --tools-runtime --top-k --top-n-sigma --top-nsigma --top-p --tts-lang
--tts-speaker-file --typical --typical-p --ubatch-size --ui-config --ui-config-file --val-split --verbosity
--video --webui-config --webui-config-file --weight-decay --winogrande-tasks --xtc-probability --xtc-threshold
--yarn-attn-factor --yarn-beta-fast --yarn-beta-slow --yarn-ext-factor --yarn-orig-ctx -C -Cb -Cbd -Cd -Cr
-Crb -Crbd -Crd -a -b -bf -c -cms -co -cram -ctk -ctkd -ctv -ctvd -ctxcp -decay-epochs -dev -devd -dr -dt
-epochs -f -fa -fit -fitc -fitp -fitt -gan -gaw -hf -hfd -hff -hfr -hfrd -hft -j -jf -l -lcd -lcs -lm -lr
-lr-min -lv -md -mg -mm -mmu -mu -n -ncmoe -ncmoed -ngl -ngld -np -npl -npp -ns -ntg -o -ofreq -opt -ot -otd
-p -ptc -r -rea -s -sm -sps -sys -sysf -t -tb -tbd -td -to -ts -ub -val-split -wd
""")

# every spelling ik_llama.cpp's server accepts
IK_OPTIONS: Final = _words("""
--adaptive-decay --adaptive-target --adaptive-updt-w-cur --alias --all-logits --allowlist-keyword
--allowlist-keyword-delay --allowlist-pieces --allowlist-unicode-rule --api-key --api-key-file --attention
--attention-max-batch --audio --banned-n --banned-string-file --batch-size --binary-file --cache-ram
--cache-ram-n-min --cache-ram-similarity --cache-type-k --cache-type-k-draft --cache-type-k-first
--cache-type-k-last --cache-type-v --cache-type-v-draft --cache-type-v-first --cache-type-v-last
--cfg-negative-prompt --cfg-negative-prompt-file --cfg-scale --chat-template --chat-template-file
--chat-template-kwargs --check-tensors --chunk --chunk-separator --chunk-size --chunks --color --cont-batching
--context-file --context-shift --control-vector --control-vector-layer-range --control-vector-scaled
--conversation --cpu-moe --ctx-checkpoints --ctx-checkpoints-eviction --ctx-checkpoints-interval
--ctx-checkpoints-tolerance --ctx-size --ctx-size-draft --cuda-params --defer-experts --defrag-thold --device
--device-draft --draft --draft-max --draft-min --draft-n --draft-n-min --draft-output --draft-output-file
--draft-p-min --draft-params --dry-allowed-length --dry-base --dry-multiplier --dry-penalty-last-n --dry-run
--dry-sequence-breaker --dsa --dsa-top-k --dump-kv-cache --dynatemp-exp --dynatemp-range --embd-normalize
--embd-output-format --embd-separator --embedding --embeddings --escape --expiring-logit-bias-file --file
--fit --fit-margin --flash-attn --frequency-penalty --from-chunk --fused-delta-net --fused-indexer-topk
--gpu-fit-margin --gpu-layers --gpu-layers-draft --grammar --grammar-file --graph-attn-precision
--graph-reduce-type --graph-reuse --grouped-expert-routing --grp-attn-n --grp-attn-w --hellaswag
--hellaswag-tasks --help --hf-file --hf-repo --hf-token --host --ignore-eos --image --image-max-tokens
--image-min-tokens --in-file --in-prefix --in-prefix-bos --in-suffix --indexer-cache-type-k --infill
--interactive --interactive-first --jinja --json-schema --junk --k-cache-hadamard --keep --kl-divergence
--kl-divergence-base --log-format --logdir --logit-bias --lookup-cache-dynamic --lookup-cache-static --lora
--lora-init-without-apply --lora-scaled --main-gpu --max-extra-alloc --max-gpu --merge-qkv
--merge-up-gate-experts --method --metrics --min-p --minilog --mirostat --mirostat-ent --mirostat-lr --mla-use
--mlock --mmproj --mmproj-url --model --model-draft --model-url --mtmd-kq-type --mtp-requantize-output-tensor
--multi-token-prediction --multiline-input --multiple-choice --multiple-choice-tasks --n-cpu-moe
--n-gpu-layers --n-gpu-layers-draft --n-predict --n-repetitions --negative-file --no-cont-batching
--no-context-shift --no-display-prompt --no-escape --no-flash-attn --no-fused-moe --no-fused-mul-multiadd
--no-fused-up-gate --no-graph-reuse --no-kv-offload --no-mmap --no-mmproj-offload --no-multi-token-prediction
--no-offload-only-active-experts --no-ppl --no-prefill-assistant --no-slots --no-warmup --numa
--offload-policy --output --output-draft --output-file --output-format --output-frequency --output-tensor-name
--override-kv --override-tensor --p-split --parallel --parallel-tool-calls --path --pca-batch --pca-iter --peg
--penalize-nl --perplexity --pooling --port --pos --positive-file --ppl-output-type --ppl-stride --predict
--prefetch-experts --prefetch-experts-threads --presence-penalty --print-token-count --process-output --prompt
--prompt-cache --prompt-cache-all --prompt-cache-ro --reasoning --reasoning-budget --reasoning-budget-message
--reasoning-format --reasoning-tokens --recurrent-ckpt-mode --repeat-last-n --repeat-penalty --reverse-prompt
--rope-cache --rope-freq-base --rope-freq-scale --rope-scale --rope-scaling --rpc --run-time-repack --samplers
--sampling-seq --save-all-logits --save-frequency --scheduler-async --seed --send-done --sequences --simple-io
--skip-chat-parsing --slot-prompt-similarity --slot-save-path --smart-expert-reduction --spec-autotune
--spec-ckpt-mode --spec-ngram-min-hits --spec-ngram-size-m --spec-ngram-size-n --spec-replace --spec-stage
--spec-type --special --split-mode --split-mode-f16 --split-mode-f32 --split-mode-graph-scheduling
--spm-infill --sql-save-file --sqlite-zstd-ext-file --ssl-cert-file --ssl-key-file --suffix-corpus
--suffix-max-depth --suffix-pattern-len --swa-compress --sweep-memory --sweep-stride --system-prompt-file
--temp --tensor-split --tfs --threads --threads-batch --threads-batch-draft --threads-draft --threads-http
--threads-mtmd --timeout --top-k --top-n-sigma --top-p --transparent-huge-pages --typical --ubatch-size
--ui-mcp-proxy --usage --v-cache-hadamard --validate-quants --verbose --verbose-prompt --verbosity --version
--warmup-batch --webui --webui-mcp-proxy --winogrande --winogrande-tasks --worst-graph-tokens
--xtc-probability --xtc-threshold --yarn-attn-factor --yarn-beta-fast --yarn-beta-slow --yarn-ext-factor
--yarn-orig-ctx -a -amb -b -bf -c -cb -cd -cmoe -cnv -co -cram -cram-n-min -crs -ctk -ctk-first -ctk-last
-ctkd -ctv -ctv-first -ctv-last -ctvd -ctx-ckpt -ctx-ckpt-e -ctx-ckpt-i -ctx-ckpt-t -cuda -dev -devd -dkvc -dr
-draft -dsa -dsatk -dt -e -f -fa -fdn -fidx -gan -gap -gaw -ger -gfm -gr -grt -h -hff -hfr -hft -i -ictk -if
-j -khad -l -lcd -lcs -ld -m -md -mea -mg -mla -mli -mqkv -mtp -mtprot -mu -muge -n -ncmoe -ngl -ngld -nkvo
-no-fa -no-fmoe -no-fug -no-gr -no-mmad -no-mtp -no-ooae -nocb -np -npl -npp -nrep -ns -ntg -o -ofreq -okv -op
-ot -p -pps -ps -ptc -ptcall -r -rcache -rea -rtr -s -sas -ser -sm -smf16 -smf32 -smgs -sp -spf -sps -t -tb
-tbd -td -thp -tm -to -ts -ub -v -vhad -vq -wb -wgt
""")

# ... of which these take a value
IK_VALUED: Final = _words("""
--adaptive-decay --adaptive-target --alias --allowlist-keyword --allowlist-keyword-delay --allowlist-pieces
--allowlist-unicode-rule --api-key --api-key-file --attention --attention-max-batch --audio --banned-n
--banned-string-file --batch-size --binary-file --cache-ram --cache-ram-n-min --cache-ram-similarity
--cache-type-k --cache-type-k-first --cache-type-k-last --cache-type-v --cache-type-v-first
--cache-type-v-last --cfg-negative-prompt --cfg-negative-prompt-file --cfg-scale --chat-template
--chat-template-file --chat-template-kwargs --chunk --chunk-separator --chunk-size --chunks --context-file
--context-shift --control-vector --control-vector-layer-range --control-vector-scaled --ctx-checkpoints
--ctx-checkpoints-eviction --ctx-checkpoints-interval --ctx-checkpoints-tolerance --ctx-size --ctx-size-draft
--cuda-params --defrag-thold --device --device-draft --draft --draft-max --draft-min --draft-n --draft-n-min
--draft-output --draft-output-file --draft-p-min --draft-params --dry-allowed-length --dry-base
--dry-multiplier --dry-penalty-last-n --dry-sequence-breaker --dsa-top-k --dynatemp-exp --dynatemp-range
--embd-normalize --embd-output-format --embd-separator --expiring-logit-bias-file --file --fit-margin
--flash-attn --frequency-penalty --from-chunk --fused-delta-net --gpu-fit-margin --gpu-layers
--gpu-layers-draft --grammar --grammar-file --graph-attn-precision --graph-reduce-type --grp-attn-n
--grp-attn-w --hellaswag-tasks --hf-file --hf-repo --host --image --image-max-tokens --image-min-tokens
--in-file --in-prefix --in-suffix --indexer-cache-type-k --json-schema --junk --keep --kl-divergence-base
--log-format --logdir --logit-bias --lookup-cache-dynamic --lookup-cache-static --lora --lora-scaled
--main-gpu --max-extra-alloc --max-gpu --method --min-p --mirostat --mirostat-ent --mirostat-lr --mla-use
--mmproj --mmproj-url --model --model-draft --model-url --mtmd-kq-type --mtp-requantize-output-tensor
--multiple-choice-tasks --n-cpu-moe --n-gpu-layers --n-gpu-layers-draft --n-predict --n-repetitions
--negative-file --numa --offload-policy --output --output-draft --output-file --output-format
--output-frequency --override-kv --override-tensor --p-split --parallel --path --pca-batch --pca-iter
--pooling --port --pos --positive-file --ppl-output-type --ppl-stride --predict --prefetch-experts-threads
--presence-penalty --print-token-count --prompt --prompt-cache --reasoning --reasoning-budget
--reasoning-budget-message --reasoning-format --reasoning-tokens --recurrent-ckpt-mode --repeat-last-n
--repeat-penalty --reverse-prompt --rope-freq-base --rope-freq-scale --rope-scale --rope-scaling --rpc
--samplers --sampling-seq --save-all-logits --save-frequency --seed --sequences --slot-prompt-similarity
--slot-save-path --smart-expert-reduction --spec-ckpt-mode --spec-ngram-min-hits --spec-ngram-size-m
--spec-ngram-size-n --spec-replace --spec-stage --spec-type --split-mode --sql-save-file
--sqlite-zstd-ext-file --ssl-cert-file --ssl-key-file --suffix-corpus --suffix-max-depth --suffix-pattern-len
--sweep-stride --system-prompt-file --temp --tensor-split --tfs --threads --threads-batch
--threads-batch-draft --threads-draft --threads-http --threads-mtmd --timeout --top-k --top-n-sigma --top-p
--typical --ubatch-size --verbosity --webui --winogrande-tasks --worst-graph-tokens --xtc-probability
--xtc-threshold --yarn-attn-factor --yarn-beta-fast --yarn-beta-slow --yarn-ext-factor --yarn-orig-ctx -a -amb
-b -bf -c -cd -cram -cram-n-min -crs -ctk -ctk-first -ctk-last -ctv -ctv-first -ctv-last -ctx-ckpt -ctx-ckpt-e
-ctx-ckpt-i -ctx-ckpt-t -cuda -dev -devd -draft -dsatk -dt -f -fa -fdn -gan -gap -gaw -gfm -grt -hff -hfr
-ictk -j -l -lcd -lcs -ld -m -md -mea -mg -mla -mtprot -mu -n -ncmoe -ngl -ngld -np -npl -npp -nrep -ns -ntg
-o -ofreq -okv -op -ot -p -ps -ptc -r -rea -s -ser -sm -spf -sps -t -tb -tbd -td -tm -to -ts -ub -wgt
""")


_NGL = "[flags] n_gpu_layers"
_FIT = "[flags] fit (moeconf plans place tensors themselves; fit would choose at load time)"
_RULES_CPU = "rules (\"experts -> cpu\", \"experts first N -> cpu\", ...)"

# Options a plan sets through its own keys, in every spelling: placement, the devices, memory.
# In `[flags] extra` they would be a second, unsimulated copy that the engine reads last.
PLAN_KEYS: Final[dict[str, str]] = {
    "-m": "[model] serve_path", "--model": "[model] serve_path",
    "-ngl": _NGL, "--gpu-layers": _NGL, "--n-gpu-layers": _NGL,
    "-ot": "rules", "--override-tensor": "rules",
    "-cmoe": _RULES_CPU, "--cpu-moe": _RULES_CPU, "-ncmoe": _RULES_CPU, "--n-cpu-moe": _RULES_CPU,
    "-ts": "[flags] tensor_split", "--tensor-split": "[flags] tensor_split",
    "-sm": "[flags] split_mode", "--split-mode": "[flags] split_mode",
    "-mg": "[flags] main_gpu", "--main-gpu": "[flags] main_gpu",
    "-dev": "[engine] gpus (the devices the plan places on)", "--device": "[engine] gpus (the devices the plan "
    "places on)", "--max-gpu": "[engine] gpus (the devices the plan places on)",
    "--rpc": "[flags] rpc",
    "-fit": _FIT, "--fit": _FIT, "-fitt": _FIT, "--fit-target": _FIT, "-fitc": _FIT, "--fit-ctx": _FIT,
    "--fit-margin": _FIT, "-gfm": _FIT, "--gpu-fit-margin": _FIT,
    "-c": "[flags] ctx_size", "--ctx-size": "[flags] ctx_size",
    "-b": "[flags] batch", "--batch-size": "[flags] batch", "-ub": "[flags] ubatch", "--ubatch-size": "[flags] ubatch",
    "-fa": "[flags] flash_attn", "--flash-attn": "[flags] flash_attn",
    "-ctk": "[flags] cache_type_k", "--cache-type-k": "[flags] cache_type_k",
    "-ctv": "[flags] cache_type_v", "--cache-type-v": "[flags] cache_type_v",
    "--no-mmap": "[flags] no_mmap", "--mmap": "[flags] no_mmap", "--mlock": "[flags] mlock",
    "-lm": "[flags] no_mmap and mlock", "--load-mode": "[flags] no_mmap and mlock",
    "-mqkv": "[flags] merge_qkv", "--merge-qkv": "[flags] merge_qkv",
    "-muge": "[flags] merge_up_gate", "--merge-up-gate-experts": "[flags] merge_up_gate",
    "-t": "[flags] threads", "--threads": "[flags] threads",
    "--host": "[targets] host", "--port": "[targets] port",
}


def option_name(word: str) -> str:
    """The option a command-line word names, as the engines look it up: a long option with `_`
    read as `-`; `--name=value` cut at `=` (moeconf reads that form; the engines refuse it)."""
    if not word.startswith("--"):
        return word
    name = word.split("=", 1)[0]
    return name.replace("_", "-")


def known_options(engine_name: str) -> tuple[frozenset[str], frozenset[str]]:
    """(every option, the options that take a value) of an engine's server."""
    if engine_name == "ik_llama.cpp":
        return IK_OPTIONS, IK_VALUED
    return MAINLINE_OPTIONS, MAINLINE_VALUED


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def scan_extra(words: list[str], engine_name: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """Read `[flags] extra` as the engine would: (index, option) pairs a plan key owns, and
    (index, word) pairs the engine does not know (it would refuse to start). A value of a known
    option is skipped, as the engine skips it; so is the word after an unknown option when it
    does not look like an option."""
    options, valued = known_options(engine_name)
    owned: list[tuple[int, str]] = []
    unknown: list[tuple[int, str]] = []
    i = 0
    while i < len(words):
        w = words[i]
        name = option_name(w)
        if name in PLAN_KEYS:
            owned.append((i, name))
        elif name not in options:
            unknown.append((i, w))
            nxt = words[i + 1] if i + 1 < len(words) else None
            if w.startswith("-") and "=" not in w and nxt is not None and (
                    not nxt.startswith("-") or _is_number(nxt)):
                i += 1  # its value, as far as anyone can tell
        elif name in valued and "=" not in w:
            i += 1
        i += 1
    return owned, unknown
