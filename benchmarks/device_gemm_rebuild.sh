# Device run: re-ship db/sm90/gemm.json with cost-model pruning, validation points (geometric midpoints) and the
# model section (issue 11, items 4/5/7). The build is about 2.3x the old one's points (411 vs 180 on the shipped
# censuses with --max-fill 4), so it may not finish inside one 10-minute call: it checkpoints every signature
# into /tmp/gemm_ckpt and appends to /tmp/gemm_build_log.jsonl; run this script again (same machine, still warm)
# until build.json says "resumed" for all 18 signatures. A fresh machine starts over (FRESH=1 forces it).
# Usage (repo root, on the GPU machine): OUT=dir bash benchmarks/device_gemm_rebuild.sh
source benchmarks/device_setup.sh
if [ -n "$FRESH" ] || [ ! -d /tmp/gemm_ckpt ]; then rm -rf /tmp/gemm_ckpt /tmp/gemm_build_log.jsonl db/sm90/gemm.json; fi
( time timeout 540 python3 -m oasr_ops tune build $(for f in benchmarks/census/*.json; do echo --census $f; done) \
    --out system --fresh --thin --max-points 8 --max-fill 4 --rounds 3 --log /tmp/gemm_build_log.jsonl \
    --checkpoint-dir /tmp/gemm_ckpt > $OUT/build.json ) 2>&1 | grep -v "points$" | tail -25
cat $OUT/build.json | head -30
cp /tmp/gemm_build_log.jsonl $OUT/build_log.jsonl
[ -f db/sm90/gemm.json ] && cp db/sm90/gemm.json $OUT/gemm.json
python3 -m oasr_ops tune evaluate --log /tmp/gemm_build_log.jsonl --db new=db/sm90/gemm.json | tee $OUT/evaluate.txt
