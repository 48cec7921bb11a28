# Device run A (session 2): GPU tests of bmm and scaled_mm, the bmm benchmark, scaled_mm with the wave-model
# heuristic and every tile at 8192^3. Usage (repo root, GPU machine): OUT=dir bash benchmarks/device_bmm_int8.sh
source benchmarks/device_setup.sh
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_scaled_mm_gpu.py tests/test_bmm_gpu.py 2>&1 \
    | tee $OUT/gpu_tests.log | tail -15
timeout 150 python3 benchmarks/bmm.py --out $OUT/bmm.json --reps 9 2>&1 | tee $OUT/bmm.log | tail -35
timeout 150 python3 benchmarks/scaled_mm.py --out $OUT/scaled_mm_wave.json \
    --anchors benchmarks/anchors/h200-cublas-baselines.json --reps 7 2>&1 | tee $OUT/scaled_mm_wave.log | tail -4
