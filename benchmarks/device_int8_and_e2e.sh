# Device run: int8 scaled_mm GPU suite, its benchmark, the sm90 scaled_mm build, end-to-end Conformer M.
# Usage (repo root, on the GPU machine): OUT=dir bash benchmarks/device_int8_and_e2e.sh
source benchmarks/device_setup.sh
timeout 60 python3 -m pytest -m gpu tests/test_gemm_gpu.py -q -p no:cacheprovider -k "_k2 or _k4 or b32x64x64 or capture or opcheck or split" 2>&1 | grep -E "passed|failed|never served|cases wrong|Error" | cut -c1-600 | tee $OUT/gemm_rest.log
timeout 120 python3 -m pytest -m gpu tests/test_scaled_mm_gpu.py -q -x -p no:cacheprovider 2>&1 | tail -6 | tee $OUT/int8_tests.log
timeout 90 python3 benchmarks/scaled_mm.py --out $OUT/scaled_mm.json --anchors benchmarks/anchors/h200-cublas-baselines.json --reps 7 2>&1 | tail -4
rm -f db/sm90/scaled_mm.json
( time timeout 110 python3 -m oasr_ops tune build --family scaled_mm $(for f in benchmarks/census/*.json; do echo --census $f; done) \
    --out system --fresh --thin --max-points 6 --max-fill 1 --rounds 3 --log $OUT/smm_log.jsonl \
    --checkpoint-dir /tmp/ckpt_smm > $OUT/smm_build.json ) 2>&1 | grep -v "points$" | tail -8
cp db/sm90/scaled_mm.json $OUT/scaled_mm_db.json
timeout 230 python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1000 --iters 20 \
    --backends eager,inductor,oasr,oasr+int8 --quantization int8_w8a8 --out $OUT/e2e.json 2>&1 | tail -14
