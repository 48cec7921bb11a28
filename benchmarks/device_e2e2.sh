# Device run B (session 2): end to end with kernel profiles — Conformer M fp16 vs int8 (both backend="oasr"),
# and the relative-position Conformer M (explicit attention matmuls -> oasr.bmm) vs inductor.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/device_e2e2.sh
source benchmarks/device_setup.sh
timeout 260 python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1000 --iters 20 \
    --backends oasr,oasr+int8 --quantization int8_w8a8 --profile 3 --out $OUT/e2e_int8.json 2>&1 \
    | grep -vE "Warning|warn" | tee $OUT/e2e_int8.log | tail -50
timeout 260 python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1027 --iters 20 --attention rel_pos \
    --backends eager,inductor,oasr --profile 3 --out $OUT/e2e_relpos.json 2>&1 \
    | grep -vE "Warning|warn" | tee $OUT/e2e_relpos.log | tail -60
