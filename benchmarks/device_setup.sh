# Sourced at the start of a device run: wheels onto PYTHONPATH, the carried JIT cache unpacked.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export OASR_JIT_DIR=$PWD/.jit
mkdir -p .jit && [ -f .jitpack/jit.tar.xz ] && tar -xJf .jitpack/jit.tar.xz -C .jit
ls .jit/*.so 2>/dev/null | wc -l
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
