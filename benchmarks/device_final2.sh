# Device run D (session 2, last): the final code state on the GPU — the whole GPU suite, the README demo, and
# Conformer L (d = 1024) int8 vs fp16 end to end. Usage (repo root, GPU machine): OUT=dir bash benchmarks/device_final2.sh
source benchmarks/device_setup.sh
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tee $OUT/gpu_suite.log | tail -6
timeout 60 python3 examples/quickstart.py 2>&1 | tee $OUT/quickstart.log | tail -8
timeout 200 python3 benchmarks/e2e_conformer.py --size L --batch 16 --frames 1000 --iters 20 \
    --backends oasr,oasr+int8 --quantization int8_w8a8 --out $OUT/e2e_L_int8.json 2>&1 | grep -E "^(oasr|inductor|eager)"
