#!/usr/bin/env bash
# GPU runs of the measurements in docs/perf/, one named step each, from a checkout on the GPU machine.
#
#   OUT=DIR bash scripts/device_run.sh STEP [STEP ...]       (repository root; OUT defaults to ./device-out)
#   bash scripts/device_run.sh --list                         the steps and their commands
#
# Set-up, once per run, outside the repository:
#   - the wheels in .whl/ (nvidia-cutlass, jinja2, ... built or downloaded on a machine with an index; torch is
#     the GPU machine's own) are installed with `pip --target` into $TMPDIR/oasr-site, which goes on PYTHONPATH
#     after the checkout (so `import oasr_ops` is this checkout). Never put torch or one of its own dependencies
#     (jinja2, markupsafe, fsspec, filelock, sympy, ...) there: PYTHONPATH comes before site-packages and would
#     shadow the GPU machine's. Dask for the `matrix` step (Python 3.12, x86_64):
#       pip download -d .whl distributed==2026.8.0 dask==2026.8.0 --python-version 3.12 \
#           --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --only-binary=:all:
#     then delete the jinja2, markupsafe and fsspec wheels it brings (torch's own);
#   - the carried JIT cache .jitpack/jit.tar.xz (kernels prebuilt on a CPU machine with
#     `OASR_JIT_DIR=DIR OASR_CUDA_ARCH_LIST=9.0a oasr tune prebuild --all --jobs 2`, then `tar -cJf jit.tar.xz -C DIR .`)
#     is unpacked into $TMPDIR/oasr-jit and OASR_JIT_DIR points there;
#   - the GPU (name, clocks, temperature) and torch's version are printed.
# E2E_FLAGS: extra flags for the e2e-*-v4 steps' benchmark (the -dt steps add --recursive-dict-tags).
# ONLY: the variants of the e2e-*fp8-res steps (default: all six).
# Each step tees its log to $OUT/<step>.log and writes its JSON next to it. Steps marked (writes db/) rebuild a
# shipped tuning file in place: review the diff (`oasr tune diff`) before committing it.
set -euo pipefail

STEPS=(
    "prebuild-all|OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --all --jobs 16 --quiet"
    # the fp16 production kernels of the fp16 and int8 GEMM families (an fp16 model's Linears, its int8 layers)
    "prebuild-gemms-fp16|for f in gemm scaled_mm; do OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --family \$f --dtypes fp16 --jobs 16 --quiet || exit 1; done"
    # the fp8 e2e steps' kernels (their own first command), built once for several calls
    "prebuild-fp8-e2e|python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq none --fp8-acts gelu,silu --fp8-fp16 --production conv1d,conv2d_activation"
    # the JIT cache as it stands, to $OUT/jit.tar.xz: carry it back as .jitpack/jit.tar.xz (a cold machine starts bare)
    "pack-jit|tar -cJf \$OUT/jit.tar.xz --exclude='*.lock' -C \$OASR_JIT_DIR . && ls -la \$OUT/jit.tar.xz"
    "gpu-suite|python3 -m pytest -m gpu -q -p no:cacheprovider tests"
    # the GPU suite in parts that fit one device call: GPU_FILES="tests/test_a_gpu.py tests/test_b_gpu.py"
    "gpu-files|python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \${GPU_FILES:?set GPU_FILES to the test files}"
    "quickstart|python3 examples/quickstart.py"
    "main|python3 examples/compile_conformer.py"
    "gemm-bench|python3 benchmarks/gemm_configs.py --rounds 3 --out \$OUT/gemm_configs.json && python3 benchmarks/gemm_configs.py --report \$OUT/gemm_configs.json"
    "build|rm -f db/sm90/gemm.json && python3 -m oasr_ops tune build \$CENSUS --out system --fresh --thin --max-points 8 --max-fill 2 --rounds 3 --log \$OUT/build_log.jsonl --checkpoint-dir \$OUT/ckpt_gemm > \$OUT/build.json && cp db/sm90/gemm.json \$OUT/gemm.json && python3 -m oasr_ops tune evaluate --log \$OUT/build_log.jsonl --db new=db/sm90/gemm.json  (writes db/)"
    "build-int8|rm -f db/sm90/scaled_mm.json && python3 -m oasr_ops tune build --family scaled_mm \$CENSUS --out system --fresh --thin --max-points 6 --max-fill 1 --rounds 3 --log \$OUT/smm_log.jsonl --checkpoint-dir \$OUT/ckpt_smm > \$OUT/smm_build.json && cp db/sm90/scaled_mm.json \$OUT/scaled_mm_db.json  (writes db/)"
    "prebuild-fusion|OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --family conv1d --all --jobs 16 --quiet && python3 benchmarks/prebuild_fusion_kernels.py --jobs 16"
    "prebuild-fp8|OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --family scaled_mm_fp8 --all --jobs 16 --quiet"
    # the quantizing fp8 GEMMs' e4m3 outputs vs the float64 reference, element by element (session 38)
    "fp8-quantized-output-error|python3 benchmarks/fp8_quantized_output_error.py"
    "fp8-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_scaled_mm_fp8_gpu.py"
    "build-fp8|rm -rf db/sm90/scaled_mm_fp8.json \$OUT/fp8_log.jsonl \$OUT/ckpt_fp8 && python3 -m oasr_ops tune build --family scaled_mm_fp8 \$CENSUS --out system --fresh --thin --max-points 6 --max-fill 1 --rounds 3 --log \$OUT/fp8_log.jsonl --checkpoint-dir \$OUT/ckpt_fp8 > \$OUT/fp8_build.json && cp db/sm90/scaled_mm_fp8.json \$OUT/scaled_mm_fp8_db.json  (writes db/)"
    # the fused FFN fc1s of a calibrated int8 / fp8 deployment (session 34: `oasr tune census --calibrated`,
    # benchmarks/census/quantized/): their quantizing op's entries, merged into the shipped files. Since session 39
    # the arms time the fused fc1's kernel (candidates.BUILD_ACTIVATION); the first run (H100, session 39) timed the
    # plain quantizing kernel, whose exact division ranks the tiles differently: its entries were not shipped
    "build-act-quant|CQ=\$TMPDIR/census-actq; python3 benchmarks/census_ops.py --ops scaled_mm_quant,scaled_mm_fp8_quant --out-dir \$CQ benchmarks/census/quantized/*_calibrated.json && C8=\$(printf -- '--census %s ' \$CQ/*_int8_calibrated.json); CF=\$(printf -- '--census %s ' \$CQ/*_fp8_calibrated.json); P='--thin --max-points 6 --max-fill 1'; OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild \$C8 \$P --family scaled_mm --jobs 16 --quiet && OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild \$CF \$P --family scaled_mm_fp8 --jobs 16 --quiet && python3 -m oasr_ops tune build --family scaled_mm \$C8 \$P --out system --rounds 3 --log \$OUT/act_int8_log.jsonl > \$OUT/act_int8_build.json && python3 -m oasr_ops tune build --family scaled_mm_fp8 \$CF \$P --out system --rounds 3 --log \$OUT/act_fp8_log.jsonl > \$OUT/act_fp8_build.json && cp db/sm90/scaled_mm.json db/sm90/scaled_mm_fp8.json \$OUT/  (writes db/)"
    "fp8-bench|OASR_CUDA_ARCH_LIST=9.0a OASR_TUNE_USER_DB=off python3 benchmarks/scaled_mm_fp8.py --prebuild-jobs 16 --out \$OUT/scaled_mm_fp8.json --rounds 9"
    "fp8-bench-anchor|OASR_CUDA_ARCH_LIST=9.0a OASR_TUNE_USER_DB=off python3 benchmarks/scaled_mm_fp8.py --prebuild-jobs 16 --protocol anchor --rounds 5 --tile-ms '' --no-8192 --out \$OUT/scaled_mm_fp8_anchor.json"
    "fp8-protocol|OASR_CUDA_ARCH_LIST=9.0a OASR_TUNE_USER_DB=off python3 -m oasr_ops tune prebuild --family scaled_mm_fp8 --all --jobs 16 --quiet && OASR_TUNE_USER_DB=off python3 benchmarks/scaled_mm_fp8_protocol.py --rounds 9 --out \$OUT/fp8_protocol.json"
    "fp8-8192|OASR_CUDA_ARCH_LIST=9.0a python3 benchmarks/scaled_mm_fp8_8192.py --jobs 16 --rounds 3 --out \$OUT/fp8_8192.json"
    "fp8-probe|OASR_CUDA_ARCH_LIST=9.0a python3 benchmarks/scaled_mm_fp8_probe.py --jobs 16 --out \$OUT/fp8_probe.json"
    "fp8-between|OASR_CUDA_ARCH_LIST=9.0a OASR_TUNE_USER_DB=off python3 benchmarks/db_between_points.py --family scaled_mm_fp8 --dense 3 --prebuild-jobs 16 --log benchmarks/logs/sm90_scaled_mm_fp8_build_v1.jsonl --out \$OUT/between_fp8.json"
    "fp8-between-rebuilt|LOG=\$OUT/fp8_log.jsonl; [ -f \$LOG ] || LOG=benchmarks/logs/sm90_scaled_mm_fp8_build_v3.jsonl; OASR_CUDA_ARCH_LIST=9.0a OASR_TUNE_USER_DB=off python3 benchmarks/db_between_points.py --family scaled_mm_fp8 --dense 3 --prebuild-jobs 16 --log \$LOG --out \$OUT/between_fp8_rebuilt.json"
    "fp8-between-rebuilt-build|LOG=\$OUT/fp8_log.jsonl; [ -f \$LOG ] || LOG=benchmarks/logs/sm90_scaled_mm_fp8_build_v3.jsonl; OASR_CUDA_ARCH_LIST=9.0a OASR_TUNE_USER_DB=off python3 benchmarks/db_between_points.py --family scaled_mm_fp8 --dense 3 --protocol build --prebuild-jobs 16 --log \$LOG --out \$OUT/between_fp8_rebuilt_build.json"
    "scaled-mm|python3 benchmarks/scaled_mm.py --out \$OUT/scaled_mm.json --anchors benchmarks/anchors/h200-cublas-baselines.json --reps 7"
    "bmm|python3 benchmarks/bmm.py --out \$OUT/bmm.json --reps 9"
    "e2e|python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1000 --iters 20 --backends eager,inductor,oasr,oasr+int8 --quantization int8_w8a8 --out \$OUT/e2e.json"
    "e2e-relpos|python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1027 --iters 20 --attention rel_pos --backends eager,inductor,oasr --out \$OUT/e2e_relpos.json"
    "e2e-large|python3 benchmarks/e2e_conformer.py --size L --batch 16 --frames 1000 --iters 20 --backends oasr,oasr+int8 --quantization int8_w8a8 --out \$OUT/e2e_L_int8.json"
    "heldout|OASR_TUNE_USER_DB=off python3 benchmarks/cost_model_heldout.py --out \$OUT/heldout.json"
    "e2e-whisper|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_compare.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 5 --out \$OUT/e2e_whisper_small.json"
    "e2e-conv|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_compare.py --model examples.conformer:build_model --model-args size=M,conv_impl=conv1d --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --out \$OUT/e2e_conformer_conv1d.json"
    # an fp32 model under torch.autocast(fp16): oasr serves autocast's weight casts (session 26)
    "e2e-autocast-conformer|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_compare.py --model examples.conformer:build_model --model-args size=M,conv_impl=conv1d --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --autocast fp16 --out \$OUT/e2e_autocast_conformer.json"
    "e2e-autocast-whisper|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_compare.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 5 --autocast fp16 --out \$OUT/e2e_autocast_whisper_small.json"
    # the main job's model and input (Conformer S, B=2 x 400) in alternating rounds (the main job times each backend once)
    "e2e-main-alternating|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_compare.py --model examples.conformer:build_model --model-args size=S --inputs examples.conformer:example_inputs --input-args batch=2,frames=400 --rounds 7 --iters 50 --out \$OUT/e2e_main_alternating.json"
    # a stock nn.TransformerEncoder (Whisper-small sized): Inductor on PyTorch's fused fast path vs oasr without it
    "e2e-stock-transformer|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_compare.py --model benchmarks.stock_transformer:build_model --inputs benchmarks.stock_transformer:example_inputs --input-args batch=8,frames=1500 --rounds 5 --mha-fastpath off-for-oasr --out \$OUT/e2e_stock_transformer.json"
    "e2e-stock-transformer-nofast|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_compare.py --model benchmarks.stock_transformer:build_model --inputs benchmarks.stock_transformer:example_inputs --input-args batch=8,frames=1500 --rounds 5 --mha-fastpath off --out \$OUT/e2e_stock_transformer_nofast.json"
    "e2e-stock-transformer-int8|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_compare.py --model benchmarks.stock_transformer:build_model --inputs benchmarks.stock_transformer:example_inputs --input-args batch=8,frames=1500 --rounds 5 --mha-fastpath off-for-oasr --oasr-options '{\"quantization\": \"int8_w8a8\", \"fuse_quantization\": true}' --out \$OUT/e2e_stock_transformer_int8.json"
    "e2e-conv-linear|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_compare.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --out \$OUT/e2e_conformer_linear.json"
    "prebuild-conv1d|OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --family conv1d --all --jobs 16 --quiet"
    "ncu-dwconv|NCU=\$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1); \$NCU -k regex:dwconv -c 3 --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats python3 benchmarks/dwconv_profile.py"
    "conv-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv1d_gpu.py tests/test_conv_module_gpu.py"
    "conv-module-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv_module_gpu.py"
    "conv-module|OASR_TUNE_USER_DB=off python3 benchmarks/conv_module.py --size M --batch 16 --frames 1000 --rounds 5 --out \$OUT/conv_module.json"
    "e2e-conv-profile|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1000 --iters 20 --conv-impl conv1d --backends inductor,oasr --profile 3 --out \$OUT/e2e_conv1d_profile.json"
    "build-conv1d|OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --family conv1d --all --jobs 16 --quiet && python3 -m oasr_ops tune build --family conv1d --census benchmarks/census/conv/conformer_M_conv1d_offline.json --out system --fresh --thin --max-points 8 --max-fill 2 --rounds 3 --log \$OUT/conv1d_build_log.jsonl --checkpoint-dir \$OUT/ckpt_conv1d > \$OUT/conv1d_build.json && cp db/sm90/conv1d.json \$OUT/conv1d_db.json  (writes db/)"
    "prewarm-budget|rm -rf \$TMPDIR/empty-jit \$TMPDIR/prewarm-udb && mkdir -m 700 \$TMPDIR/empty-jit && OASR_JIT_DIR=\$TMPDIR/empty-jit OASR_TUNE_USER_DB=\$TMPDIR/prewarm-udb python3 benchmarks/prewarm_budget.py --budget 60 --out \$OUT/prewarm_budget.json"
    "autotune|python3 benchmarks/autotune_eager.py --size S --batches 1,4,8 --frames 300,1000 --space compiled --no-prebuild --out \$OUT/autotune_eager.json"
    "gemm-rebuild|[ -d \$TMPDIR/gemm_ckpt ] || rm -f \$TMPDIR/gemm_build_log.jsonl; python3 -m oasr_ops tune build \$CENSUS --out system --fresh --thin --max-points 8 --max-fill 4 --rounds 3 --log \$TMPDIR/gemm_build_log.jsonl --checkpoint-dir \$TMPDIR/gemm_ckpt > \$OUT/build.json; cp \$TMPDIR/gemm_build_log.jsonl \$OUT/build_log.jsonl; cp db/sm90/gemm.json \$OUT/gemm.json  (writes db/)"
    "between|OASR_TUNE_USER_DB=off python3 benchmarks/db_between_points.py --log \$TMPDIR/gemm_build_log.jsonl --out \$OUT/between.json"
    "heldout2|OASR_TUNE_USER_DB=off python3 benchmarks/cost_model_heldout.py --set 2 --out \$OUT/heldout2.json"
    "between-shipped|OASR_TUNE_USER_DB=off python3 benchmarks/db_between_points.py --log benchmarks/logs/sm90_gemm_build.jsonl --rounds 6 --out \$OUT/between_shipped.json"
    "matrix|python3 benchmarks/matrix_run.py --out \$OUT/matrix \$CENSUS --max-points 8 --max-fill 2 --rounds 3 --budget-s 480"
    "e2e-profile|python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1000 --iters 20 --backends oasr,oasr+int8 --quantization int8_w8a8 --profile 3 --out \$OUT/e2e_int8_profile.json"
    "quant-fusion-gpu|OASR_ENVELOPE_LOG=\$OUT/act_envelope_int8.jsonl python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_quant_fusion_gpu.py"
    "quant-exact-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_scaled_mm_quant_exact_gpu.py"
    "resid-gpu|python3 benchmarks/residual_gemm.py --prebuild-only --jobs 16 && python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_scaled_mm_residual_gpu.py"
    "resid-bench|python3 benchmarks/residual_gemm.py --jobs 16 --reps 15 --out \$OUT/residual_gemm.json"
    "e2e-int8-resid|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 3 --iters 20 --with-act-only --with-residual --profile 3 --profile-variants int8-fused-act,int8-fused-act-res --out \$OUT/e2e_int8_resid_conformer_M.json"
    "scaled-mm-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_scaled_mm_gpu.py"
    "act-quant-bench|python3 benchmarks/act_quant_gemm.py --jobs 16 --reps 15 --out \$OUT/act_quant_gemm.json"
    "act-quant-fc1|python3 benchmarks/act_quant_gemm.py --jobs 16 --reps 15 --shapes 3984x2048x512:silu,12000x3072x768:gelu --out \$OUT/act_quant_gemm_fc1.json"
    "lnq-bench|python3 benchmarks/layer_norm_quant.py --widths 256,512,768,1024 --iters 50 --out \$OUT/layer_norm_quant.json"
    "e2e-int8-fused|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 3 --iters 20 --with-act-only --with-layout-opt --profile 3 --profile-variants int8-fused-act,fp16 --out \$OUT/e2e_int8_fused_conformer_M.json"
    "e2e-whisper-int8-act|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 3 --iters 20 --with-act-only --out \$OUT/e2e_int8_fused_whisper_small.json"
    "pass-graph|for a in '--dtype fp16' '--dtype bf16' '--dtype fp16 --masked --frames 7' '--what frontend --width 512 --frames 1000'; do python3 benchmarks/pass_graph_dump.py \$a --out \$OUT/pass_graph || true; done"
    "prebuild-conv2d|OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --family conv2d_activation --all --jobs 16 --quiet"
    "conv2d-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv2d_activation_gpu.py"
    "conv2d-bench|OASR_TUNE_USER_DB=off python3 benchmarks/conv2d.py --out \$OUT/conv2d.json"
    "build-conv2d|OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --family conv2d_activation --all --jobs 16 --quiet && python3 -m oasr_ops tune build --family conv2d_activation --census benchmarks/census/conv/conformer_S_frontend_offline.json --census benchmarks/census/conv/conformer_M_frontend_offline.json --census benchmarks/census/conv/conformer_L_frontend_offline.json --out system --fresh --thin --max-points 4 --max-fill 1 --rounds 3 --log \$OUT/conv2d_build_log.jsonl --checkpoint-dir \$OUT/ckpt_conv2d > \$OUT/conv2d_build.json && cp db/sm90/conv2d_activation.json \$OUT/conv2d_activation_db.json  (writes db/)"
    "e2e-frontend-profile|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1027 --iters 20 --attention rel_pos --backends inductor,oasr --profile 3 --out \$OUT/e2e_relpos_frontend_profile.json"
    "e2e-int8-v2|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --production conv1d,conv2d_activation && for form in linear conv1d; do OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M,conv_impl=\$form --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 3 --iters 20 --with-act-only --with-fp16-oasr --host-profile 20 --out \$OUT/e2e_int8_conformer_M_\$form.json; done"
    "e2e-whisper-int8-v2|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 3 --iters 20 --with-act-only --with-fp16-oasr --host-profile 20 --out \$OUT/e2e_int8_whisper_small.json"
    "e2e-whisper-profile|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 1 --iters 10 --profile 3 --profile-variants int8-fused,fp16 --out \$OUT/e2e_whisper_small_profile.json"
    "fp8-fuse-gpu|python3 benchmarks/prebuild_fusion_kernels.py --jobs 17 --acts '' --lnq none --fp8-acts gelu:all,silu:default --fp8-fp16 default && OASR_ENVELOPE_LOG=\$OUT/act_envelope_fp8.jsonl python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8_fuse_quant_gpu.py"
    "e2e-fp8-fused|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq none --fp8-acts gelu,silu --fp8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 3 --iters 20 --with-unfused --out \$OUT/e2e_fp8_fused_conformer_M.json"
    "e2e-whisper-fp8-fused|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq none --fp8-acts gelu --fp8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 3 --iters 20 --with-unfused --out \$OUT/e2e_fp8_fused_whisper_small.json"
    "fp8-act-quant-bench|python3 benchmarks/act_quant_gemm_fp8.py --jobs 16 --reps 15 --out \$OUT/act_quant_gemm_fp8.json"
    "fp8-act-quant-fc1|python3 benchmarks/act_quant_gemm_fp8.py --jobs 16 --reps 15 --tiles heuristic --shapes 3984x2048x512:silu,12000x3072x768:gelu --out \$OUT/act_quant_gemm_fp8_fc1.json"
    # the plain quantizing fp8 GEMM's untuned policy (torch._scaled_mm + eager epilogue + quantization) vs the
    # heuristic's tiles, at encoder shapes and small M (session 39)
    "fp8-quant-policy|python3 benchmarks/act_quant_gemm_fp8.py --jobs 16 --reps 15 --tiles heuristic --shapes 16x2048x512:silu,1000x2048x512:silu,3984x2048x512:silu,3984x512x2048:silu,12000x3072x768:gelu,12000x768x3072:gelu --out \$OUT/fp8_quant_policy.json"
    # fp8 within an accuracy budget (session 27): oasr_ops.error_budget_filter(..., 0.02) over the fusable layers,
    # measured on the calibration batches vs fp32, against the unbudgeted fp8-fused-act and fp16 inductor
    "e2e-fp8-budget|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq none --fp8-acts gelu,silu --fp8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --iters 20 --error-budget \${BUDGET:-0.02} --with-error-order --only fp8-fused-act,fp8-fused-act-budget,fp8-fused-act-budget-err --out \$OUT/e2e_fp8_budget_conformer_M.json"
    "e2e-whisper-fp8-budget|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq none --fp8-acts gelu --fp8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 5 --iters 20 --error-budget \${BUDGET:-0.02} --with-error-order --only fp8-fused-act,fp8-fused-act-budget,fp8-fused-act-budget-err --out \$OUT/e2e_fp8_budget_whisper_small.json"
    # a stock nn.TransformerEncoder (Whisper-small sized) through quantize_ (session 28: the attention's projections
    # quantized via LinearMultiheadAttention, the fused fast path refused) vs fp16 Inductor on PyTorch's fast path
    "e2e-stock-transformer-int8-q|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model benchmarks.stock_transformer:build_model --inputs benchmarks.stock_transformer:example_inputs --input-args batch=8,frames=1500 --rounds 5 --iters 20 --with-act-only --out \$OUT/e2e_int8_fused_stock_transformer.json"
    # the in-graph path (options={"quantization": ...}) with layers="all" / "fusable", uncalibrated / calibrated,
    # unfrozen / frozen (residual fusion on: the default), against quantize_ + fusable_filter + calibrate with the
    # same fusions (int8-fused-res) and fp16 Inductor (and frozen fp16 Inductor)
    "e2e-stock-int8-opt|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model benchmarks.stock_transformer:build_model --inputs benchmarks.stock_transformer:example_inputs --input-args batch=8,frames=1500 --rounds 5 --iters 20 --with-options --with-freezing --with-residual --only int8-fused-res,fp16-frz,int8-opt-all,int8-opt-fusable,int8-opt-fusable-cal,int8-opt-all-frz,int8-opt-fusable-cal-frz --out \$OUT/e2e_int8_opt_stock_transformer.json"
    "e2e-whisper-int8-opt|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 5 --iters 20 --with-options --with-freezing --with-residual --only int8-fused-res,fp16-frz,int8-opt-all,int8-opt-fusable,int8-opt-fusable-cal,int8-opt-all-frz,int8-opt-fusable-cal-frz --out \$OUT/e2e_int8_opt_whisper_small.json"
    "e2e-conformer-int8-opt|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --iters 20 --with-options --with-freezing --with-residual --only int8-fused-res,fp16-frz,int8-opt-all,int8-opt-fusable,int8-opt-fusable-cal,int8-opt-all-frz,int8-opt-fusable-cal-frz --out \$OUT/e2e_int8_opt_conformer_M.json"
    # the Conformer's in-graph A/B in one short call: quantize_ vs every layer vs fusable + calibrated + frozen
    "e2e-conformer-int8-opt-short|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 3 --iters 20 --with-options --with-freezing --with-residual --only int8-fused-res,int8-opt-all,int8-opt-fusable-cal-frz --out \$OUT/e2e_int8_opt_short_conformer_M.json"
    # the bare scheme string (every other option at the backend's default) against the in-graph recipe that pays
    "e2e-conformer-int8-opt-plain|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 3 --iters 20 --with-options --with-freezing --only int8-opt-fusable-cal-frz,int8-opt-plain-cal-frz --out \$OUT/e2e_int8_opt_plain_conformer_M.json"
    # the in-graph path with e4m3: every layer vs the fusable ones calibrated and frozen, against quantize_'s fp8
    "e2e-conformer-fp8-opt|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq none --fp8-acts gelu,silu --fp8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 3 --iters 20 --with-options --with-freezing --only fp8-fused-act,fp8-opt-all,fp8-opt-fusable-cal-frz,fp8-opt-plain-cal-frz --out \$OUT/e2e_fp8_opt_conformer_M.json"
    # the fp8 residual epilogue (oasr.scaled_mm_fp8_residual, session 35): each fp8 recipe with and without it
    "e2e-fp8-res|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq auto --fp8-acts silu --fp8-fp16 --fp8-residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 3 --iters 20 --with-residual --error-budget \${BUDGET:-0.02} --only \${ONLY:-fp8-fused-act,fp8-fused-act-res,fp8-fused,fp8-fused-res,fp8-fused-act-budget,fp8-fused-act-budget-res} --out \$OUT/e2e_fp8_res_conformer_M.json"
    "e2e-whisper-fp8-res|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq auto --fp8-acts gelu --fp8-fp16 --fp8-residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 3 --iters 20 --with-residual --error-budget \${BUDGET:-0.02} --only \${ONLY:-fp8-fused-act,fp8-fused-act-res,fp8-fused,fp8-fused-res,fp8-fused-act-budget,fp8-fused-act-budget-res} --out \$OUT/e2e_fp8_res_whisper_small.json"
    # kernel profiles of quantize_'s recipe, the calibrated in-graph path and fp16 Inductor on the stock encoder
    "e2e-stock-int8-opt-prof|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model benchmarks.stock_transformer:build_model --inputs benchmarks.stock_transformer:example_inputs --input-args batch=8,frames=1500 --rounds 1 --iters 10 --with-options --with-residual --only int8-fused-res,int8-opt-fusable-cal --profile 3 --profile-fp16 --profile-variants int8-fused-res,int8-opt-fusable-cal,fp16 --out \$OUT/e2e_int8_opt_stock_transformer_profile.json"
    # the fp8 heuristic's FastAccum tiles at K <= 1024 (session 36; Whisper small: no fp8 DB entry covers it,
    # Conformer M: its fused fc1s have none): the same recipes with OASR_FP8_HEURISTIC_FAST_ACCUM off (the rule
    # before) and on, one process each, fp16 Inductor in both
    "e2e-whisper-fp8-heur|for fa in off on; do export OASR_FP8_HEURISTIC_FAST_ACCUM=\$fa OASR_TUNE_USER_DB=off; python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq auto --fp8-acts gelu --fp8-fp16 --fp8-residual --production conv1d,conv2d_activation | grep -v '^  reused' && python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 3 --iters 20 --with-residual --only fp8-fused-act-res,fp8-fused-res --out \$OUT/e2e_fp8_heur_\${fa}_whisper_small.json || exit 1; done"
    "e2e-conformer-fp8-heur|for fa in off on; do export OASR_FP8_HEURISTIC_FAST_ACCUM=\$fa OASR_TUNE_USER_DB=off; python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq auto --fp8-acts silu --fp8-fp16 --fp8-residual --production conv1d,conv2d_activation | grep -v '^  reused' && python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 3 --iters 20 --with-residual --only fp8-fused-act-res,fp8-fused-res --out \$OUT/e2e_fp8_heur_\${fa}_conformer_M.json || exit 1; done"
    "e2e-fp8-fused-profile|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 1 --iters 20 --profile 3 --profile-variants fp8-fused-act --out \$OUT/e2e_fp8_fused_conformer_M_profile.json"
    "e2e-whisper-int8-res|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 3 --iters 20 --with-residual --with-all-res --out \$OUT/e2e_int8_res_whisper_small.json"
    "e2e-int8-v3|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 3 --iters 20 --with-act-only --with-residual --only int8-fused-res,int8-fused-act-res --host-profile 50 --out \$OUT/e2e_int8_v3_conformer_M.json"
    "e2e-whisper-int8-v3|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 3 --iters 20 --with-residual --only int8-fused-res --host-profile 50 --out \$OUT/e2e_int8_v3_whisper_small.json"
    "e2e-whisper-int8-sib|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 3 --iters 20 --with-residual --with-siblings --out \$OUT/e2e_int8_sib_whisper_small.json"
    "sib-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fuse_siblings_gpu.py"
    "e2e-whisper-int8-sib-prof|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 1 --iters 10 --with-residual --with-siblings --profile 3 --profile-variants int8-fused-res,int8-fused-sib --out \$OUT/e2e_int8_sib_whisper_small_profile.json"
    "e2e-whisper-int8-sib-frz|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 3 --iters 20 --with-siblings --with-freezing --out \$OUT/e2e_int8_sib_frz_whisper_small.json"
    "e2e-int8-v4|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --iters 20 --with-act-only --with-residual --only int8-fused-res,int8-fused-act-res \${E2E_FLAGS:-} --out \$OUT/e2e_int8_v4_conformer_M.json"
    "e2e-int8-v4-dt|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --iters 20 --with-act-only --with-residual --only int8-fused-res,int8-fused-act-res --recursive-dict-tags --out \$OUT/e2e_int8_v4_conformer_M_dt.json"
    "e2e-whisper-int8-v4|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 5 --iters 20 --with-residual --with-siblings --only int8-fused-res,int8-fused-sib \${E2E_FLAGS:-} --out \$OUT/e2e_int8_v4_whisper_small.json"
    "e2e-whisper-int8-v4-dt|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts gelu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 5 --iters 20 --with-residual --with-siblings --only int8-fused-res,int8-fused-sib --recursive-dict-tags --out \$OUT/e2e_int8_v4_whisper_small_dt.json"
    "e2e-int8-v5|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --iters 20 --with-act-only --with-residual --with-fp16-oasr --only fp16-oasr,int8-fused-act-res \${E2E_FLAGS:-} --profile 3 --profile-variants int8-fused-act-res,fp16-oasr,fp16 --out \$OUT/e2e_int8_v5_conformer_M.json"
    "fp8-fp16out-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_scaled_mm_fp8_fp16_out_gpu.py"
    "e2e-fp8-v2|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq auto --fp8-acts silu --fp8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --iters 20 --profile 3 --profile-variants fp8-fused,fp8-fused-act --out \$OUT/e2e_fp8_v2_conformer_M.json"
    "e2e-whisper-fp8-v2|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq auto --fp8-acts gelu --fp8-fp16 --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --quantization fp8_w8a8 --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 5 --iters 20 --out \$OUT/e2e_fp8_v2_whisper_small.json"
    "int8-tile-probe|OASR_CUDA_ARCH_LIST=9.0a python3 benchmarks/int8_tile_probe.py --jobs 16 --shapes asr --rounds 3 --tiles t128x128x128_c2x2_coop,t128x256x128_c2x1_coop,t128x128x128_c1x2_coop,t128x128x128_c2x1_coop,t128x128x128_c2x2_pp,t256x128x128_c2x1_coop,t128x128x128_c1x2_pp --out \$OUT/int8_tile_probe.json"
    "conv2d-int8-probe|D=.jit/conv2d_int8_probe; ls \$D/probe_*.so >/dev/null 2>&1 || python3 benchmarks/conv2d_int8_probe/build.py --out \$D --jobs 16; python3 benchmarks/conv2d_int8_probe/probe.py --lib-dir \$D --out \$OUT/conv2d_int8_probe.json"
    "e2e-int8-frz|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --iters 20 --with-act-only --with-residual --with-freezing --only fp16-frz,int8-fused-act-res,int8-fused-act-res-frz --out \$OUT/e2e_int8_frz_conformer_M.json"
    "e2e-int8-newcomer|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M,d_model=384,num_heads=6 --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --iters 20 --with-act-only --with-residual --only int8-fused-act-res --out \$OUT/e2e_int8_newcomer_conformer_d384.json"
    "conv2d-int8-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv2d_int8_gpu.py && D=.jit/conv2d_int8_probe; ls \$D/probe_*.so >/dev/null 2>&1 || python3 benchmarks/conv2d_int8_probe/build.py --out \$D --jobs 16; python3 benchmarks/conv2d_int8_probe/probe.py --lib-dir \$D --with-op --out \$OUT/conv2d_int8_op.json"
    "conv2d-quant-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv2d_quant_gpu.py && python3 benchmarks/conv2d_quant.py --rounds 5 --out \$OUT/conv2d_quant.json"
    "conv2d-direct-check|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv2d_quant_gpu.py tests/test_conv2d_activation_gpu.py -k 'direct or config_matches or auto or capture or compiled' && python3 benchmarks/conv2d_quant.py --rounds 5 --out \$OUT/conv2d_quant.json"
    "conv2d-int8-tiles|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv2d_int8_gpu.py -k untuned && for c in 384 512; do python3 benchmarks/conv2d_quant.py --rounds 5 --channels \$c --int8-tiles --out \$OUT/conv2d_quant_c\$c.json; done"
    "prebuild-serving|for f in scaled_mm gemm conv1d bmm conv2d_activation; do OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --family \$f --dtypes fp16 --jobs 16 --quiet || exit 1; done"
    "export-jit|find \$OASR_JIT_DIR -maxdepth 1 \\( -name '*.so' -o -name '*.so.sha256' \\) -printf '%f\\n' | tar -cJf \$OUT/jit.tar.xz -C \$OASR_JIT_DIR -T - && ls -l \$OUT/jit.tar.xz"
    "host-ab|for r in 1 2 3; do (cd .jit/baseline && python3 \$OLDPWD/benchmarks/host_overhead.py --device cuda --blocks 9 --out \$OUT/host_overhead_cuda_base_\$r.json) && python3 benchmarks/host_overhead.py --device cuda --blocks 9 --out \$OUT/host_overhead_cuda_\$r.json; done"
    "host-cuda|python3 benchmarks/host_overhead.py --device cuda --blocks 9 --out \$OUT/host_overhead_cuda.json"
    "host-cuda-cpp|python3 benchmarks/host_overhead.py --device cuda --blocks 9 --hot-path --out \$OUT/host_overhead_cuda_cpp.json"
    "host-verify|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_scaled_mm_residual_gpu.py tests/test_conv1d_gpu.py tests/test_conv_module_gpu.py tests/test_quant_fusion_gpu.py"
    "conv2d-verify|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv2d_quant_gpu.py tests/test_conv2d_int8_gpu.py tests/test_conv2d_activation_gpu.py"
    "serving|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --rounds 3 --out \$OUT/e2e_serving_default.json"
    "serving-host|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --batches 1 --requests 4 --rounds 1 --host-profile 20 --out \$OUT/e2e_serving_host.json"
    "serving-graphs|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode reduce-overhead --rounds 3 --out \$OUT/e2e_serving_graphs.json"
    "serving-diag|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --batches 1,16 --requests 4 --rounds 1 --launch-profile 10 --host-profile 10 --out \$OUT/e2e_serving_diag.json"
    "serving-cycle|for conf in default expandable_segments:True; do ( [ \$conf = default ] || export PYTORCH_CUDA_ALLOC_CONF=\$conf; OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --model-args size=M,num_layers=4 --variants fp16,fp16-oasr --mode default --batches 1,16 --requests 4 --rounds 2 --cycle-profile 5 --out \$OUT/e2e_serving_cycle_\${conf%%:*}.json ) || exit 1; done"
    "serving-v2|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --always-warnings-round --cycle-profile 3 --out \$OUT/e2e_serving_default_v2.json"
    "hot-path-verify|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_scaled_mm_gpu.py tests/test_scaled_mm_quant_exact_gpu.py tests/test_scaled_mm_residual_gpu.py tests/test_quant_fusion_gpu.py tests/test_conv1d_gpu.py tests/test_conv_module_gpu.py tests/test_conv2d_activation_gpu.py tests/test_conv2d_quant_gpu.py tests/test_conv2d_int8_gpu.py"
    "prebuild-hot-path|python3 -m oasr_ops tune prebuild --hot-path-only"
    "hot-path-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_hot_path_gpu.py"
    # the fp8 GEMMs' C++ hot path (session 38): its GPU tests alone
    "hot-path-fp8-gpu|python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_hot_path_gpu.py -k fp8"
    # an fp8 Conformer M served without CUDA graphs: the Python fp8 ops vs their C++ hot path (session 38), every
    # fp8 data-parallel tile's SiLU act-quant kernel prebuilt (dynamic M reaches many tiles), fp16 Inductor the baseline
    "serving-fp8|python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts '' --lnq auto --fp8-acts silu:all --fp8-fp16 --fp8-residual --production gemm,conv1d,conv2d_activation | grep -v '^  reused' && OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --variants fp16,fp16-oasr-cpp,fp8,fp8-cpp --out \$OUT/e2e_serving_fp8.json"
    "prebuild-serving-int8|for f in scaled_mm gemm conv1d bmm conv2d_activation; do OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --family \$f --dtypes fp16 --jobs 16 --quiet || exit 1; done && python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation"
    "hot-path-suites|OASR_CPP_HOT_PATH=1 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_scaled_mm_gpu.py tests/test_scaled_mm_quant_exact_gpu.py tests/test_scaled_mm_residual_gpu.py tests/test_quant_fusion_gpu.py tests/test_conv1d_gpu.py tests/test_conv_module_gpu.py"
    "serving-cpp|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --variants fp16,fp16-oasr,fp16-oasr-cpp,int8,int8-cpp --out \$OUT/e2e_serving_cpp.json"
    "serving-cpp-diag|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --batches 1,16 --requests 4 --rounds 1 --variants fp16,fp16-oasr,fp16-oasr-cpp --launch-profile 10 --out \$OUT/e2e_serving_cpp_diag.json"
    "serving-graphs-b416|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode reduce-overhead --batches 4,16 --requests 16 --rounds 3 --out \$OUT/e2e_serving_graphs_b416.json"
    "prebuild-serving-fp16|python3 -m oasr_ops tune prebuild --hot-path-only && for f in gemm conv1d bmm conv2d_activation; do OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --family \$f --dtypes fp16 --jobs 16 --quiet || exit 1; done"
    "eager-configs-gpu|C=\$(python3 -c 'import json; d=json.load(open(\"db/sm90/gemm.json\")); E = d[\"entries\"].values(); g = {c for e in E for _, c in e[\"regions\"]}; print(\",\".join(sorted({c for e in E for _, c in e.get(\"regions_eager\", [])} - g)))'); echo \"configs only the eager regions serve: \$C\"; OASR_CUDA_ARCH_LIST=9.0a python3 -m oasr_ops tune prebuild --configs \${C//,/ } --jobs 16 --quiet && OASR_TEST_CONFIGS=\$C python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gemm_gpu.py -k config_correct"
    "serving-eager|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --variants fp16,fp16-oasr,fp16-oasr-graph-regions,fp16-oasr-cpp,fp16-oasr-graph-regions-cpp --out \$OUT/e2e_serving_eager.json"
    "serving-eager-diag|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --batches 1,16 --requests 4 --rounds 1 --variants fp16,fp16-oasr,fp16-oasr-graph-regions,fp16-oasr-cpp,fp16-oasr-graph-regions-cpp --launch-profile 10 --out \$OUT/e2e_serving_eager_diag.json"
    "serving-floor|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --batches 4,16 --requests 8 --rounds 3 --variants fp16,fp16-oasr-cpp,fp16-oasr-floor8-cpp,fp16-oasr-floor12-cpp --out \$OUT/e2e_serving_floor_b416.json"
    "serving-floor-all|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --variants fp16,fp16-oasr-cpp,fp16-oasr-floor8-cpp --out \$OUT/e2e_serving_floor.json"
    "serving-lnq|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --variants fp16,int8-cpp,int8-ln-cpp,int8-ln-cpp-nolnq --out \$OUT/e2e_serving_lnq.json"
    "serving-lnq-diag|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --variants fp16,fp16-oasr-cpp,int8-cpp,int8-ln-cpp,int8-ln-cpp-nolnq --launch-profile 10 --out \$OUT/e2e_serving_lnq_diag.json"
    "dump-fused|OASR_JIT_BUILD=off TORCH_LOGS=output_code python3 benchmarks/dump_fused_graph.py --device cuda --size M --blocks 1 > \$OUT/dump_fused.txt 2>&1"
    "serving-frz|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --variants fp16,fp16-frz,fp16-oasr-cpp,fp16-oasr-frz-cpp,int8-cpp,int8-frz-cpp --launch-profile 3 --out \$OUT/e2e_serving_frz.json"
    "act-bias16-gpu|OASR_ENVELOPE_LOG=\$OUT/act_envelope_bias16.jsonl python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_quant_fusion_gpu.py -k 'act_quant' && python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_hot_path_gpu.py -k 'int8'"
    "serving-whisper|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --model examples.whisper:build_model --model-args size=small --mode default --requests 12 --rounds 3 --variants fp16,fp16-oasr-cpp,int8-cpp,int8-ln-cpp,int8-ln-cpp-nolnq --launch-profile 10 --out \$OUT/e2e_serving_whisper_small.json"
    # serving-frz split in three (each with fp16 Inductor as its in-process baseline): one device call each fits
    # the 600 s limit; serving-frz did not (compiles of 40-96 s per variant, session 20)
    "serving-frz-fp16|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --variants fp16,fp16-frz --launch-profile 3 --out \$OUT/e2e_serving_frz_fp16.json"
    "serving-frz-oasr|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --variants fp16,fp16-oasr-cpp,fp16-oasr-frz-cpp --launch-profile 3 --out \$OUT/e2e_serving_frz_oasr.json"
    "serving-frz-int8|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --variants fp16,int8-cpp,int8-frz-cpp --launch-profile 3 --out \$OUT/e2e_serving_frz_int8.json"
    # frozen fp16 oasr vs frozen int8 in one process (sessions 23-24 measured them in two runs); needs
    # prebuild-hot-path prebuild-serving-int8 first, and two calls on a cold machine (compiles)
    "serving-frz-both|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --requests 12 --rounds 3 --variants fp16,fp16-oasr-frz-cpp,int8-frz-cpp --launch-profile 3 --out \$OUT/e2e_serving_frz_both.json"
    "serving-frz-int8-launches|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --batches 1 --requests 2 --rounds 1 --variants int8-frz-cpp --launch-profile 3 --out \$OUT/e2e_serving_frz_int8_launches.json"
    "serving-bias16|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --batches 1,16 --requests 4 --rounds 3 --variants fp16,fp16-oasr-cpp,int8-cpp --launch-profile 3 --out \$OUT/e2e_serving_bias16.json"
    "serving-host-int8|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --mode default --batches 1 --requests 4 --rounds 3 --variants fp16,fp16-oasr-cpp,int8-cpp --host-profile 20 --out \$OUT/e2e_serving_host_int8.json"
    "sdpa-host|python3 benchmarks/sdpa_host.py --rounds 3 --out \$OUT/sdpa_host.json"
    "serving-newcomer|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/e2e_serving.py --model-args size=M,d_model=384,num_heads=6 --mode default --requests 12 --rounds 3 --variants fp16,fp16-oasr,fp16-oasr-cpp --out \$OUT/e2e_serving_newcomer_d384.json"
    "e2e-int8-conv|OASR_TUNE_USER_DB=off python3 benchmarks/prebuild_fusion_kernels.py --jobs 16 --acts silu --lnq auto --int8-fp16 --residual --production conv1d,conv2d_activation && OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --iters 20 --with-act-only --with-residual --with-fp16-convs --only int8-fused-act-res,int8-fused-act-res-fp16conv \${E2E_FLAGS:-} --out \$OUT/e2e_int8_conv_conformer_M.json"
    "e2e-int8-conv-newcomer|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M,d_model=384,num_heads=6 --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 5 --iters 20 --with-act-only --with-residual --with-fp16-convs --only int8-fused-act-res,int8-fused-act-res-fp16conv --out \$OUT/e2e_int8_conv_newcomer_conformer_d384.json"
    "item-origin|python3 benchmarks/item_origin.py --size M --batch 1 --frames 394 --backends eager,inductor --out \$OUT/item_origin.json"
    "item-origin-nograd|python3 benchmarks/item_origin.py --size M --batch 1 --frames 394 --also-frames 1201 --backends eager,inductor --grad-mode no_grad --cuda-activity --out \$OUT/item_origin_nograd.json"
    "item-origin-dynamic|python3 benchmarks/item_origin.py --size M --batch 1 --frames 394 --backends inductor --grad-mode no_grad --dynamic --out \$OUT/item_origin_dynamic.json"
    "item-origin-guards|TORCH_LOGS=guards python3 benchmarks/item_origin.py --size M --batch 1 --frames 394 --backends inductor --grad-mode no_grad --dynamic --out \$OUT/item_origin_guards.json > \$OUT/guards.txt 2>&1; grep -c . \$OUT/guards.txt; grep -i -m 20 'item\\|float\\|L\\[.self' \$OUT/guards.txt | cut -c1-300; python3 benchmarks/item_origin.py --size M --batch 1 --frames 394 --backends inductor --grad-mode no_grad --dynamic --dynamo-config specialize_float=True --out \$OUT/item_origin_specialize_float.json"
    "specialize-float|OASR_JIT_BUILD=off OASR_TUNE_USER_DB=off python3 benchmarks/specialize_float_host.py --backends inductor,oasr --out \$OUT/specialize_float_host.json"
    "item-origin-dyn|python3 benchmarks/item_origin.py --size M --batch 1 --frames 394 --also-frames 1201 --backends inductor --out \$OUT/item_origin_dyn.json"
    "e2e-whisper-int8|OASR_TUNE_USER_DB=off python3 benchmarks/e2e_int8_fused.py --model examples.whisper:build_model --model-args size=small --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 3 --iters 20 --out \$OUT/e2e_int8_fused_whisper_small.json"
)

list_steps() {
    echo "steps (run in the order given):"
    for s in "${STEPS[@]}"; do printf '  %-12s %s\n' "${s%%|*}" "${s#*|}"; done
    echo "  (\$CENSUS = --census benchmarks/census/<each>.json)"
}

if [ $# -eq 0 ] || [ "$1" = "--list" ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    list_steps
    [ $# -eq 0 ] && exit 2 || exit 0
fi

cmd_of() {
    local s
    for s in "${STEPS[@]}"; do
        if [ "${s%%|*}" = "$1" ]; then
            local c=${s#*|}
            echo "${c%  (writes db/)}"
            return 0
        fi
    done
    return 1
}
for step in "$@"; do  # every name checked before anything is set up
    cmd_of "$step" >/dev/null || { echo "unknown step '$step'" >&2; list_steps >&2; exit 2; }
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=$(mkdir -p "${OUT:-device-out}" && cd "${OUT:-device-out}" && pwd)
export OUT
export TMPDIR=${TMPDIR:-/tmp}
WORK=$TMPDIR
SITE=$WORK/oasr-site
export OASR_JIT_DIR=$WORK/oasr-jit
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
export PYTHONPATH=$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OASR_JIT_DIR"
if [ -f .jitpack/jit.tar.xz ]; then
    tar -xJf .jitpack/jit.tar.xz -C "$OASR_JIT_DIR"
fi
echo "JIT cache $OASR_JIT_DIR: $(find "$OASR_JIT_DIR" -name '*.so' | wc -l) kernels"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader || true
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
CENSUS=$(for f in benchmarks/census/*.json; do printf -- '--census %s ' "$f"; done)
export CENSUS

rc=0
for step in "$@"; do
    cmd=$(cmd_of "$step")
    echo "== $step: $cmd"
    start=$(date +%s)
    # STEP_TIMEOUT=SECONDS bounds each step (the device's per-call limit is shared by all of them)
    if timeout "${STEP_TIMEOUT:-0}" bash -o pipefail -c "$cmd" 2>&1 | tee "$OUT/$step.log"; then
        echo "== $step: ok ($(( $(date +%s) - start )) s)"
    else
        rc=1
        echo "== $step: FAILED ($(( $(date +%s) - start )) s), log $OUT/$step.log"
    fi
done
exit $rc
