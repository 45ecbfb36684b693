"""SGLang 0.5.23's `launch_server` options as its argparse parser declares them. Data, pure.

Each word is one parser action: its option strings joined by `|` (aliases of one destination; in a
`--x|--no-x` pair the `--no-` spelling stores False). Grouped by how many values the action takes.
`tests/real/test_real_argv.py` checks this table against the real parser and prints a fresh one when
the pinned SGLang moves.
"""

VERSION = "0.5.23"

# Options that take no value (store_true, store_const, help, --x/--no-x pairs).
SWITCHES = """
    -h|--help --skip-tokenizer-init --trust-remote-code --is-embedding --enable-multimodal
    --enable-fp32-lm-head --quantize-and-serve --enable-tf32-matmul|--no-enable-tf32-matmul
    --enable-dynamic-chunking --enable-priority-scheduling --disable-priority-preemption
    --abort-on-priority-when-disabled --schedule-low-priority-values-first --disable-hybrid-swa-memory
    --prefill-only-disable-kv-cache --disable-radix-cache --enable-page-major-kv-layout
    --enable-unified-memory --disable-chunked-prefix-cache --disable-overlap-schedule --enable-mixed-chunk
    --dcp-replicate-q-proj|--no-dcp-replicate-q-proj --enable-prefill-cp --enable-dsa-cache-layer-split
    --enable-cp-decode-attn-tp --enable-kv-cache-sharding --enable-dp-attention-local-control-broadcast
    --enable-dp-lm-head --enable-tp-lm-head-all-to-all|--no-enable-tp-lm-head-all-to-all
    --enable-attn-tp-input-scattered --enable-shared-experts-attn-tp --enable-dense-mlp-attn-tp
    --enable-layernorm-sp --disable-attn-tp-gather --enable-p2p-check --mlx-enable-sampling --sleep-on-idle
    --use-ray --smg-grpc-mode --grpc-mode --skip-server-warmup --enable-http2 --enable-ssl-refresh
    --trust-request-chat-template --enable-cache-report --return-input-ids --return-output-ids
    --strip-thinking-cache --enable-strict-thinking --allow-auto-truncate
    --stream-response-default-include-usage --incremental-streaming-output --enable-streaming-session
    --enable-session-radix-cache --log-requests --show-time-cost --enable-metrics --enable-mfu-metrics
    --enable-metrics-for-all-schedulers --enable-request-time-stats-logging --enable-forward-pass-metrics
    --enable-trace --export-metrics-to-file --constrained-json-disable-any-whitespace
    --enable-lean-attention --disable-flashinfer-autotune --disable-prefill-cuda-graph
    --disable-decode-cuda-graph --disable-cuda-graph-padding --enable-profile-cuda-graph
    --enable-cudagraph-gc --debug-cuda-graph --enable-layerwise-nvtx-marker --enable-nccl-nvls
    --enable-symm-mem --triton-attention-reduce-in-fp32 --flashinfer-mla-disable-ragged
    --enable-fused-qk-norm-rope|--no-enable-fused-qk-norm-rope --enable-precise-embedding-interpolation
    --enable-fused-moe-sum-all-reduce --enable-deepseek-v4-fp4-indexer --disable-custom-all-reduce
    --enable-mscclpp --enable-torch-symm-mem --enable-scattered-sconv --pre-warm-nccl
    --enable-quant-communications --enforce-disable-flashinfer-allreduce-fusion
    --enable-aiter-allreduce-fusion --enable-torch-compile --enable-torch-compile-debug-mode
    --speculative-dspark-align-verify-tokens-to-graph-tier --speculative-use-rejection-sampling
    --speculative-enable-w4a4-mxfp4-megamoe|--no-speculative-enable-w4a4-mxfp4-megamoe
    --enable-multi-layer-eagle --speculative-adaptive --enable-w4a4-mxfp4-megamoe --enable-eplb
    --enable-elastic-expert-backup --enable-waterfill --disable-flashinfer-cutlass-moe-fp4-allgather
    --disable-shared-experts-fusion --enforce-shared-experts-fusion --enable-mamba-cache-stochastic-rounding
    --enable-int8-mamba-checkpoint --enable-linear-replayssm --enable-linear-replayssm-spec
    --enable-hierarchical-cache|--enable-hicache --enable-unified-cache-external-linker --enable-hisparse
    --enable-broadcast-mm-inputs-process --enable-prefix-mm-cache
    --mm-enable-dp-encoder|--no-mm-enable-dp-encoder --trust-mm-content-hashes --enable-mm-global-cache
    --disable-fast-image-processor --enable-lora --enable-lora-overlap-loading
    --experts-shared-outer-loras|--no-experts-shared-outer-loras --lora-use-virtual-experts
    --lora-strict-loading|--no-lora-strict-loading --enable-two-batch-overlap --enable-single-batch-overlap
    --enable-lmcache --enable-flexkv --dllm-fdfo|--no-dllm-fdfo --disaggregation-decode-enable-radix-cache
    --disaggregation-decode-enable-offload-kvcache --encoder-only --language-only --language-model-only
    --enable-adaptive-dispatch-to-encoder --enable-pdmux --weight-loader-disable-mmap
    --weight-loader-prefetch-checkpoints --weight-loader-drop-cache-after-load
    --remote-instance-weight-loader-start-seed-via-transfer-engine --delete-ckpt-after-loading
    --checkpoint-engine-wait-weights-before-ready --enable-prefill-delayer --enable-deterministic-inference
    --enable-dynamic-batch-tokenizer --enable-tokenizer-batch-encode --disable-tokenizer-batch-decode
    --enable-memory-saver --enable-weights-cpu-backup --enable-draft-weights-cpu-backup
    --enable-custom-logit-processor --enable-return-hidden-states --enable-return-routed-experts
    --enable-return-indexer-topk --disable-outlines-disk-cache --enable-mis
    --ple-offload-embedding|--no-ple-offload-embedding --disaggregation-enable-kv-checksum
    --enable-pd-role-switch --enable-linker-mla-dedup --enable-encoder-swa-bounded-replay
    --enable-decoder-swa-bounded-replay|--no-enable-decoder-swa-bounded-replay --enable-response-store
    --speculative-use-block-verification --disable-aiter-allreduce-fusion-in-prefill
    --disable-aiter-allreduce-fusion-in-decode --enable-amd-monokernel
    --enable-dsa-fused-indexer|--no-enable-dsa-fused-indexer --enable-watermark --enable-paged-experts
    --enable-nvidia-megakernel --enable-megamoe-for-layernorm-sp --enable-http-worker-reuseport
    --enable-return-aux-hidden-states --disable-cuda-graph --enable-dp-attention
    --enable-flashinfer-allreduce-fusion
"""

# Options that take exactly one value.
ONE_VALUE = """
    --model-path|--model --tokenizer-path --tokenizer-mode --tokenizer-backend --tokenizer-worker-num
    --detokenizer-worker-num --load-format --model-loader-extra-config --context-length --revision
    --model-impl --model-config-parser --json-model-override-args --dtype --quantization
    --quantization-param-path --kv-cache-dtype --modelopt-quant --modelopt-checkpoint-restore-path
    --modelopt-checkpoint-save-path --modelopt-export-path --rl-quant-profile --mem-fraction-static
    --max-running-requests --max-queued-requests --max-total-tokens --chunked-prefill-size
    --prefill-decode-interval --max-prefill-tokens --prefill-max-requests --schedule-policy
    --default-priority-value --priority-scheduling-preemption-threshold --retraction-policy
    --schedule-conservativeness --page-size --c128-page-size --swa-full-tokens-ratio --radix-eviction-policy
    --radix-eviction-policy-config --num-continuous-decode-steps --scheduler-recv-interval --nccl-port
    --dist-timeout --dist-init-addr|--nccl-init-addr --gated-launch-port --nnodes --node-rank
    --tp-size|--tensor-parallel-size --dcp-size|--decode-context-parallel-size
    --pp-size|--pipeline-parallel-size --pp-max-micro-batch-size --pp-async-batch-depth
    --dp-size|--data-parallel-size --attn-dp-size|--attention-data-parallel-size --load-balance-method
    --attn-cp-size|--attention-context-parallel-size --moe-dp-size|--moe-data-parallel-size --dwdp-size
    --dcp-comm-backend --cp-strategy --shared-experts-tp-size --device --base-gpu-id --gpu-id-step
    --random-seed --watchdog-timeout --soft-watchdog-timeout --host --port --fastapi-root-path --grpc-port
    --sidecar --sidecar-args --warmups --http2-max-concurrent-streams --http2-initial-connection-window-size
    --ssl-keyfile --ssl-certfile --ssl-ca-certs --ssl-keyfile-password --api-key --admin-api-key
    --served-model-name --weight-version --chat-template --hf-chat-template-name --completion-template
    --file-storage-path --default-chat-template-kwargs --tool-server --sampling-defaults
    --asr-max-buffer-seconds --asr-max-concurrent-sessions --preferred-sampling-params --stream-interval
    --batch-notify-size --log-level --log-level-http --log-requests-level --log-requests-format
    --crash-dump-folder --smg-http-sidecar-port|--grpc-http-sidecar-port --load-snapshot-publish-interval
    --tokenizer-metrics-custom-labels-header --extra-metric-labels --gc-warning-threshold-secs
    --decode-log-interval --kv-events-config --load-publish-endpoint --forward-pass-metrics-worker-id
    --forward-pass-metrics-ipc-name --trace-modules --otlp-traces-endpoint --export-metrics-to-file-dir
    --constrained-json-whitespace-pattern --constrained-json-max-whitespace-cnt --attention-backend
    --decode-attention-backend --prefill-attention-backend --grammar-backend --radix-cache-backend
    --mm-attention-backend --fp8-gemm-backend --fp4-gemm-backend --bf16-gemm-backend --dsa-prefill-backend
    --dsv4-prefill-backend --dsa-decode-backend --dsa-paged-mqa-logits-backend --dsa-topk-backend
    --mamba-backend --cuda-graph-config --cuda-graph-backend-decode --cuda-graph-backend-prefill
    --cuda-graph-max-bs-decode --cuda-graph-max-bs-prefill --cuda-graph-prefill-max-context|--context-bucket
    --triton-attention-num-kv-splits --triton-attention-split-tile-size --boundary-reduction
    --flashinfer-allreduce-fusion-backend --torch-compile-max-bs --speculative-algorithm --uno-lora-path
    --speculative-draft-model-path|--speculative-draft-model --speculative-draft-model-revision
    --speculative-draft-load-format --speculative-num-steps --speculative-eagle-topk
    --speculative-num-draft-tokens --speculative-dflash-block-size --speculative-dspark-block-size
    --speculative-dspark-sps-table-path --speculative-dspark-confidence-sts-path
    --speculative-accept-threshold-single --speculative-accept-threshold-acc --speculative-token-map
    --speculative-attention-mode --speculative-draft-attention-backend --speculative-dsa-topk-backend
    --speculative-draft-kv-cache-dtype --speculative-draft-window-size --speculative-moe-runner-backend
    --speculative-moe-a2a-backend --speculative-draft-model-quantization --speculative-adaptive-config
    --decoupled-spec-bind-endpoint --decoupled-spec-connect-endpoints --decoupled-spec-rank
    --decoupled-spec-role --spec-trace-dir --speculative-ngram-min-bfs-breadth
    --speculative-ngram-max-bfs-breadth --speculative-ngram-match-type --speculative-ngram-max-trie-depth
    --speculative-ngram-capacity --speculative-ngram-external-corpus-path
    --speculative-ngram-external-sam-budget --speculative-ngram-external-corpus-max-tokens
    --ep-size|--expert-parallel-size|--ep --moe-a2a-backend --deepep-v2-mode --moe-runner-backend
    --flashinfer-mxfp4-moe-precision --deepep-mode --fuseep-mode --deepep-dispatcher-output-dtype
    --ep-num-redundant-experts --ep-dispatch-algorithm --init-expert-location --eplb-algorithm
    --eplb-rebalance-num-iterations --eplb-rebalance-layers-per-chunk
    --eplb-min-rebalancing-utilization-threshold --expert-distribution-recorder-mode
    --expert-distribution-recorder-buffer-size --expert-balancedness-report-mode --deepep-config
    --moe-dense-tp-size --elastic-ep-backend --mooncake-ib-device --elastic-ep-join-mode
    --elastic-ep-join-rank-offset --elastic-ep-initial-size --max-ep-size --elastic-ep-scale-timeout
    --max-mamba-cache-size --mamba-ssm-dtype --mamba-max-states-per-path --mamba-cache-philox-rounds
    --mamba-full-memory-ratio --mamba-radix-cache-strategy --mamba-track-interval --int8-mamba-ckpt-size
    --linear-attn-backend --linear-attn-decode-backend --linear-attn-prefill-backend
    --linear-attn-verify-backend --linear-replayssm-cache-len --hicache-host-memory-mode --hicache-ratio
    --hicache-size --hicache-write-policy --hicache-io-backend --hicache-mem-layout
    --hicache-storage-backend --hicache-storage-prefetch-policy --hicache-storage-backend-extra-config
    --hicache-storage-prefetch-retry-poll-interval --hicache-storage-prefetch-retry-max-attempts
    --unified-cache-external-linker-backend --hisparse-config|--hierarchical-sparse-attention-extra-config
    --mm-process-config --mm-processor-worker-num --mm-io-worker-num --media-url-max-file-size-mb
    --mm-preprocess-cache-size-mb --limit-mm-data-per-request --image-processor-backend
    --mm-global-cache-backend --mm-feature-transport --max-lora-rank --max-loaded-loras
    --max-loras-per-batch --lora-eviction-policy --lora-backend --max-lora-chunk-size
    --lora-drain-wait-threshold --tbo-token-distribution-threshold --cpu-offload-gb --offload-group-size
    --offload-num-in-group --offload-prefetch-step --offload-mode --lmcache-config-file --flexkv-config-file
    --kt-weight-path --kt-method --kt-cpuinfer --kt-threadpool-count --kt-num-gpu-experts
    --kt-max-deferred-experts-per-token --dllm-algorithm --dllm-algorithm-config --disaggregation-mode
    --disaggregation-transfer-backend --disaggregation-bootstrap-port --disaggregation-ib-device
    --disaggregation-decode-retraction-backup --num-reserved-decode-tokens
    --disaggregation-decode-extra-slots --disaggregation-decode-polling-interval
    --optimistic-prefill-attempts --encoder-transfer-backend --encoder-bootstrap-port --pdmux-config-path
    --sm-group-num --startup-weight-load-mode --weight-loader-prefetch-num-threads
    --remote-instance-weight-loader-seed-instance-ip
    --remote-instance-weight-loader-seed-instance-service-port
    --remote-instance-weight-loader-send-weights-group-ports --remote-instance-weight-loader-backend
    --engine-info-bootstrap-port --modelexpress-config --download-dir --decrypted-config-file
    --decrypted-draft-config-file --prefill-delayer-max-delay-passes
    --prefill-delayer-token-usage-low-watermark --prefill-delayer-queue-min-ratio
    --prefill-delayer-max-delay-ms --min-free-slots-delay --rl-on-policy-target --kv-canary
    --kv-canary-sweep-interval --dynamic-batch-tokenizer-batch-size --dynamic-batch-tokenizer-batch-timeout
    --debug-tensor-dump-output-folder --debug-tensor-dump-input-file --return-hidden-states-mode
    --sampling-mask-max-tokens --weight-cache-mode --weight-cache-socket --weight-cache-timeout
    --forward-hooks --msprobe-dump-config --ple-offload-backend --ple-offload-dir
    --speculative-domino-candidate-pool-size --flashinfer-a2a-dispatch-type --cuda-graph-max-seq-len-prefill
    --prefill-kv-cache-dequant-dtype --dsv4-attn-backend --otlp-service-name --hicache-host-memory-fraction
    --swa-prefix-tails --disaggregation-decode-host-receive-threshold --qsa-indexer-dtype
    --disaggregation-decode-allocation-policy --speculative-draft-sink-size --dsa-triton-union
    --watermark-config --grpc-response-timeout-secs --paged-experts-num-resident
    --prefill-decode-interval-min-bs --unified-cache-external-linker-config --sampling-backend
    --reasoning-parser --tool-call-parser --kv-canary-real-data --config --monokernel-backend
"""

# Options that take zero or one value.
OPTIONAL_VALUE = """
    --model-checksum
"""

# Options that take zero or more values.
ANY_VALUES = """
    --uvicorn-access-log-exclude-prefixes --lora-target-modules --lora-paths --custom-weight-loader
"""

# Options that take one or more values.
SOME_VALUES = """
    --numa-node --gc-threshold --log-requests-target --tokenizer-metrics-allowed-custom-labels
    --bucket-time-to-first-token --bucket-inter-token-latency --bucket-e2e-request-latency
    --prompt-tokens-buckets --generation-tokens-buckets --flashinfer-autotune-skip-ops
    --cuda-graph-bs-decode --cuda-graph-bs-prefill --allowed-media-domains --encoder-urls
    --encoder-register-urls --prefill-delayer-forward-passes-buckets --prefill-delayer-wait-seconds-buckets
    --debug-tensor-dump-layers --return-aux-hidden-state-layer-ids
"""
