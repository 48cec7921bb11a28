# Device run: the full fp16 GEMM GPU suite, the sm90 scaled_mm build, end-to-end Conformer M (fp16 and int8).
# Usage (repo root, on the GPU machine): OUT=dir bash benchmarks/device_int8_build_and_e2e.sh
source benchmarks/device_setup.sh
timeout 70 python3 -m pytest -m gpu tests/test_gemm_gpu.py tests/test_build_gpu.py -q -p no:cacheprovider 2>&1 | grep -E "passed|failed|cases wrong|never served|Error" | cut -c1-400 | tee $OUT/gemm_tests.log
rm -f db/sm90/scaled_mm.json
( time timeout 130 python3 -m oasr_ops tune build --family scaled_mm $(for f in benchmarks/census/*.json; do echo --census $f; done) \
    --out system --fresh --thin --max-points 6 --max-fill 1 --rounds 3 --log $OUT/smm_log.jsonl \
    --checkpoint-dir /tmp/ckpt_smm > $OUT/smm_build.json ) 2>&1 | grep -v "points$" | tail -6
cp db/sm90/scaled_mm.json $OUT/scaled_mm_db.json
timeout 300 python3 benchmarks/e2e_conformer.py --size M --batch 16 --frames 1000 --iters 20 \
    --backends eager,inductor,oasr,oasr+int8 --quantization int8_w8a8 --out $OUT/e2e.json 2>&1 | tail -14
