# Device run C (session 2). Usage (repo root, GPU machine): OUT=dir bash benchmarks/device_e2e3.sh
source benchmarks/device_setup.sh
# End to end after "keep cuBLAS sites on aten": fp16 oasr vs inductor (SDPA model), the rel-pos model, and int8
# with Inductor's multi-kernel (persistent reductions for the 2048-wide per-token quantization) on and off.
timeout 200 python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1000 --iters 20 \
    --backends inductor,oasr,oasr+int8 --quantization int8_w8a8 --out $OUT/e2e_sdpa.json 2>&1 | grep -E "^(oasr|inductor|eager)"
timeout 150 python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1027 --iters 20 --attention rel_pos \
    --backends inductor,oasr --out $OUT/e2e_relpos2.json 2>&1 | grep -E "^(oasr|inductor|eager)"
timeout 120 python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1000 --iters 20 \
    --backends oasr+int8 --quantization int8_w8a8 --options '{"triton.multi_kernel": 1}' \
    --out $OUT/e2e_int8_multikernel.json 2>&1 | grep -E "^(oasr|inductor|eager)"
