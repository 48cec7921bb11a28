# Device run: fp16 GEMM GPU suite, per-config benchmark, the sm90 system-tier build and its evaluation.
# Usage (repo root, on the GPU machine): OUT=dir bash benchmarks/device_gemm_and_build.sh
source benchmarks/device_setup.sh
timeout 150 python3 -m pytest -m gpu tests/test_gemm_gpu.py tests/test_build_gpu.py -q -x -p no:cacheprovider 2>&1 | tail -5 | tee $OUT/gpu_tests.log
timeout 200 python3 benchmarks/gemm_configs.py --rounds 3 --out $OUT/gemm_configs.json 2>&1 | tail -3
rm -f db/sm90/gemm.json
( time timeout 330 python3 -m oasr_ops tune build $(for f in benchmarks/census/*.json; do echo --census $f; done) \
    --out system --fresh --thin --max-points 8 --max-fill 2 --rounds 3 --log $OUT/build_log.jsonl \
    --checkpoint-dir /tmp/ckpt > $OUT/build.json ) 2>&1 | grep -v "points$" | tail -25
cp db/sm90/gemm.json $OUT/gemm.json
python3 -m oasr_ops tune evaluate --log $OUT/build_log.jsonl --db new=db/sm90/gemm.json --json > $OUT/evaluate.json
python3 -m oasr_ops tune evaluate --log $OUT/build_log.jsonl --db new=db/sm90/gemm.json | tee $OUT/evaluate.txt
