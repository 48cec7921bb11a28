# Device run: the README's main job on the GPU, scaled_mm with the shipped DB + fitted ladder, int8 vs fp16 e2e.
# Usage (repo root, on the GPU machine): OUT=dir bash benchmarks/device_final.sh
source benchmarks/device_setup.sh
timeout 60 python3 examples/quickstart.py 2>&1 | tee $OUT/quickstart.log | tail -14
timeout 100 python3 benchmarks/scaled_mm.py --out $OUT/scaled_mm_tuned.json --anchors benchmarks/anchors/h200-cublas-baselines.json --reps 7 2>&1 | tail -3
timeout 200 python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1000 --iters 20 \
    --backends oasr,oasr+int8 --quantization int8_w8a8 --out $OUT/e2e_int8.json 2>&1 | grep -E "^oasr|speedup"
