# Device run: the prewarm / quantization-option GPU tests.
source benchmarks/device_setup.sh
timeout 200 python3 -m pytest -m gpu tests/test_prewarm_gpu.py -k quantization_option -q -p no:cacheprovider 2>&1 | grep -E "passed|failed|Error|assert|^E " | head -30 | tee $OUT/prewarm_gpu.log
